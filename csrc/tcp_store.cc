#include "tcp_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <unordered_map>

#include "error.h"
#include "socket_util.h"

namespace rcoll {
namespace {

enum Command : uint8_t { kSet = 1, kGet = 2, kAdd = 3, kCheck = 4 };

// Anything larger is not a rendezvous key or value: treat it as a stray or broken
// peer rather than trying to allocate it.
constexpr size_t kMaxKeyBytes = 64 * 1024;
constexpr size_t kMaxValueBytes = 64 * 1024 * 1024;
constexpr size_t kRequestHeaderBytes = 1 + 4 + 4;
constexpr size_t kMaxRequestBytes = kRequestHeaderBytes + kMaxKeyBytes + kMaxValueBytes;

// ---- Little-endian integers on the wire, spelled out byte by byte. ----

void putU32(std::vector<uint8_t>& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

void putI64(std::vector<uint8_t>& out, int64_t value) {
  uint64_t v = static_cast<uint64_t>(value);
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
}

uint32_t getU32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}

int64_t getI64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return static_cast<int64_t>(v);
}

// "host:port" ("[v6]:port"), with "*" standing in for an empty host (every address).
std::string joinAddress(const std::string& host, int port) { return joinHostPort(host.empty() ? "*" : host, port); }

double toSeconds(std::chrono::milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }

// now + timeout, saturating so that a huge timeout means "no deadline".
std::chrono::steady_clock::time_point deadlineAfter(std::chrono::milliseconds timeout) {
  using Clock = std::chrono::steady_clock;
  auto now = Clock::now();
  if (timeout.count() < 0) timeout = std::chrono::milliseconds(0);
  if (timeout >= std::chrono::duration_cast<std::chrono::milliseconds>(Clock::time_point::max() - now)) {
    return Clock::time_point::max();
  }
  return now + timeout;
}

// Milliseconds left until `deadline` as a poll() timeout (-1 = no deadline),
// rounded up so that poll never wakes just before the deadline and spins.
int pollTimeoutMs(std::chrono::steady_clock::time_point deadline) {
  using Clock = std::chrono::steady_clock;
  if (deadline == Clock::time_point::max()) return -1;
  auto left = deadline - Clock::now();
  if (left <= Clock::duration::zero()) return 0;
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(left).count() + 1;
  return static_cast<int>(std::min<int64_t>(ms, INT_MAX));
}

void setNoDelay(int fd) {
  int one = 1;
  // Best effort: requests and replies are small and latency-bound; failing to
  // set it only costs speed.
  (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

}  // namespace

// =====================================================================
// Server
// =====================================================================

struct TcpStoreServer::State {
  struct Client {
    int fd = -1;
    std::vector<uint8_t> in;  // received, not yet parsed from in_pos on
    size_t in_pos = 0;
    std::vector<uint8_t> out;  // replies not yet sent from out_pos on
    size_t out_pos = 0;
    bool parked = false;  // waiting in a GET for parked_key to appear
    std::string parked_key;
  };
  enum class Parse { kNeedMore, kDone, kBad };

  // While this much reply data is unsent, the client's further requests wait:
  // a client that pipelines GETs without reading replies cannot grow our memory.
  static constexpr size_t kOutHighWater = 1 << 20;
  static constexpr size_t kReadChunk = 256 * 1024;

  std::map<std::string, std::vector<uint8_t>> data;
  // By id rather than fd: fds are reused by accept() and a stale waiter entry
  // must never answer a newcomer. std::map keeps references to other clients
  // valid while one is erased.
  std::map<uint64_t, Client> clients;
  std::unordered_map<std::string, std::vector<uint64_t>> waiters;  // key -> parked ids
  std::vector<uint64_t> runnable;                                  // clients to flush and parse again (e.g. just woken)
  uint64_t next_id = 1;
  std::chrono::steady_clock::time_point accept_paused_until{};

  ~State() {
    for (auto& entry : clients) ::close(entry.second.fd);
  }

  static size_t pending(const Client& c) { return c.out.size() - c.out_pos; }
  static size_t unparsed(const Client& c) { return c.in.size() - c.in_pos; }

  void drop(uint64_t id) {
    auto it = clients.find(id);
    if (it == clients.end()) return;
    Client& c = it->second;
    if (c.parked) {
      auto w = waiters.find(c.parked_key);
      if (w != waiters.end()) {
        auto& ids = w->second;
        ids.erase(std::remove(ids.begin(), ids.end(), id), ids.end());
        if (ids.empty()) waiters.erase(w);
      }
    }
    ::close(c.fd);
    clients.erase(it);
  }

  void acceptAll(int listen_fd) {
    for (;;) {
      int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EINTR || errno == ECONNABORTED) continue;
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
          // The pending connection stays queued and the listen fd stays readable:
          // stop polling it for a moment instead of spinning.
          accept_paused_until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
        }
        return;  // EAGAIN: nothing more to accept
      }
      setNoDelay(fd);
      Client c;
      c.fd = fd;
      clients.emplace(next_id++, std::move(c));
    }
  }

  // Sends what the socket takes without blocking. False if the client is gone.
  bool flush(Client& c) {
    while (pending(c) > 0) {
      ssize_t n = ::send(c.fd, c.out.data() + c.out_pos, pending(c), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return true;  // wait for POLLOUT
        return false;
      }
      c.out_pos += static_cast<size_t>(n);
    }
    c.out.clear();
    c.out_pos = 0;
    // Do not keep a large reply's buffer around per idle client.
    if (c.out.capacity() > kOutHighWater) c.out.shrink_to_fit();
    return true;
  }

  // Reads one chunk (no more, so one busy client cannot hold up the loop).
  // False if the client is gone.
  bool readSome(Client& c) {
    size_t room = std::min(kReadChunk, kMaxRequestBytes - std::min(kMaxRequestBytes, unparsed(c)));
    if (room == 0) return true;  // not polled for input in this state; nothing to do
    size_t old = c.in.size();
    c.in.resize(old + room);
    ssize_t n;
    do {
      n = ::recv(c.fd, c.in.data() + old, room, 0);
    } while (n < 0 && errno == EINTR);
    c.in.resize(old + (n > 0 ? static_cast<size_t>(n) : 0));
    if (n == 0) return false;  // peer closed
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK;
    return true;
  }

  void replyValue(Client& c, const std::vector<uint8_t>& value) {
    putU32(c.out, static_cast<uint32_t>(value.size()));
    c.out.insert(c.out.end(), value.begin(), value.end());
  }

  // Answers every GET parked on `key`, which now exists.
  void wake(const std::string& key) {
    auto w = waiters.find(key);
    if (w == waiters.end()) return;
    std::vector<uint64_t> ids = std::move(w->second);
    waiters.erase(w);
    const std::vector<uint8_t>& value = data[key];
    for (uint64_t id : ids) {
      auto it = clients.find(id);
      if (it == clients.end()) continue;
      Client& c = it->second;
      c.parked = false;
      c.parked_key.clear();
      replyValue(c, value);
      // Sent (and its pipelined requests parsed) from the main loop, not here:
      // we may be in the middle of serving another client.
      runnable.push_back(id);
    }
  }

  // Parses and executes at most one complete request from c's input.
  Parse parseOne(uint64_t id, Client& c) {
    const size_t avail = unparsed(c);
    const uint8_t* p = c.in.data() + c.in_pos;
    // Reject garbage as soon as the bytes that prove it are in, rather than
    // waiting for a length it announced that may never come.
    if (avail < 1) return Parse::kNeedMore;
    const uint8_t cmd = p[0];
    if (cmd < kSet || cmd > kCheck) return Parse::kBad;
    if (avail < 5) return Parse::kNeedMore;
    const size_t key_len = getU32(p + 1);
    if (key_len > kMaxKeyBytes) return Parse::kBad;
    if (avail < 5 + key_len + 4) return Parse::kNeedMore;
    const size_t value_len = getU32(p + 5 + key_len);
    if (value_len > kMaxValueBytes) return Parse::kBad;
    if (cmd == kAdd && value_len != 8) return Parse::kBad;
    const size_t total = kRequestHeaderBytes + key_len + value_len;
    if (avail < total) return Parse::kNeedMore;

    std::string key(reinterpret_cast<const char*>(p + 5), key_len);
    const uint8_t* value = p + 5 + key_len + 4;
    c.in_pos += total;

    switch (cmd) {
      case kSet:
        data[key].assign(value, value + value_len);
        c.out.push_back(0);
        wake(key);
        break;
      case kGet: {
        auto it = data.find(key);
        if (it != data.end()) {
          replyValue(c, it->second);
        } else {
          c.parked = true;
          c.parked_key = key;
          waiters[key].push_back(id);
        }
        break;
      }
      case kAdd: {
        // Stored as decimal text, as torch's TCPStore does, so that a get() of a
        // counter returns the same bytes whichever store is in use. A value that
        // is not a number counts as 0.
        std::vector<uint8_t>& slot = data[key];
        std::string text(slot.begin(), slot.end());
        int64_t current = std::strtoll(text.c_str(), nullptr, 10);
        // Wraps on overflow instead of undefined behaviour.
        int64_t updated = static_cast<int64_t>(static_cast<uint64_t>(current) + static_cast<uint64_t>(getI64(value)));
        std::string out = std::to_string(updated);
        slot.assign(out.begin(), out.end());
        putI64(c.out, updated);
        wake(key);
        break;
      }
      case kCheck:
        c.out.push_back(data.count(key) != 0 ? 1 : 0);
        break;
    }
    return Parse::kDone;
  }

  // Sends pending replies and executes complete requests while the client is
  // neither parked nor backed up on output. Drops the client on error or garbage.
  void service(uint64_t id) {
    auto it = clients.find(id);
    if (it == clients.end()) return;
    Client& c = it->second;
    for (;;) {
      if (!flush(c)) return drop(id);
      bool backed_up = false;
      while (!c.parked) {
        if (pending(c) >= kOutHighWater) {
          backed_up = true;
          break;
        }
        Parse r = parseOne(id, c);
        if (r == Parse::kBad) return drop(id);
        if (r == Parse::kNeedMore) break;
      }
      if (c.in_pos > 0) {
        c.in.erase(c.in.begin(), c.in.begin() + static_cast<std::ptrdiff_t>(c.in_pos));
        c.in_pos = 0;
        if (c.in.capacity() > kOutHighWater && c.in.size() < kOutHighWater) c.in.shrink_to_fit();
      }
      if (!flush(c)) return drop(id);
      // Stopped for backlog and the socket took it all: keep going, otherwise
      // POLLOUT (or more input) brings us back.
      if (!(backed_up && pending(c) < kOutHighWater)) return;
    }
  }

  // Handles poll() results for one client.
  void onEvents(uint64_t id, short revents) {
    auto it = clients.find(id);
    if (it == clients.end()) return;
    Client& c = it->second;
    // A client that shut down its sending side (or failed) cannot be part of a
    // request/reply exchange any more, parked or not.
    if (revents & (POLLERR | POLLHUP | POLLNVAL | POLLRDHUP)) return drop(id);
    if (revents & POLLIN) {
      if (!readSome(c)) return drop(id);
    }
    if (revents & (POLLIN | POLLOUT)) service(id);
  }

  void runRunnable() {
    while (!runnable.empty()) {
      std::vector<uint64_t> batch;
      batch.swap(runnable);
      for (uint64_t id : batch) guarded(id, [&] { service(id); });
    }
  }

  // Runs per-client work so that a failure (say, bad_alloc for a 64 MiB value)
  // costs that client its connection instead of taking the server down.
  template <typename F>
  void guarded(uint64_t id, F&& fn) {
    try {
      fn();
    } catch (const std::exception&) {  // not catch (...): a forced unwind must go on
      drop(id);
    }
  }
};

