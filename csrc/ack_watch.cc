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

bool AckWatch::dead(int fd, Clock::time_point now, Clock::time_point* silent_look) const {
  tcp_info info{};
  socklen_t len = sizeof(info);
  if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) != 0) return false;  // the socket's own error says more
  // A probe the peer's host answered may still count as one out (on
  // loopback its answer comes before the count goes up), so one out proves
  // nothing; two do.
  const bool waits_for_ack = info.tcpi_unacked > 0 || info.tcpi_probes >= 2;
  if (!waits_for_ack || info.tcpi_last_ack_recv < static_cast<uint32_t>(silent_after_.count())) {
    *silent_look = Clock::time_point{};
    return false;
  }
  const bool in_a_row = *silent_look != Clock::time_point{} && now - *silent_look <= 3 * interval_;
  *silent_look = now;
  return in_a_row;
}

}  // namespace rcoll
