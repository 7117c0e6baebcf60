#include "error.h"

#include <cstdarg>
#include <cstdio>
#include <vector>

namespace rcoll {

const char* errorKindName(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kGeneric:
      return "RcollError";
    case ErrorKind::kTimeout:
      return "TimeoutError";
    case ErrorKind::kPeer:
      return "PeerError";
    case ErrorKind::kMismatch:
      return "MismatchError";
    case ErrorKind::kConfig:
      return "ConfigError";
    case ErrorKind::kInvalidArgument:
      return "ValueError";
    case ErrorKind::kAborted:
      return "AbortedError";
  }
  return "RcollError";
}

std::string strFormat(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list copy;
  va_copy(copy, args);
  int needed = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  std::string out;
  if (needed > 0) {
    std::vector<char> buf(static_cast<size_t>(needed) + 1);
    std::vsnprintf(buf.data(), buf.size(), fmt, args);
    out.assign(buf.data(), static_cast<size_t>(needed));
  }
  va_end(args);
  return out;
}

void throwError(ErrorKind kind, const std::string& message) { throw RcollError(kind, message); }

}  // namespace rcoll