TcpStoreServer::TcpStoreServer(const std::string& host, int port) : state_(new State()) {
  const std::string where = joinAddress(host, port);
  auto fail = [&](const std::string& why) {
    if (listen_fd_ >= 0) ::close(listen_fd_);
    if (wake_fd_ >= 0) ::close(wake_fd_);
    listen_fd_ = wake_fd_ = -1;
    throwError(ErrorKind::kConfig,
               strFormat("could not start the rendezvous store on %s: %s", where.c_str(), why.c_str()));
  };
  if (port < 0 || port > 65535) fail(strFormat("port %d is out of range", port));

  // "" (or "::"): every address of both families, so that ranks reach the
  // store over IPv4 or IPv6 alike; a literal or name: that address only.
  sockaddr_storage addr{};
  unsigned addr_len = 0;
  std::string why = resolveSocketAddress(host, port, /*passive=*/true, &addr, &addr_len);
  if (!why.empty()) fail("cannot resolve the host: " + why);
  // Every rank connects at once at start-up; a short backlog would drop SYNs and
  // cost them a retransmit timeout.
  listen_fd_ = listenSocket(addr, addr_len, 1024);
  if (listen_fd_ < 0) fail("bind/listen: " + errnoText(errno));
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  if (::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
    fail("getsockname: " + errnoText(errno));
  }
  port_ = portOf(bound);

  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) fail("eventfd: " + errnoText(errno));

  thread_ = std::thread([this] { serve(); });
}

