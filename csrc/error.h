// One exception type for the whole core, tagged with a kind that the Python
// bindings map onto rcoll.RcollError and its subclasses.
#pragma once

#include <stdexcept>
#include <string>

namespace rcoll {

enum class ErrorKind {
  kGeneric,          // rcoll.RcollError
  kTimeout,          // rcoll.TimeoutError: a peer did not answer in time
  kPeer,             // rcoll.PeerError: a peer died, closed its connection or aborted
  kMismatch,         // rcoll.MismatchError: ranks called different collectives
  kConfig,           // rcoll.ConfigError: bad environment variable or set-up
  kInvalidArgument,  // ValueError: bad buffer, dtype, op or size from the caller
  kAborted,          // rcoll.AbortedError: the communicator was shut down or aborted locally
};

const char* errorKindName(ErrorKind kind);

class RcollError : public std::runtime_error {
 public:
  RcollError(ErrorKind kind, const std::string& message) : std::runtime_error(message), kind_(kind) {}
  ErrorKind kind() const { return kind_; }

 private:
  ErrorKind kind_;
};

// printf-style formatting into a std::string (used to build error messages).
std::string strFormat(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

// "timed out: the timeout of 1.5 s passed": every timeout is worded so, with
// both "timed out" and " timeout " in it, which is what users' log filters and
// torch's own tests (" (Timed out|closed|timeout) ") look for.
inline std::string timedOut(double seconds) { return strFormat("timed out: the timeout of %g s passed", seconds); }

[[noreturn]] void throwError(ErrorKind kind, const std::string& message);

}  // namespace rcoll
