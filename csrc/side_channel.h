// The reading end of a side channel: the handshake socket that the verbs and
// shared-memory transports keep open beside their data path.
//
// Only two things ever arrive there: an abort (header + text, from
// abortPeers()) or the end of the peer's process (EOF or a reset). Both
// transports read it the same way, a few bytes at a time as poll() reports
// them, and each decides what the news means for its own connection.
#pragma once

#include <cstddef>
#include <string>

#include "error.h"
#include "wire.h"

namespace rcoll {

// Longest abort text kept (more is read and dropped with the connection).
constexpr size_t kMaxAbortText = 4096;

struct SideChannelNews {
  enum class Kind {
    kNothing,  // nothing complete yet: poll again
    kAbort,    // the peer failed: `abort_kind`, `text`
    kGarbage,  // not an abort header: the peer is not speaking this protocol
    kClosed,   // EOF (`error` 0) or an I/O error (`error` = errno) before any abort
  };
  Kind kind = Kind::kNothing;
  ErrorKind abort_kind = ErrorKind::kPeer;
  std::string text;  // valid UTF-8
  int error = 0;
};

class SideChannelReader {
 public:
  // Non-blocking: reads what `fd` has. After anything but kNothing the
  // channel is finished: the caller stops polling it.
  SideChannelNews read(int fd);

 private:
  WireHeader header_{};
  size_t got_ = 0;  // header bytes read
  std::string text_;
};

}  // namespace rcoll