TcpStoreServer::~TcpStoreServer() {
  if (thread_.joinable()) {
    uint64_t one = 1;
    ssize_t n;
    do {
      n = ::write(wake_fd_, &one, sizeof(one));
    } while (n < 0 && errno == EINTR);
    thread_.join();
  }
  state_.reset();  // closes the client connections: parked clients see EOF now
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void TcpStoreServer::serve() {
  State& st = *state_;
  std::vector<pollfd> fds;
  std::vector<uint64_t> ids;  // ids[i] belongs to fds[i + 2]
  for (;;) {
    try {
      const auto now = std::chrono::steady_clock::now();
      const bool accepting = now >= st.accept_paused_until;
      fds.clear();
      ids.clear();
      fds.push_back({wake_fd_, POLLIN, 0});
      fds.push_back({listen_fd_, static_cast<short>(accepting ? POLLIN : 0), 0});
      for (auto& entry : st.clients) {
        const State::Client& c = entry.second;
        short events = POLLRDHUP;
        // Stop reading once a whole maximal request is buffered unparsed (the
        // client is parked or backed up): memory stays bounded per client.
        if (State::unparsed(c) < kMaxRequestBytes) events |= POLLIN;
        if (State::pending(c) > 0) events |= POLLOUT;
        fds.push_back({entry.second.fd, events, 0});
        ids.push_back(entry.first);
      }
      int timeout = -1;
      if (!accepting) timeout = pollTimeoutMs(st.accept_paused_until);

      int n = ::poll(fds.data(), fds.size(), timeout);
      if (n < 0) {
        if (errno == EINTR) continue;
        // Unexpected (EFAULT/EINVAL/ENOMEM): back off rather than spin.
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
        continue;
      }
      if (fds[0].revents != 0) return;  // the destructor asked us to stop
      if (fds[1].revents & POLLIN) st.acceptAll(listen_fd_);
      for (size_t i = 0; i < ids.size(); ++i) {
        short revents = fds[i + 2].revents;
        if (revents == 0) continue;
        uint64_t id = ids[i];
        st.guarded(id, [&] { st.onEvents(id, revents); });
      }
      st.runRunnable();
    } catch (const std::exception&) {
      // Only allocation failures outside per-client work can land here; let
      // memory free up and try again instead of letting the thread die.
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
}

// =====================================================================
// Client
// =====================================================================

namespace {

std::vector<uint8_t> encodeRequest(uint8_t cmd, const std::string& key, const uint8_t* value, size_t value_len) {
  if (key.size() > kMaxKeyBytes) {
    throwError(ErrorKind::kInvalidArgument,
               strFormat("store key is %zu bytes; the limit is %zu", key.size(), kMaxKeyBytes));
  }
  if (value_len > kMaxValueBytes) {
    throwError(ErrorKind::kInvalidArgument, strFormat("store value for key '%s' is %zu bytes; the limit is %zu",
                                                      key.c_str(), value_len, kMaxValueBytes));
  }
  std::vector<uint8_t> req;
  req.reserve(kRequestHeaderBytes + key.size() + value_len);
  req.push_back(cmd);
  putU32(req, static_cast<uint32_t>(key.size()));
  req.insert(req.end(), key.begin(), key.end());
  putU32(req, static_cast<uint32_t>(value_len));
  if (value_len > 0) req.insert(req.end(), value, value + value_len);
  return req;
}

}  // namespace

TcpStoreClient::TcpStoreClient(const std::string& host, int port, std::chrono::milliseconds connect_timeout)
    : host_(host), port_(port), connect_timeout_(connect_timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  connectLocked();
}

TcpStoreClient::~TcpStoreClient() {
  if (fd_ >= 0) ::close(fd_);
}

std::string TcpStoreClient::address() const { return joinAddress(host_, port_); }

void TcpStoreClient::connectLocked() {
  const auto deadline = deadlineAfter(connect_timeout_);
  std::string last_error = "no attempt was made";
  for (;;) {
    sockaddr_storage addr{};
    unsigned addr_len = 0;
    std::string why = resolveSocketAddress(host_, port_, /*passive=*/false, &addr, &addr_len);
    if (!why.empty()) {
      last_error = "cannot resolve the host: " + why;
    } else {
      // Non-blocking connect so that an unreachable host costs at most the
      // remaining timeout, not the kernel's SYN retry budget (minutes).
      int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
      if (fd < 0) {
        last_error = "socket: " + errnoText(errno);
      } else {
        int err = 0;
        if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), addr_len) != 0) {
          err = errno;
          if (err == EINPROGRESS || err == EINTR) {
            pollfd pfd{fd, POLLOUT, 0};
            int n;
            do {
              n = ::poll(&pfd, 1, pollTimeoutMs(deadline));
            } while (n < 0 && errno == EINTR);
            if (n == 0) {
              err = ETIMEDOUT;
            } else if (n < 0) {
              err = errno;
            } else {
              socklen_t len = sizeof(err);
              if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
            }
          }
        }
        if (err == 0) {
          // Back to blocking: every later wait is bounded by poll() anyway.
          int flags = ::fcntl(fd, F_GETFL);
          if (flags >= 0) (void)::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
          setNoDelay(fd);
          // Only the first connection sets it: localAddress() reads it without
          // the lock, and a reconnect would reach the same host the same way.
          if (local_address_.empty()) {
            sockaddr_storage local{};
            socklen_t len = sizeof(local);
            if (::getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0) local_address_ = numericHost(local);
          }
          fd_ = fd;
          return;
        }
        ::close(fd);
        last_error = errnoText(err);
      }
    }
    auto now = Clock::now();
    if (now >= deadline) break;
    // The server may simply not be up yet: wait a little and try again.
    auto pause = std::min<Clock::duration>(std::chrono::milliseconds(50), deadline - now);
    std::this_thread::sleep_for(pause);
  }
  throwError(ErrorKind::kTimeout, strFormat("could not reach the rendezvous store at %s within %g s (is rank 0 "
                                            "running and MASTER_ADDR/MASTER_PORT right?): %s",
                                            address().c_str(), toSeconds(connect_timeout_), last_error.c_str()));
}

