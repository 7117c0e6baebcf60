// The TCP transport's judgement of its peers' hosts (csrc/ack_watch.h), on
// loopback: a peer that reads nothing while more is queued to it than its
// socket buffers hold (a zero window, its kernel answering the window probes)
// is never judged dead, looked at for many times the bound; the kernel's own
// TCP_USER_TIMEOUT, for contrast, fails such a socket on Linux 5.11 and
// later (printed, not judged: it is the kernel's). A link that stops
// acknowledging is left to tests/failures/test_link_failure.py (emulated
// hosts: loopback always acknowledges). And the looks' pacing.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "ack_watch.h"
#include "socket_util.h"
#include "unit_check.h"

using rcoll::AckWatch;
using unit::check;
using namespace std::chrono_literals;

namespace {

// A connected pair on 127.0.0.1: {writer, reader}, the writer non-blocking.
std::pair<int, int> loopbackPair(const rcoll::SocketOptions& options) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  check(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 && ::listen(listener, 1) == 0 &&
            ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0,
        "a loopback listener");
  const int writer = ::socket(AF_INET, SOCK_STREAM, 0);
  check(::connect(writer, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0, "connect on loopback");
  const int reader = ::accept(listener, nullptr, nullptr);
  ::close(listener);
  rcoll::applySocketOptions(writer, options);
  rcoll::setNonBlocking(writer, true);
  return {writer, reader};
}

// Writes until the reader's window and the writer's buffer are full.
void fill(int fd) {
  std::vector<char> block(1 << 16, 'x');
  for (;;) {
    const ssize_t n = ::send(fd, block.data(), block.size(), MSG_NOSIGNAL);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    if (n < 0) return;
  }
}

bool established(int fd) {
  tcp_info info{};
  socklen_t len = sizeof(info);
  return ::getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &len) == 0 && info.tcpi_state == TCP_ESTABLISHED;
}

void aPeerThatDoesNotReadIsNotDead() {
  const auto bound = 600ms;  // silent after 400 ms, looked at every 100 ms
  rcoll::SocketOptions options{0, bound, true};
  auto [writer, reader] = loopbackPair(options);
  AckWatch watch(bound);
  fill(writer);
  AckWatch::Clock::time_point silent_look{};
  int dead_looks = 0;
  const auto until = std::chrono::steady_clock::now() + 8 * bound;  // the window stays zero all along
  while (std::chrono::steady_clock::now() < until) {
    const auto now = std::chrono::steady_clock::now();
    if (watch.due(now) && watch.dead(writer, now, &silent_look)) ++dead_looks;
    fill(writer);
    std::this_thread::sleep_for(10ms);
  }
  check(dead_looks == 0, "a zero window whose probes are answered is not a dead peer: " + std::to_string(dead_looks));
  check(established(writer), "nothing closed the socket");
  ::close(writer);
  ::close(reader);

  // The kernel's timer on the same socket, for the record.
  options.owner_watches_acks = false;
  auto [kwriter, kreader] = loopbackPair(options);
  fill(kwriter);
  std::this_thread::sleep_for(8 * bound);
  std::printf("the kernel's TCP_USER_TIMEOUT on a zero window held %lld ms: %s\n",
              static_cast<long long>((8 * bound).count()),
              established(kwriter) ? "the socket is open" : "it closed the socket");
  ::close(kwriter);
  ::close(kreader);
}

void looksArePaced() {
  AckWatch off(0ms);
  check(!off.enabled() && !off.due(std::chrono::steady_clock::now()), "RCOLL_PEER_TIMEOUT=0: no looks");
  check(off.untilDue(std::chrono::steady_clock::now()) == std::chrono::milliseconds::max(), "and no wake-ups");
  AckWatch watch(1200ms);  // every 100 ms
  const auto t0 = std::chrono::steady_clock::now();
  check(watch.due(t0), "the first look is due at once");
  check(!watch.due(t0 + 50ms), "the next not before the interval");
  check(watch.untilDue(t0 + 50ms) > 0ms && watch.untilDue(t0 + 50ms) <= 51ms, "a sleep ends by the next look");
  check(watch.due(t0 + 100ms), "then it is due");
  check(watch.silentAfter() == 800ms, "silent after 2/3 of the bound");
}

}  // namespace

int main() {
  looksArePaced();
  aPeerThatDoesNotReadIsNotDead();
  return unit::finishUnit("test_ack_watch");
}
