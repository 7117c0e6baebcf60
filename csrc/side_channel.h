// A side channel: the handshake socket that the verbs and shared-memory
// transports keep open beside their data path.
//
// Only two things ever arrive there: an abort (header + text, from
// abortPeers()) or the end of the peer's process (EOF or a reset). Both
// transports read it the same way, a few bytes at a time as poll() reports
// them, and each decides what the news means for its own connection. Both
// write their own abort the same way too (AbortMessage, abortOverSideChannels).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "error.h"
#include "socket_util.h"
#include "wire.h"

namespace rcoll {

struct ConnectInfo;

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

// The writing end, used once, by abortPeers(): why this rank failed, as one
// abort message (header + text) for every peer. Bounded: the sending to all
// the peers together ends 2 s after the message is made, so a peer that
// stopped reading cannot hold this rank's failure up.
class AbortMessage {
 public:
  // `message` is cut to kMaxAbortText bytes; the 2 s start now.
  AbortMessage(const ConnectInfo& info, ErrorKind kind, const std::string& message);

  // Best effort (a peer that is gone or stopped reading misses it), then ends
  // this rank's sending on `fd` (FIN). The socket stays open until the
  // transport is destroyed, so the peer reads the reason, not a reset.
  void sendTo(int fd) const;

 private:
  std::string text_;
  WireHeader header_;
  Deadline deadline_;
};

// abortPeers()' loop over a transport's connections (null entries skipped):
// the abort message on each side channel that still carries anything (none
// does afterwards: `socket_broken` is set), then `fail(connection)` fails the
// connection here. Connection: the transport's, with the side channel's `fd`
// and `socket_broken`.
template <typename Connection, typename Fail>
void abortOverSideChannels(const AbortMessage& abort, std::vector<std::unique_ptr<Connection>>& connections,
                           Fail fail) {
  for (auto& c : connections) {
    if (!c) continue;
    if (!c->socket_broken) {
      abort.sendTo(c->fd);
      c->socket_broken = true;
    }
    fail(*c);
  }
}

}  // namespace rcoll
