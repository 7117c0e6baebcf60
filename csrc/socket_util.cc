#include "socket_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <algorithm>
#include <climits>
#include <cstring>
#include <vector>

#include "error.h"

namespace rcoll {

int millisecondsUntil(Deadline deadline) {
  auto left =
      std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
  if (left <= 0) return 0;
  return left > INT_MAX ? INT_MAX : static_cast<int>(left);
}

std::string errnoText(int err) { return strFormat("%s (errno %d)", std::strerror(err), err); }

bool splitHostPort(const std::string& address, std::string* host, int* port) {
  size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 >= address.size()) return false;
  std::string h = address.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  char* end = nullptr;
  long p = std::strtol(address.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || p <= 0 || p > 65535) return false;
  *host = h;
  *port = static_cast<int>(p);
  return true;
}

bool isLinkFailure(int err) {
  switch (err) {
    case ETIMEDOUT:     // nothing acknowledged for RCOLL_PEER_TIMEOUT (TCP_USER_TIMEOUT)
    case EHOSTUNREACH:  // the route or the neighbour went away
    case ENETUNREACH:
    case ENETDOWN:
    case EHOSTDOWN:
      return true;
    default:  // ECONNRESET, EPIPE, EOF: the peer's end closed, so its process is gone
      return false;
  }
}

std::string joinHostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

std::vector<std::string> splitList(const std::string& list, char separator) {
  std::vector<std::string> out;
  for (size_t start = 0; start <= list.size();) {
    const size_t end = std::min(list.find(separator, start), list.size());
    out.push_back(list.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

std::vector<std::string> splitCommas(const std::string& list) { return splitList(list, ','); }

std::string laneAddress(const std::string& addresses, int k) {
  const std::vector<std::string> list = splitCommas(addresses);
  return list[static_cast<size_t>(k) % list.size()];
}

static std::string withoutBrackets(const std::string& host) {
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') return host.substr(1, host.size() - 2);
  return host;
}

static bool hostHasIPv6() {
  int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

std::string resolveSocketAddress(const std::string& host_in, int port, bool passive, sockaddr_storage* out,
                                 unsigned* out_len) {
  const std::string host = withoutBrackets(host_in);
  std::memset(out, 0, sizeof(*out));
  if (passive && (host.empty() || host == "0.0.0.0" || host == "::")) {
    if (host != "0.0.0.0" && hostHasIPv6()) {
      auto* sin6 = reinterpret_cast<sockaddr_in6*>(out);
      sin6->sin6_family = AF_INET6;
      sin6->sin6_addr = in6addr_any;
      sin6->sin6_port = htons(static_cast<uint16_t>(port));
      *out_len = sizeof(sockaddr_in6);
    } else {
      auto* sin = reinterpret_cast<sockaddr_in*>(out);
      sin->sin_family = AF_INET;
      sin->sin_addr.s_addr = htonl(INADDR_ANY);
      sin->sin_port = htons(static_cast<uint16_t>(port));
      *out_len = sizeof(sockaddr_in);
    }
    return "";
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* result = nullptr;
  const std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &result);
  if (rc != 0) return rc == EAI_SYSTEM ? errnoText(errno) : std::string(gai_strerror(rc));
  if (result == nullptr) return "no address found";
  // Prefer IPv4: it is what a name that has both usually means in a job (MASTER_ADDR).
  addrinfo* pick = result;
  for (addrinfo* it = result; it != nullptr; it = it->ai_next) {
    if (it->ai_family == AF_INET) {
      pick = it;
      break;
    }
  }
  std::memcpy(out, pick->ai_addr, pick->ai_addrlen);
  *out_len = static_cast<unsigned>(pick->ai_addrlen);
  freeaddrinfo(result);
  return "";
}

bool resolveHost(const std::string& host, int port, sockaddr_storage* out, unsigned* out_len) {
  return resolveSocketAddress(host, port, /*passive=*/false, out, out_len).empty();
}

int listenSocket(const sockaddr_storage& addr, unsigned len, int backlog) {
  int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  int one = 1, zero = 0;
  // Lets a restarted job rebind the port while old connections sit in TIME_WAIT.
  (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (addr.ss_family == AF_INET6 && IN6_IS_ADDR_UNSPECIFIED(&reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_addr)) {
    (void)setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));  // IPv4 peers too, whatever bindv6only says
  }
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), len) != 0 || ::listen(fd, backlog) != 0) {
    int err = errno;
    ::close(fd);
    errno = err;
    return -1;
  }
  return fd;
}

