#include "lane_probe.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>

#include "error.h"

namespace rcoll {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void probeFailed(int rank, int peer, const std::string& why) {
  throwError(ErrorKind::kPeer, strFormat("rank %d: measuring the sockets to rank %d: %s", rank, peer, why.c_str()));
}

// Moves kProbeBytes on every lane at once, in (`sending`) or out; `done[i]`
// gets the time lane i finished.
void moveAll(const std::vector<int>& fds, bool sending, Deadline deadline, int rank, int peer,
             std::vector<Clock::time_point>* done, Clock::time_point* first_byte) {
  static const std::vector<char> zeros(256 << 10, 0);
  std::vector<char> sink(256 << 10);
  std::vector<size_t> left(fds.size(), kProbeBytes);
  done->assign(fds.size(), Clock::time_point{});
  size_t open = fds.size();
  while (open > 0) {
    std::vector<pollfd> pfds;
    std::vector<size_t> which;
    for (size_t i = 0; i < fds.size(); ++i) {
      if (left[i] == 0) continue;
      pfds.push_back(pollfd{fds[i], static_cast<short>(sending ? POLLOUT : POLLIN), 0});
      which.push_back(i);
    }
    const int n = ::poll(pfds.data(), pfds.size(), millisecondsUntil(deadline));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) probeFailed(rank, peer, errnoText(errno));
    if (n == 0)
      throwError(ErrorKind::kTimeout, strFormat("rank %d: measuring the sockets to rank %d: timed out", rank, peer));
    for (size_t j = 0; j < pfds.size(); ++j) {
      if (pfds[j].revents == 0) continue;
      const size_t i = which[j];
      const size_t want = std::min(left[i], zeros.size());
      const ssize_t got = sending ? ::send(fds[i], zeros.data(), want, MSG_NOSIGNAL | MSG_DONTWAIT)
                                  : ::recv(fds[i], sink.data(), want, MSG_DONTWAIT);
      if (got == 0 && !sending) probeFailed(rank, peer, "the peer closed a socket");
      if (got < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
        probeFailed(rank, peer, errnoText(errno));
      }
      if (first_byte != nullptr && *first_byte == Clock::time_point{}) *first_byte = Clock::now();
      left[i] -= static_cast<size_t>(got);
      if (left[i] == 0) {
        (*done)[i] = Clock::now();
        --open;
      }
    }
  }
}

}  // namespace

std::vector<int> probeLanesAsDialer(const std::vector<int>& fds, Deadline deadline, int rank, int peer) {
  // The acceptor says when it reads: bytes sent before would wait in its
  // socket buffers and arrive all at once, whatever the link.
  char go = 0;
  std::string why;
  if (!recvAll(fds[0], &go, 1, deadline, &why)) probeFailed(rank, peer, why);
  std::vector<Clock::time_point> done;
  moveAll(fds, /*sending=*/true, deadline, rank, peer, &done, nullptr);
  std::vector<uint8_t> weights(fds.size());
  if (!recvAll(fds[0], weights.data(), weights.size(), deadline, &why)) probeFailed(rank, peer, why);
  std::vector<int> out;
  for (uint8_t w : weights) {
    if (w < 1 || w > kMaxWeight) probeFailed(rank, peer, strFormat("it answered a weight of %d", w));
    out.push_back(w);
  }
  return out;
}

std::vector<int> probeLanesAsAcceptor(const std::vector<int>& fds, Deadline deadline, int rank, int peer,
                                      std::vector<double>* rates) {
  const char go = 'G';
  std::string why;
  if (!sendAll(fds[0], &go, 1, deadline, &why)) probeFailed(rank, peer, why);
  std::vector<Clock::time_point> done;
  Clock::time_point first{};
  moveAll(fds, /*sending=*/false, deadline, rank, peer, &done, &first);
  rates->clear();
  for (const Clock::time_point& t : done) {
    const double seconds = std::max(1e-6, std::chrono::duration<double>(t - first).count());
    rates->push_back(static_cast<double>(kProbeBytes) / seconds);
  }
  const double fastest = *std::max_element(rates->begin(), rates->end());
  std::vector<int> weights;
  std::vector<uint8_t> wire;
  for (double r : *rates) {
    // Within a fifth of the fastest is the same rate: a short measurement on
    // busy cores varies that much, and equal NICs should share equally.
    const int w = r >= 0.8 * fastest
                      ? kMaxWeight
                      : std::clamp(static_cast<int>(std::lround(kMaxWeight * r / fastest)), 1, kMaxWeight);
    weights.push_back(w);
    wire.push_back(static_cast<uint8_t>(w));
  }
  if (!sendAll(fds[0], wire.data(), wire.size(), deadline, &why)) probeFailed(rank, peer, why);
  return weights;
}

}  // namespace rcoll
