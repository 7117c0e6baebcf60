// Shared by the libFuzzer targets in tests/native/fuzz (built by tests/native/test_fuzz.py).
#pragma once

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "transport.h"

namespace rcoll_fuzz {

// The identity of the communicator every target runs in. The seed corpora
// (make_corpus.py) are written with the same values.
constexpr uint64_t kCommId = 0x0123456789abcdefULL;
constexpr uint8_t kToken[16] = {0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe,
                                0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef};

inline rcoll::ConnectInfo connectInfo() {
  rcoll::ConnectInfo info;
  info.comm_id = kCommId;
  std::memcpy(info.token, kToken, sizeof(kToken));
  info.rank = 0;
  info.size = 2;
  return info;
}

// The transport's WARN lines (one per dropped connection) would flood the
// fuzzer's output; RCOLL_DEBUG=WARN (or INFO, TRACE) in the environment shows them.
inline void quietLogs() { setenv("RCOLL_DEBUG", "NONE", /*overwrite=*/0); }

}  // namespace rcoll_fuzz

// An oracle violation: report and abort(), which libFuzzer records as a crash
// with the input that caused it.
#define FUZZ_CHECK(cond, ...)                                                   \
  do {                                                                          \
    if (!(cond)) {                                                              \
      std::fprintf(stderr, "FUZZ_CHECK failed at %s:%d: %s\n  ", __FILE__,       \
                   __LINE__, #cond);                                            \
      std::fprintf(stderr, __VA_ARGS__);                                        \
      std::fprintf(stderr, "\n");                                               \
      std::abort();                                                             \
    }                                                                           \
  } while (0)
