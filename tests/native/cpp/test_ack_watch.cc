// The TCP transport's judgement of its peers' hosts (csrc/ack_watch.h), on
// loopback: a peer that reads nothing while more is queued to it than its
// socket buffers hold (a zero window, its kernel answering the window probes)
// is never judged dead, looked at for many times the bound; the kernel's own
// TCP_USER_TIMEOUT, for contrast, fails such a socket on Linux 5.11 and
// later (printed, not judged: it is the kernel's). The judgement itself on
// made-up readings (a link that stops acknowledging, a socket that only
// received, probes, looks far apart), and the looks' pacing. A real cut link
// is tests/failures/test_link_failure.py's (emulated hosts).
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
  const auto bound = 1500ms;  // silent after 1 s, looked at every 125 ms
  rcoll::SocketOptions options{0, bound};
  auto [writer, reader] = loopbackPair(options);
  rcoll::leaveAcksToOwner(writer);
  AckWatch watch(bound);
  fill(writer);
  AckWatch::Marks marks;
  int dead_looks = 0;
  const auto until = std::chrono::steady_clock::now() + 6 * bound;  // the window stays zero all along
  while (std::chrono::steady_clock::now() < until) {
    const auto now = std::chrono::steady_clock::now();
    if (watch.due(now) && watch.dead(writer, now, &marks)) ++dead_looks;
    fill(writer);
    std::this_thread::sleep_for(10ms);
  }
  check(dead_looks == 0, "a zero window whose probes are answered is not a dead peer: " + std::to_string(dead_looks));
  check(established(writer), "nothing closed the socket");
  ::close(writer);
  ::close(reader);

  // The kernel's timer on the same socket, for the record.
  auto [kwriter, kreader] = loopbackPair(options);
  fill(kwriter);
  std::this_thread::sleep_for(6 * bound);
  std::printf("the kernel's TCP_USER_TIMEOUT on a zero window held %lld ms: %s\n",
              static_cast<long long>((6 * bound).count()),
              established(kwriter) ? "the socket is open" : "it closed the socket");
  ::close(kwriter);
  ::close(kreader);
}

// The judgement on readings, with a 1.2 s bound (silent after 800 ms, looks every 100 ms).
void judgement() {
  AckWatch watch(1200ms);
  const auto t0 = AckWatch::Clock::now();
  using R = AckWatch::Reading;
  {  // Data in flight and nothing acknowledged: dead at the second look past 800 ms of silence.
    AckWatch::Marks m;
    int dead_at = -1;
    for (int k = 0; k <= 12 && dead_at < 0; ++k) {
      if (watch.judge(R{4, 0, 50u + 100u * static_cast<uint32_t>(k)}, t0 + k * 100ms, &m)) dead_at = k;
    }
    check(dead_at == 9, "data unacknowledged: dead at the look after the first silent one, " + std::to_string(dead_at));
    // An acknowledgement between two silent looks clears the first.
    AckWatch::Marks n;
    for (int k = 0; k <= 8; ++k) watch.judge(R{4, 0, 50u + 100u * static_cast<uint32_t>(k)}, t0 + k * 100ms, &n);
    check(!watch.judge(R{4, 0, 20}, t0 + 900ms, &n), "an acknowledgement in between");
    check(!watch.judge(R{4, 0, 900}, t0 + 1000ms, &n), "then one silent look is again only the first");
  }
  {  // A socket that only received for minutes starts sending: silence counts from its first look owing.
    AckWatch::Marks m;
    check(!watch.judge(R{0, 0, 600'000}, t0, &m), "owing nothing is never silent");
    bool dead = false;
    for (int k = 1; k <= 8; ++k) dead |= watch.judge(R{2, 0, 600'000 + 100u * k}, t0 + k * 100ms, &m);
    check(!dead, "not dead before 2/3 of the bound from the first look owing");
    check(!watch.judge(R{2, 0, 601'000}, t0 + 900ms, &m), "its first silent look");
    check(watch.judge(R{2, 0, 601'100}, t0 + 1000ms, &m), "dead once that long has passed, at two looks");
  }
  {  // Probes: fewer than three unanswered prove nothing (rate-limited or loopback answers).
    AckWatch::Marks m;
    bool dead = false;
    for (int k = 0; k < 30; ++k)
      dead |= watch.judge(R{0, 2, 5000u + 100u * static_cast<uint32_t>(k)}, t0 + k * 100ms, &m);
    check(!dead, "two probes out on a zero window is not silence");
    int dead_at = -1;
    for (int k = 30; k <= 45 && dead_at < 0; ++k) {
      if (watch.judge(R{0, 3, 8000u + 100u * static_cast<uint32_t>(k)}, t0 + k * 100ms, &m)) dead_at = k;
    }
    check(dead_at == 39, "three unanswered probes: dead 800 ms after the first look owing, " + std::to_string(dead_at));
  }
  {  // Looks far apart (one op, then the next minutes later) are not two in a row.
    AckWatch::Marks m;
    check(!watch.judge(R{4, 0, 5000}, t0, &m), "a first silent look");
    check(!watch.judge(R{4, 0, 900'000}, t0 + 600s, &m), "the next op's first look starts afresh");
  }
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
  judgement();
  aPeerThatDoesNotReadIsNotDead();
  return unit::finishUnit("test_ack_watch");
}
