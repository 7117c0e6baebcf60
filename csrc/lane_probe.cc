#include "lane_probe.h"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdint>
#include <utility>

#include "error.h"

namespace rcoll {
namespace {

using Clock = std::chrono::steady_clock;

constexpr char kGo = 'G';
constexpr char kStop = 'S';
constexpr char kLaneEnd = 1;  // the stream is zeros: the first other byte ends it
constexpr size_t kChunk = size_t{64} << 10;
// Unsent bytes the dialer keeps queued per lane: enough to keep a NIC busy
// between two wake-ups, little enough to drain in milliseconds after stop.
constexpr int kNotSentLowat = 128 << 10;

[[noreturn]] void probeFailed(int rank, int peer, const std::string& why) {
  throwError(ErrorKind::kPeer, strFormat("rank %d: measuring the sockets to rank %d: %s", rank, peer, why.c_str()));
}

[[noreturn]] void probeTimedOut(int rank, int peer) {
  throwError(ErrorKind::kTimeout, strFormat("rank %d: measuring the sockets to rank %d: timed out", rank, peer));
}

// poll() that retries on EINTR and fails the probe on anything else; 0 when
// `timeout_ms` passed.
int pollLanes(std::vector<pollfd>* pfds, int timeout_ms, int rank, int peer) {
  for (;;) {
    const int n = ::poll(pfds->data(), pfds->size(), timeout_ms);
    if (n >= 0) return n;
    if (errno != EINTR) probeFailed(rank, peer, errnoText(errno));
  }
}

// While it lives, a socket reports writable only when little of what was
// written is still unsent (TCP_NOTSENT_LOWAT); 0 restores the system's value.
class LittleUnsent {
 public:
  explicit LittleUnsent(std::vector<int> fds) : fds_(std::move(fds)) { set(kNotSentLowat); }
  ~LittleUnsent() { set(0); }
  LittleUnsent(const LittleUnsent&) = delete;
  LittleUnsent& operator=(const LittleUnsent&) = delete;

 private:
  void set(int bytes) {
    for (int fd : fds_) (void)setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &bytes, sizeof(bytes));
  }
  const std::vector<int> fds_;
};

// Writes zeros on every lane until the acceptor's stop comes on lane 0.
void streamUntilStop(const std::vector<int>& fds, Deadline deadline, int rank, int peer) {
  static const std::vector<char> zeros(kChunk, 0);
  LittleUnsent little_unsent(fds);
  std::vector<pollfd> pfds(fds.size());
  for (;;) {
    for (size_t i = 0; i < fds.size(); ++i) pfds[i] = pollfd{fds[i], static_cast<short>(POLLOUT), 0};
    pfds[0].events |= POLLIN;
    if (pollLanes(&pfds, millisecondsUntil(deadline), rank, peer) == 0) probeTimedOut(rank, peer);
    if (pfds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      char stop = 0;
      const ssize_t got = ::recv(fds[0], &stop, 1, MSG_DONTWAIT);
      if (got == 1 && stop == kStop) return;
      if (got == 1) probeFailed(rank, peer, strFormat("it sent %d where the stop belongs", stop));
      if (got == 0) probeFailed(rank, peer, "the peer closed a socket");
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) probeFailed(rank, peer, errnoText(errno));
    }
    for (size_t i = 0; i < fds.size(); ++i) {
      if ((pfds[i].revents & (POLLOUT | POLLERR | POLLHUP)) == 0) continue;
      const ssize_t sent = ::send(fds[i], zeros.data(), zeros.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        probeFailed(rank, peer, errnoText(errno));
      }
    }
  }
}

// What the acceptor reads: bytes per lane, and whether the lane's end byte came.
struct LaneCount {
  uint64_t bytes = 0;
  bool ended = false;
};

// Reads what came on a lane's socket `fd`; false when nothing was there.
bool readLane(int fd, std::vector<char>* sink, LaneCount* lane, int rank, int peer) {
  const ssize_t got = ::recv(fd, sink->data(), sink->size(), MSG_DONTWAIT);
  if (got == 0) probeFailed(rank, peer, "the peer closed a socket");
  if (got < 0) {
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return false;
    probeFailed(rank, peer, errnoText(errno));
  }
  const char* begin = sink->data();
  const char* end = begin + got;
  const char* other = std::find_if(begin, end, [](char c) { return c != 0; });
  if (other != end) {
    // The end byte is the last the dialer writes on a lane before the weights come back.
    if (other != end - 1 || *other != kLaneEnd) probeFailed(rank, peer, "the measurement's stream is out of step");
    lane->ended = true;
  }
  lane->bytes += static_cast<uint64_t>(other - begin);
  return true;
}

}  // namespace

