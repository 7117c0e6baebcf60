// Whether the host at the other end of a socket still acknowledges, judged
// from TCP_INFO by the socket's owner while it waits.
//
// TCP_USER_TIMEOUT would judge it in the kernel, but Linux (since 5.11) also
// fails a socket whose peer only stopped reading: a receive window held at
// zero that long counts as a failure even while the peer's kernel answers
// every window probe. A rank that an op sends to may well be elsewhere for
// longer than RCOLL_PEER_TIMEOUT (saving a checkpoint while the others enter
// the next allreduce), with more bytes queued to it than its socket buffers
// hold. So the TCP transport, whose sockets carry the payloads, turns the
// kernel's timer off once a socket is set up (leaveAcksToOwner) and looks
// here:
//
//  * a socket owes when something of ours waits for the peer host's
//    acknowledgement: data in flight, or three window or keepalive probes
//    unanswered (fewer prove nothing: the receiver answers probes that come
//    within 500 ms of each other at most once, and on loopback an answered
//    probe may still count as one out);
//  * it is silent when no acknowledgement came for 2/3 of RCOLL_PEER_TIMEOUT
//    (the bound the kernel's timer had), counted from the later of the last
//    acknowledgement and the first look that found it owing (a socket that
//    only received for minutes has heard no acknowledgement for that long,
//    and owes nothing until it sends);
//  * it is dead when it was silent at two looks in a row, a few intervals
//    apart at most.
// A live peer that does not read leaves nothing in flight and answers its
// probes, so it never owes. Idle sockets get keepalive probes
// (applySocketOptions), which count the same way.
//
// A limit: the kernel spaces window probes out the longer the window stays
// zero (up to 2 min), so a host that dies while a socket to it sits at a
// zero window is named after its third unanswered probe, which can be
// minutes after a long wait (at the latest, the op's timeout names it).
#pragma once

#include <chrono>
#include <cstdint>

namespace rcoll {

class AckWatch {
 public:
  using Clock = std::chrono::steady_clock;

  // What one socket's TCP_INFO says, for owes().
  struct Reading {
    uint32_t unacked = 0;      // segments in flight
    uint32_t probes = 0;       // window or keepalive probes unanswered
    uint32_t last_ack_ms = 0;  // since the peer's host last acknowledged anything
  };
  // What a socket carries between looks.
  struct Marks {
    Clock::time_point last_look{};
    Clock::time_point owing_since{};  // the first look of the current stretch that found it owing
    Clock::time_point silent_look{};  // the last look that found it silent
  };

  // dead_after: RCOLL_PEER_TIMEOUT; 0 turns the watch off (the kernel's defaults).
  explicit AckWatch(std::chrono::milliseconds dead_after);

  bool enabled() const { return silent_after_.count() > 0; }
  std::chrono::milliseconds silentAfter() const { return silent_after_; }
  // Whether a look is due at `now`; if so, the next is one interval later.
  bool due(Clock::time_point now);
  // How long a caller may sleep before the next look (max() when off).
  std::chrono::milliseconds untilDue(Clock::time_point now) const;
  // One look at `fd` at `now`: true when it is dead.
  bool dead(int fd, Clock::time_point now, Marks* marks) const;
  // The judgement on a reading, apart from the socket (for tests).
  bool judge(const Reading& reading, Clock::time_point now, Marks* marks) const;
  // Whether the last look found the socket silent, and was recent.
  bool silentLately(const Marks& marks, Clock::time_point now) const;

  static bool owes(const Reading& r) { return r.unacked > 0 || r.probes >= 3; }

 private:
  bool recent(Clock::time_point look, Clock::time_point now) const {
    return look != Clock::time_point{} && now - look <= 3 * interval_;
  }

  std::chrono::milliseconds silent_after_{0};
  std::chrono::milliseconds interval_{0};
  Clock::time_point next_{};
};

// The kernel's TCP_USER_TIMEOUT off on a socket whose owner keeps an AckWatch
// on it (set up with it on: a handshake over a cut link fails in time).
void leaveAcksToOwner(int fd);

}  // namespace rcoll
