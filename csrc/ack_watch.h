// Whether the host at the other end of a socket still acknowledges, judged
// from TCP_INFO by the socket's owner while it waits.
//
// TCP_USER_TIMEOUT would judge it in the kernel, but Linux (since 5.11) also
// fails a socket whose peer only stopped reading: a receive window held at
// zero that long counts as a failure even while the peer's kernel answers
// every window probe. A rank that an op sends to may well be elsewhere for
// longer than RCOLL_PEER_TIMEOUT (saving a checkpoint while the others enter
// the next allreduce), with more bytes queued to it than its socket buffers
// hold. So the TCP transport, whose sockets carry the payloads, leaves the
// kernel's timer off (SocketOptions::owner_watches_acks) and looks here:
//
//  * a socket is silent when something of ours waits for the peer host's
//    acknowledgement (data in flight, or window or keepalive probes
//    unanswered, two of them) and none came for 2/3 of RCOLL_PEER_TIMEOUT,
//    the bound the kernel's timer had;
//  * it is dead when it was silent at two looks in a row, one interval
//    apart: a window probe in flight at one look (whose answer comes within
//    a round trip) is not a failure.
// A live peer that does not read leaves nothing in flight and answers its
// probes, so it is never silent. An idle socket is left to the kernel's
// keepalive probes (applySocketOptions), as before.
#pragma once

#include <chrono>

namespace rcoll {

class AckWatch {
 public:
  using Clock = std::chrono::steady_clock;

  // dead_after: RCOLL_PEER_TIMEOUT; 0 turns the watch off (the kernel's defaults).
  explicit AckWatch(std::chrono::milliseconds dead_after);

  bool enabled() const { return silent_after_.count() > 0; }
  std::chrono::milliseconds silentAfter() const { return silent_after_; }
  // Whether a look is due at `now`; if so, the next is one interval later.
  bool due(Clock::time_point now);
  // How long a caller may sleep before the next look (max() when off).
  std::chrono::milliseconds untilDue(Clock::time_point now) const;
  // One look at `fd` at `now`. `silent_look` is the socket's own mark of its
  // last silent look, carried between looks: true when it is silent now and
  // was at the previous look, at most a few intervals ago (an op's looks
  // and the next op's, minutes later, are not two in a row).
  bool dead(int fd, Clock::time_point now, Clock::time_point* silent_look) const;

 private:
  std::chrono::milliseconds silent_after_{0};
  std::chrono::milliseconds interval_{0};
  Clock::time_point next_{};
};

}  // namespace rcoll
