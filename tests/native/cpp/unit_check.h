// What the standalone C++ tests share: check() counts and prints a failure
// (the first `kMaxPrinted`, so a broken unit stays readable), and
// finishUnit() prints the verdict and gives main() its exit status.
#pragma once

#include <cstdio>
#include <string>

namespace unit {

inline int& failures() {
  static int count = 0;
  return count;
}

constexpr int kMaxPrinted = 50;

inline bool check(bool ok, const std::string& what) {
  if (!ok && ++failures() <= kMaxPrinted) std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  return ok;
}

inline int finishUnit(const char* name) {
  if (failures() != 0) {
    std::fprintf(stderr, "%s: %d failure(s)\n", name, failures());
    return 1;
  }
  std::printf("%s: all passed\n", name);
  return 0;
}

}  // namespace unit
