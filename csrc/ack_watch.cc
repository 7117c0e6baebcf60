#include "ack_watch.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>

namespace rcoll {

AckWatch::AckWatch(std::chrono::milliseconds dead_after) {
  if (dead_after.count() <= 0) return;
  silent_after_ = dead_after * 2 / 3;
  // A dozen looks per bound: a dead link is named by about 3/4 of it.
  interval_ = std::max(std::chrono::milliseconds(100), dead_after / 12);
}

bool AckWatch::due(Clock::time_point now) {
  if (!enabled() || now < next_) return false;
  next_ = now + interval_;
  return true;
}

std::chrono::milliseconds AckWatch::untilDue(Clock::time_point now) const {
  if (!enabled()) return std::chrono::milliseconds::max();
  if (now >= next_) return std::chrono::milliseconds(0);
  return std::chrono::duration_cast<std::chrono::milliseconds>(next_ - now) + std::chrono::milliseconds(1);
}

bool AckWatch::dead(int fd, Clock::time_point now, Marks* marks) const {
  tcp_info info{};
  socklen_t len = sizeof(info);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return false;  // the socket's own error says more
  return judge(Reading{info.tcpi_unacked, info.tcpi_probes, info.tcpi_last_ack_recv}, now, marks);
}

bool AckWatch::judge(const Reading& reading, Clock::time_point now, Marks* marks) const {
  // Marks from looks long ago (the previous op's) tell nothing about now.
  const bool in_step = recent(marks->last_look, now);
  marks->last_look = now;
  if (!owes(reading)) {
    marks->owing_since = marks->silent_look = Clock::time_point{};
    return false;
  }
  if (!in_step || marks->owing_since == Clock::time_point{}) marks->owing_since = now;
  const auto heard = std::chrono::milliseconds(reading.last_ack_ms);
  const auto silence = std::min(heard, std::chrono::duration_cast<std::chrono::milliseconds>(now - marks->owing_since));
  if (silence < silent_after_) {
    marks->silent_look = Clock::time_point{};
    return false;
  }
  const bool in_a_row = in_step && marks->silent_look != Clock::time_point{};
  marks->silent_look = now;
  return in_a_row;
}

bool AckWatch::silentLately(const Marks& marks, Clock::time_point now) const { return recent(marks.silent_look, now); }

void leaveAcksToOwner(int fd) {
  unsigned off = 0;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &off, sizeof(off));
}

}  // namespace rcoll