std::string numericHost(const sockaddr_storage& addr) {
  char text[NI_MAXHOST] = {};
  const socklen_t len = addr.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, text, sizeof(text), nullptr, 0, NI_NUMERICHOST) != 0) {
    return "?";
  }
  std::string host = text;
  // An IPv4 peer of a dual-stack socket shows as ::ffff:a.b.c.d: say a.b.c.d.
  if (host.compare(0, 7, "::ffff:") == 0 && host.find('.') != std::string::npos) host = host.substr(7);
  return host;
}

int portOf(const sockaddr_storage& addr) {
  return addr.ss_family == AF_INET ? ntohs(reinterpret_cast<const sockaddr_in*>(&addr)->sin_port)
                                   : ntohs(reinterpret_cast<const sockaddr_in6*>(&addr)->sin6_port);
}

std::string sourceAddressFor(const std::string& host) {
  sockaddr_storage target{};
  unsigned len = 0;
  if (!resolveHost(host, 9, &target, &len)) return "";
  int fd = ::socket(target.ss_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  std::string found;
  if (::connect(fd, reinterpret_cast<sockaddr*>(&target), len) == 0) {
    sockaddr_storage local{};
    socklen_t local_len = sizeof(local);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &local_len) == 0) found = numericHost(local);
  }
  ::close(fd);
  return found;
}

std::string peerName(int fd) {
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) return "?";
  return joinHostPort(numericHost(addr), portOf(addr));
}

void setNonBlocking(int fd, bool on) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0) return;
  fcntl(fd, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK));
}

void applySocketOptions(int fd, const SocketOptions& options) {
  // Best effort: a refused option costs speed or detection time, never correctness.
  int one = 1;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (options.buffer_bytes > 0) {
    int value = options.buffer_bytes > static_cast<size_t>(INT_MAX) ? INT_MAX : static_cast<int>(options.buffer_bytes);
    (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &value, sizeof(value));
    (void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &value, sizeof(value));
  }
  const long long total_ms = options.dead_after.count();
  if (total_ms <= 0) return;
  // Unacknowledged data fails the socket after 2/3 of the bound (the kernel's
  // timer, or the owner's where it takes that over: ack_watch.h). An idle
  // connection is probed after 1/3 of it, then every 1/6: the kernel drops it
  // at the first unanswered probe past the user timeout, so by 5/6 of the bound.
  const unsigned user_timeout_ms = static_cast<unsigned>(std::min<long long>(total_ms * 2 / 3, INT_MAX));
  const int idle_s = static_cast<int>(std::max<long long>(1, total_ms / 3000));
  const int interval_s = static_cast<int>(std::max<long long>(1, total_ms / 6000));
  const int probes = 3;
  (void)setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &user_timeout_ms, sizeof(user_timeout_ms));
  (void)setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
  (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle_s, sizeof(idle_s));
  (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &interval_s, sizeof(interval_s));
  (void)setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &probes, sizeof(probes));
}

static bool waitFor(int fd, short events, Deadline deadline, std::string* why) {
  for (;;) {
    pollfd pfd{fd, events, 0};
    int timeout = millisecondsUntil(deadline);
    int rc = ::poll(&pfd, 1, timeout);
    if (rc > 0) return true;
    if (rc == 0) {
      *why = "timed out";
      return false;
    }
    if (errno != EINTR) {
      *why = errnoText(errno);
      return false;
    }
  }
}

bool sendAll(int fd, const void* data, size_t bytes, Deadline deadline, std::string* why) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t n = ::send(fd, p, bytes, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!waitFor(fd, POLLOUT, deadline, why)) return false;
      continue;
    }
    *why = errnoText(errno);
    return false;
  }
  return true;
}

bool recvAll(int fd, void* data, size_t bytes, Deadline deadline, std::string* why) {
  char* p = static_cast<char*>(data);
  while (bytes > 0) {
    ssize_t n = ::recv(fd, p, bytes, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      bytes -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      *why = "the peer closed the connection";
      return false;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (!waitFor(fd, POLLIN, deadline, why)) return false;
      continue;
    }
    *why = errnoText(errno);
    return false;
  }
  return true;
}

void signalEventfd(int fd) {
  const uint64_t one = 1;
  ssize_t ignored = ::write(fd, &one, sizeof(one));
  (void)ignored;
}

void drainEventfd(int fd) {
  uint64_t count = 0;
  ssize_t ignored = ::read(fd, &count, sizeof(count));
  (void)ignored;
}

}  // namespace rcoll