void TcpStoreClient::closeLocked() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void TcpStoreClient::lostConnectionLocked(const std::string& detail) {
  closeLocked();
  throwError(ErrorKind::kPeer, strFormat("lost the connection to the rendezvous store at %s (did the process "
                                         "hosting it, usually rank 0, exit?): %s",
                                         address().c_str(), detail.c_str()));
}

void TcpStoreClient::sendLocked(const std::vector<uint8_t>& request) {
  size_t done = 0;
  while (done < request.size()) {
    // MSG_NOSIGNAL: a dead server must give EPIPE here, not kill the process.
    ssize_t n = ::send(fd_, request.data() + done, request.size() - done, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      lostConnectionLocked(errnoText(errno));
    }
    done += static_cast<size_t>(n);
  }
}

bool TcpStoreClient::recvLocked(void* buf, size_t n, Clock::time_point deadline) {
  auto* out = static_cast<uint8_t*>(buf);
  size_t done = 0;
  while (done < n) {
    pollfd pfd{fd_, POLLIN, 0};
    int ready = ::poll(&pfd, 1, pollTimeoutMs(deadline));
    if (ready < 0) {
      if (errno == EINTR) continue;
      lostConnectionLocked("poll: " + errnoText(errno));
    }
    if (ready == 0) {
      if (Clock::now() >= deadline) return false;
      continue;  // woke a hair early
    }
    ssize_t got = ::recv(fd_, out + done, n - done, 0);
    if (got == 0) lostConnectionLocked("the store closed the connection");
    if (got < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
      lostConnectionLocked(errnoText(errno));
    }
    done += static_cast<size_t>(got);
  }
  return true;
}