std::vector<int> weightsFromRates(const std::vector<double>& rates) {
  const double fastest = rates.empty() ? 0.0 : *std::max_element(rates.begin(), rates.end());
  std::vector<int> weights;
  for (double r : rates) {
    weights.push_back(fastest <= 0.0 || r >= 0.8 * fastest
                          ? kMaxWeight
                          : std::clamp(static_cast<int>(std::lround(kMaxWeight * r / fastest)), 1, kMaxWeight));
  }
  return weights;
}

std::vector<int> probeLanesAsDialer(const std::vector<int>& fds, Deadline deadline, int rank, int peer) {
  // The acceptor says when it reads: bytes sent before would wait in its
  // socket buffers and arrive all at once, whatever the link.
  char go = 0;
  std::string why;
  if (!recvAll(fds[0], &go, 1, deadline, &why)) probeFailed(rank, peer, why);
  if (go != kGo) probeFailed(rank, peer, strFormat("it sent %d where the go belongs", go));
  streamUntilStop(fds, deadline, rank, peer);
  for (int fd : fds) {
    if (!sendAll(fd, &kLaneEnd, 1, deadline, &why)) probeFailed(rank, peer, why);
  }
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
  std::string why;
  if (!sendAll(fds[0], &kGo, 1, deadline, &why)) probeFailed(rank, peer, why);
  std::vector<char> sink(256 << 10);
  std::vector<LaneCount> lanes(fds.size());
  // Bytes per lane when the window opened, and when it closed.
  std::vector<uint64_t> at_start;
  std::vector<uint64_t> at_end;
  Clock::time_point first{};  // the first byte on any lane
  Clock::time_point opened{};
  Clock::time_point closed{};
  std::vector<pollfd> pfds;
  std::vector<size_t> which;
  auto bytes = [&] {
    std::vector<uint64_t> b;
    for (const LaneCount& l : lanes) b.push_back(l.bytes);
    return b;
  };
  for (;;) {
    pfds.clear();
    which.clear();
    for (size_t i = 0; i < fds.size(); ++i) {
      if (lanes[i].ended) continue;
      pfds.push_back(pollfd{fds[i], static_cast<short>(POLLIN), 0});
      which.push_back(i);
    }
    if (pfds.empty()) break;
    // Wake for the window's edges as well as for bytes.
    Clock::time_point wake = deadline;
    if (first != Clock::time_point{} && closed == Clock::time_point{}) {
      wake = std::min(wake, opened == Clock::time_point{} ? first + kProbeWarmup : opened + kProbeWindow);
    }
    const int n = pollLanes(&pfds, millisecondsUntil(wake) + (wake < deadline ? 1 : 0), rank, peer);
    if (n == 0 && Clock::now() >= deadline) probeTimedOut(rank, peer);
    for (size_t j = 0; j < pfds.size(); ++j) {
      if (pfds[j].revents == 0) continue;
      LaneCount& lane = lanes[which[j]];
      if (readLane(fds[which[j]], &sink, &lane, rank, peer) && first == Clock::time_point{}) first = Clock::now();
      if (lane.ended && closed == Clock::time_point{}) probeFailed(rank, peer, "a socket ended before the stop");
    }
    const Clock::time_point now = Clock::now();
    if (first == Clock::time_point{} || closed != Clock::time_point{}) continue;
    if (opened == Clock::time_point{} && now >= first + kProbeWarmup) {
      opened = now;
      at_start = bytes();
    } else if (opened != Clock::time_point{} && now >= opened + kProbeWindow) {
      closed = now;
      at_end = bytes();
      if (!sendAll(fds[0], &kStop, 1, deadline, &why)) probeFailed(rank, peer, why);
    }
  }
  const double seconds = std::chrono::duration<double>(closed - opened).count();
  rates->clear();
  for (size_t i = 0; i < fds.size(); ++i) rates->push_back(static_cast<double>(at_end[i] - at_start[i]) / seconds);
  const std::vector<int> weights = weightsFromRates(*rates);
  std::vector<uint8_t> wire(weights.begin(), weights.end());
  if (!sendAll(fds[0], wire.data(), wire.size(), deadline, &why)) probeFailed(rank, peer, why);
  return weights;
}

std::string describeShares(const std::vector<int>& weights, const std::vector<double>& rates) {
  std::string said;
  for (size_t k = 0; k < weights.size(); ++k) {
    said += strFormat("%s%d", k ? ", " : "", weights[k]);
    if (k < rates.size()) said += strFormat(" (%.0f MB/s)", rates[k] / 1e6);
  }
  return said;
}

}  // namespace rcoll