void TcpStoreClient::set(const std::string& key, const std::vector<uint8_t>& value) {
  std::vector<uint8_t> req = encodeRequest(kSet, key, value.data(), value.size());
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ < 0) connectLocked();
  sendLocked(req);
  uint8_t status = 0xff;
  recvLocked(&status, 1, Clock::time_point::max());
  if (status != 0) lostConnectionLocked(strFormat("unexpected reply %u to a set", status));
}

std::vector<uint8_t> TcpStoreClient::get(const std::string& key, std::chrono::milliseconds timeout) {
  std::vector<uint8_t> req = encodeRequest(kGet, key, nullptr, 0);
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ < 0) connectLocked();
  const auto deadline = deadlineAfter(timeout);
  sendLocked(req);
  uint8_t header[4];
  std::vector<uint8_t> value;
  bool ok = recvLocked(header, sizeof(header), deadline);
  if (ok) {
    const size_t len = getU32(header);
    if (len > kMaxValueBytes) {
      lostConnectionLocked(strFormat("reply announces a %zu-byte value for key '%s'", len, key.c_str()));
    }
    value.resize(len);
    ok = len == 0 || recvLocked(value.data(), len, deadline);
  }
  if (!ok) {
    // The server still holds our GET (or is mid-reply): this stream is no longer
    // in step with us. Drop it; the next call reconnects on a clean one.
    closeLocked();
    throwError(ErrorKind::kTimeout, strFormat("%s waiting for key '%s' in the rendezvous store at %s",
                                              timedOut(toSeconds(timeout)).c_str(), key.c_str(), address().c_str()));
  }
  return value;
}

int64_t TcpStoreClient::add(const std::string& key, int64_t delta) {
  std::vector<uint8_t> delta_bytes;
  putI64(delta_bytes, delta);
  std::vector<uint8_t> req = encodeRequest(kAdd, key, delta_bytes.data(), delta_bytes.size());
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ < 0) connectLocked();
  sendLocked(req);
  uint8_t reply[8];
  recvLocked(reply, sizeof(reply), Clock::time_point::max());
  return getI64(reply);
}

bool TcpStoreClient::check(const std::string& key) {
  std::vector<uint8_t> req = encodeRequest(kCheck, key, nullptr, 0);
  std::lock_guard<std::mutex> lock(mutex_);
  if (fd_ < 0) connectLocked();
  sendLocked(req);
  uint8_t reply = 0xff;
  recvLocked(&reply, 1, Clock::time_point::max());
  if (reply > 1) lostConnectionLocked(strFormat("unexpected reply %u to a check", reply));
  return reply == 1;
}

}  // namespace rcoll
