#include "tcp_transport.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "log.h"

namespace rcoll {

namespace {

constexpr uint32_t kHandshakeMagic = 0x53484352;  // "RCHS"
constexpr auto kHandshakeTimeout = std::chrono::seconds(10);
constexpr size_t kMaxAbortMessage = 4096;
constexpr auto kAbortLinger = std::chrono::seconds(2);

#pragma pack(push, 1)
struct Handshake {
  uint32_t magic;
  uint16_t version;
  uint16_t is_ack;
  uint32_t src_rank;
  uint32_t dst_rank;
  uint64_t comm_id;
  uint8_t token[16];
};
#pragma pack(pop)

Handshake makeHandshake(const ConnectInfo& info, int dst_rank, bool is_ack) {
  Handshake h{};
  h.magic = kHandshakeMagic;
  h.version = kWireVersion;
  h.is_ack = is_ack ? 1 : 0;
  h.src_rank = static_cast<uint32_t>(info.rank);
  h.dst_rank = static_cast<uint32_t>(dst_rank);
  h.comm_id = info.comm_id;
  std::memcpy(h.token, info.token, sizeof(h.token));
  return h;
}

// Compares tokens in constant time, so that a scanner learns nothing from timing.
bool sameToken(const uint8_t* a, const uint8_t* b) {
  uint8_t diff = 0;
  for (size_t i = 0; i < 16; ++i) diff |= static_cast<uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

// "" if `h` is a valid handshake of our communicator from `expected_src`
// (-1 = any rank above ours) to us.
std::string checkHandshake(const Handshake& h, const ConnectInfo& info, int expected_src,
                           bool want_ack) {
  if (h.magic != kHandshakeMagic) return "not an rcoll handshake";
  if (h.version != kWireVersion) {
    return strFormat("rcoll wire version %u, this rank speaks %u", h.version, kWireVersion);
  }
  if ((h.is_ack != 0) != want_ack) return "unexpected handshake direction";
  if (h.comm_id != info.comm_id || !sameToken(h.token, info.token)) {
    return "wrong job token (a process of another job or communicator?)";
  }
  if (static_cast<int>(h.dst_rank) != info.rank) return "addressed to another rank";
  int src = static_cast<int>(h.src_rank);
  if (expected_src >= 0 ? src != expected_src : (src <= info.rank || src >= info.size)) {
    return strFormat("claims to be rank %d", src);
  }
  return "";
}

// An abort's text comes from the peer, whose 4096-byte cut may split a
// character (or which may send garbage): keep what is valid UTF-8 and replace
// every other byte with U+FFFD, since Python cannot raise an exception whose
// message does not decode (it raised UnicodeDecodeError instead of PeerError).
std::string validUtf8(const std::string& s) {
  static const uint32_t kMinCodePoint[] = {0, 0, 0x80, 0x800, 0x10000};  // shorter is an overlong encoding
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    const auto lead = static_cast<unsigned char>(s[i]);
    size_t len = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3 : (lead >> 3) == 0x1E ? 4 : 0;
    bool ok = len > 0 && i + len <= s.size();
    uint32_t cp = len > 1 ? lead & (0x7Fu >> len) : lead;
    for (size_t k = 1; ok && k < len; ++k) {
      const auto next = static_cast<unsigned char>(s[i + k]);
      ok = (next & 0xC0) == 0x80;
      cp = (cp << 6) | (next & 0x3F);
    }
    ok = ok && cp >= kMinCodePoint[len] && cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF);
    if (ok) {
      out.append(s, i, len);
      i += len;
    } else {
      out += "\xEF\xBF\xBD";
      ++i;
    }
  }
  return out;
}

ErrorKind errorKindFromWire(uint8_t value) {
  // A peer's mismatch is a mismatch here too; any other failure of a peer is,
  // from this rank's point of view, a peer failure.
  return value == static_cast<uint8_t>(ErrorKind::kMismatch) ? ErrorKind::kMismatch : ErrorKind::kPeer;
}

}  // namespace

struct TcpTransport::TcpRequest : Request {
  bool is_send = false;
  int peer = -1;
  WireHeader header{};  // send: what goes out; recv: what is expected
  char* data = nullptr;
  size_t bytes = 0;
  size_t done = 0;      // send: header + payload bytes written; recv: payload bytes read
  bool released = false;  // the caller let go while it was still queued: recycle when it leaves the queue
  TransportFailure why;
};

struct TcpTransport::Connection {
  int fd = -1;
  int peer = -1;
  std::deque<TcpRequest*> sends;
  std::deque<TcpRequest*> recvs;
  WireHeader in_header{};
  size_t in_header_got = 0;   // bytes of the incoming header read so far
  bool in_header_checked = false;
  std::string abort_text;     // payload of an incoming abort message
  bool failed = false;         // no more requests on this connection
  bool socket_broken = false;  // EOF or I/O error: nothing more can be sent either
  TransportFailure failure;
};

struct TcpTransport::PendingHandshake {
  int fd = -1;
  std::string from;
  Handshake hello{};
  size_t got = 0;
  Deadline deadline;
};

TcpTransport::TcpTransport(const ConnectInfo& info, const Config& config, const std::string& bind_host)
    : info_(info), config_(config), connections_(static_cast<size_t>(info.size)) {
  sockaddr_storage addr{};
  unsigned len = 0;
  if (!resolveHost(bind_host, 0, &addr, &len)) {
    throwError(ErrorKind::kConfig, strFormat("rank %d: cannot resolve the data-socket address '%s'",
                                             info.rank, bind_host.c_str()));
  }
  listen_fd_ = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), len) != 0 ||
      ::listen(listen_fd_, std::max(128, info.size)) != 0) {
    int err = errno;
    if (listen_fd_ >= 0) ::close(listen_fd_);
    throwError(ErrorKind::kConfig, strFormat("rank %d: cannot listen on %s: %s (set RCOLL_SOCKET_IFNAME "
                                             "to an interface with a usable address)",
                                             info.rank, bind_host.c_str(), errnoText(err).c_str()));
  }
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof(bound);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &bound_len);
  int port = bound.ss_family == AF_INET ? ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port)
                                        : ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port);
  listen_address_ = joinHostPort(bind_host, port);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  RCOLL_INFO("tcp transport listening on %s", listen_address_.c_str());
}

TcpTransport::~TcpTransport() {
  closeListener();
  for (auto& c : connections_) {
    if (c && c->fd >= 0) ::close(c->fd);
  }
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void TcpTransport::closeListener() {
  for (auto& p : pending_) ::close(p->fd);
  pending_.clear();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
}

bool TcpTransport::connected(int peer) const {
  return peer >= 0 && peer < info_.size && connections_[static_cast<size_t>(peer)] != nullptr;
}

void TcpTransport::adopt(int peer, int fd) {
  setNonBlocking(fd, true);
  setNoDelay(fd);
  setBufferSizes(fd, config_.socket_buffer_bytes);
  auto conn = std::make_unique<Connection>();
  conn->fd = fd;
  conn->peer = peer;
  connections_[static_cast<size_t>(peer)] = std::move(conn);
  RCOLL_TRACE("connected to rank %d (%s)", peer, peerName(fd).c_str());
}

// Test hook (see the header): adopt() behind an argument check.
void TcpTransport::adoptConnectedSocket(int peer, int fd) {
  if (peer < 0 || peer >= info_.size || peer == info_.rank || connected(peer)) {
    throwError(ErrorKind::kInvalidArgument,
               strFormat("rank %d: adoptConnectedSocket(%d): not a free peer slot", info_.rank, peer));
  }
  adopt(peer, fd);
}

void TcpTransport::connect(int peer, const std::string& address, Deadline deadline) {
  std::string host;
  int port = 0;
  sockaddr_storage addr{};
  unsigned len = 0;
  if (!splitHostPort(address, &host, &port) || !resolveHost(host, port, &addr, &len)) {
    throwError(ErrorKind::kConfig, strFormat("rank %d: rank %d published an unusable address '%s'",
                                             info_.rank, peer, address.c_str()));
  }
  std::string why = "timed out";
  while (std::chrono::steady_clock::now() < deadline) {
    int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throwError(ErrorKind::kPeer, "socket(): " + errnoText(errno));
    setNoDelay(fd);
    setBufferSizes(fd, config_.socket_buffer_bytes);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
      why = errnoText(errno);
      ::close(fd);
      ::usleep(50 * 1000);  // the peer listens before it publishes; this is only a transient refusal
      continue;
    }
    Handshake hello = makeHandshake(info_, peer, /*is_ack=*/false);
    Handshake ack{};
    if (sendAll(fd, &hello, sizeof(hello), deadline, &why) && recvAll(fd, &ack, sizeof(ack), deadline, &why)) {
      std::string bad = checkHandshake(ack, info_, peer, /*want_ack=*/true);
      if (bad.empty()) {
        adopt(peer, fd);
        return;
      }
      ::close(fd);
      throwError(ErrorKind::kPeer, strFormat("rank %d: the process at %s is not rank %d of this job: %s",
                                             info_.rank, address.c_str(), peer, bad.c_str()));
    }
    ::close(fd);
    // The peer dropped us (for example it was still busy); retry until the deadline.
    ::usleep(50 * 1000);
  }
  throwError(ErrorKind::kTimeout, strFormat("rank %d: could not connect to rank %d at %s: %s",
                                            info_.rank, peer, address.c_str(), why.c_str()));
}

void TcpTransport::serviceHandshake(PendingHandshake& p, int* accepted_peer) {
  auto* buf = reinterpret_cast<char*>(&p.hello);
  while (p.got < sizeof(p.hello)) {
    ssize_t n = ::recv(p.fd, buf + p.got, sizeof(p.hello) - p.got, MSG_DONTWAIT);
    if (n > 0) {
      p.got += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;  // wait for more
    RCOLL_WARN("rank %d: dropped a connection from %s that closed before finishing the rcoll handshake",
               info_.rank, p.from.c_str());
    ::close(p.fd);
    p.fd = -1;
    return;
  }
  std::string bad = checkHandshake(p.hello, info_, -1, /*want_ack=*/false);
  int peer = static_cast<int>(p.hello.src_rank);
  if (bad.empty() && connected(peer)) bad = strFormat("rank %d is already connected", peer);
  if (!bad.empty()) {
    RCOLL_WARN("rank %d: rejected a connection from %s: %s", info_.rank, p.from.c_str(), bad.c_str());
    ::close(p.fd);
    p.fd = -1;
    return;
  }
  Handshake ack = makeHandshake(info_, peer, /*is_ack=*/true);
  std::string why;
  if (!sendAll(p.fd, &ack, sizeof(ack), std::chrono::steady_clock::now() + kHandshakeTimeout, &why)) {
    RCOLL_WARN("rank %d: lost rank %d during the handshake: %s", info_.rank, peer, why.c_str());
    ::close(p.fd);
    p.fd = -1;
    return;
  }
  adopt(peer, p.fd);
  p.fd = -1;
  *accepted_peer = peer;
}

int TcpTransport::accept(Deadline deadline) {
  if (listen_fd_ < 0) throwError(ErrorKind::kGeneric, "accept() after closeListener()");
  std::vector<pollfd> fds;
  for (;;) {
    auto now = std::chrono::steady_clock::now();
    // Drop handshakes that stalled: a slow or silent client must not hold a slot.
    for (auto& p : pending_) {
      if (p->fd >= 0 && now >= p->deadline) {
        RCOLL_WARN("rank %d: dropped a connection from %s that sent no valid handshake within %lld s",
                   info_.rank, p->from.c_str(),
                   static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(kHandshakeTimeout).count()));
        ::close(p->fd);
        p->fd = -1;
      }
    }
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [](const auto& p) { return p->fd < 0; }),
                   pending_.end());
    if (now >= deadline) {
      throwError(ErrorKind::kTimeout,
                 strFormat("rank %d: timed out waiting for peers to connect (%zu of %d connected)", info_.rank,
                           static_cast<size_t>(std::count_if(connections_.begin(), connections_.end(),
                                                             [](const auto& c) { return c != nullptr; })),
                           info_.size - 1));
    }
    fds.clear();
    fds.push_back({listen_fd_, POLLIN, 0});
    Deadline wake = deadline;
    for (auto& p : pending_) {
      fds.push_back({p->fd, POLLIN, 0});
      wake = std::min(wake, p->deadline);
    }
    int rc = ::poll(fds.data(), fds.size(), std::max(1, millisecondsUntil(wake)));
    if (rc < 0 && errno != EINTR) throwError(ErrorKind::kGeneric, "poll(): " + errnoText(errno));
    if (rc <= 0) continue;
    int accepted = -1;
    for (size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0) serviceHandshake(*pending_[i - 1], &accepted);
      if (accepted >= 0) return accepted;
    }
    if (fds[0].revents & POLLIN) {
      int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd >= 0) {
        auto p = std::make_unique<PendingHandshake>();
        p->fd = fd;
        p->from = peerName(fd);
        p->deadline = std::chrono::steady_clock::now() + kHandshakeTimeout;
        pending_.push_back(std::move(p));
        serviceHandshake(*pending_.back(), &accepted);  // the hello often arrives with the SYN's ACK
        if (accepted >= 0) return accepted;
      }
    }
  }
}

TcpTransport::TcpRequest* TcpTransport::newRequest() {
  if (free_requests_.empty()) {
    requests_.push_back(std::make_unique<TcpRequest>());
    free_requests_.push_back(requests_.back().get());
  }
  TcpRequest* r = free_requests_.back();
  free_requests_.pop_back();
  *r = TcpRequest();
  return r;
}

void TcpTransport::release(Request* request) {
  auto* r = static_cast<TcpRequest*>(request);
  // A request still queued on a connection (its op failed or was abandoned)
  // must not be handed out again until it leaves that queue.
  if (r->state == Request::State::kPending) {
    r->released = true;
  } else {
    free_requests_.push_back(r);
  }
}

void TcpTransport::finish(TcpRequest* r, Request::State state, const TransportFailure* why) {
  r->state = state;
  if (why != nullptr) r->why = *why;
  if (r->released) free_requests_.push_back(r);
}

TransportFailure TcpTransport::failure(Request* request) const {
  return static_cast<TcpRequest*>(request)->why;
}

Request* TcpTransport::isend(int peer, const WireHeader& header, const void* data, size_t bytes) {
  TcpRequest* r = newRequest();
  r->is_send = true;
  r->peer = peer;
  r->header = header;
  r->data = static_cast<char*>(const_cast<void*>(data));
  r->bytes = bytes;
  return post(r);
}

Request* TcpTransport::irecv(int peer, const WireHeader& expected, void* data, size_t bytes) {
  TcpRequest* r = newRequest();
  r->peer = peer;
  r->header = expected;
  r->data = static_cast<char*>(data);
  r->bytes = bytes;
  return post(r);
}

Request* TcpTransport::post(TcpRequest* r) {
  // On a connection that already failed the request fails at once, with the
  // connection's cause, so the caller sees why without waiting.
  Connection* c = connected(r->peer) ? connections_[static_cast<size_t>(r->peer)].get() : nullptr;
  if (c == nullptr || c->failed || aborted_) {
    r->state = Request::State::kFailed;
    r->why = c && c->failed ? c->failure
                            : TransportFailure{aborted_ ? ErrorKind::kAborted : ErrorKind::kPeer,
                                               strFormat("no connection to rank %d", r->peer)};
    return r;
  }
  (r->is_send ? c->sends : c->recvs).push_back(r);
  return r;
}

void TcpTransport::failConnection(Connection& c, ErrorKind kind, const std::string& message) {
  // Only a mismatch (or a local abort) leaves the socket usable: it can still
  // carry our abort message to the peer. Everything else means it is gone.
  if (kind != ErrorKind::kMismatch && kind != ErrorKind::kAborted) c.socket_broken = true;
  if (c.failed) return;
  c.failed = true;
  c.failure = {kind, message};
  for (TcpRequest* r : c.sends) finish(r, Request::State::kFailed, &c.failure);
  for (TcpRequest* r : c.recvs) finish(r, Request::State::kFailed, &c.failure);
  c.sends.clear();
  c.recvs.clear();
  RCOLL_INFO("connection to rank %d failed: %s", c.peer, message.c_str());
}

bool TcpTransport::driveSends(Connection& c) {
  bool completed = false;
  while (!c.sends.empty()) {
    TcpRequest* r = c.sends.front();
    constexpr size_t kHeader = sizeof(WireHeader);
    iovec iov[2];
    int n_iov = 0;
    if (r->done < kHeader) {
      iov[n_iov++] = {reinterpret_cast<char*>(&r->header) + r->done, kHeader - r->done};
      if (r->bytes > 0) iov[n_iov++] = {r->data, r->bytes};
    } else {
      iov[n_iov++] = {r->data + (r->done - kHeader), r->bytes - (r->done - kHeader)};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n_iov);
    ssize_t n = ::sendmsg(c.fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      int err = errno;
      // A peer that failed usually said why before closing: read that first, so
      // the error names the original cause rather than a broken pipe.
      driveRecvs(c);
      failConnection(c, ErrorKind::kPeer,
                     strFormat("lost the connection to rank %d while sending: %s (the peer process "
                               "probably exited or was killed)",
                               c.peer, errnoText(err).c_str()));
      return true;
    }
    r->done += static_cast<size_t>(n);
    if (r->done == kHeader + r->bytes) {
      c.sends.pop_front();
      finish(r, Request::State::kDone, nullptr);
      completed = true;
    }
  }
  return completed;
}

bool TcpTransport::driveRecvs(Connection& c) {
  bool completed = false;
  for (;;) {
    // 1. The next header, read even before a receive is posted so that an abort
    //    from the peer is seen at once.
    if (c.in_header_got < sizeof(WireHeader)) {
      ssize_t n = ::recv(c.fd, reinterpret_cast<char*>(&c.in_header) + c.in_header_got,
                         sizeof(WireHeader) - c.in_header_got, MSG_DONTWAIT);
      if (n == 0) {
        failConnection(c, ErrorKind::kPeer,
                       strFormat("rank %d closed its connection (its process exited, crashed or was "
                                 "killed)", c.peer));
        return true;
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return completed;
        failConnection(c, ErrorKind::kPeer, strFormat("lost the connection to rank %d: %s", c.peer,
                                                      errnoText(errno).c_str()));
        return true;
      }
      c.in_header_got += static_cast<size_t>(n);
      c.in_header_checked = false;
      if (c.in_header_got < sizeof(WireHeader)) continue;
    }
    // 2. An abort message: read its text and fail the connection with it.
    if (c.in_header.magic == kWireMagic && c.in_header.kind == static_cast<uint8_t>(OpKind::kAbort)) {
      const uint64_t announced = c.in_header.bytes;  // a copy: the packed field may be misaligned
      size_t want = static_cast<size_t>(std::min<uint64_t>(announced, kMaxAbortMessage));
      char buf[kMaxAbortMessage];
      while (c.abort_text.size() < want) {
        ssize_t n = ::recv(c.fd, buf, want - c.abort_text.size(), MSG_DONTWAIT);
        if (n > 0) {
          c.abort_text.append(buf, static_cast<size_t>(n));
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return completed;
        break;  // closed mid-message: report what we have
      }
      c.socket_broken = true;  // the peer has stopped: no point in answering it
      failConnection(c, errorKindFromWire(c.in_header.error_kind),
                     strFormat("rank %d failed: %s", c.peer, validUtf8(c.abort_text).c_str()));
      return true;
    }
    // 3. A data message: it must match the oldest posted receive.
    if (c.recvs.empty()) return completed;
    TcpRequest* r = c.recvs.front();
    if (!c.in_header_checked) {
      std::string bad = checkHeader(r->header, c.in_header, info_.rank);
      if (bad.empty() && c.in_header.src_rank != static_cast<uint32_t>(c.peer)) {
        bad = strFormat("a message on rank %d's connection claims to come from rank %u", c.peer,
                        c.in_header.src_rank);
      }
      if (!bad.empty()) {
        failConnection(c, ErrorKind::kMismatch, bad);
        return true;
      }
      c.in_header_checked = true;
    }
    while (r->done < r->bytes) {
      ssize_t n = ::recv(c.fd, r->data + r->done, r->bytes - r->done, MSG_DONTWAIT);
      if (n > 0) {
        r->done += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return completed;
      failConnection(c, ErrorKind::kPeer,
                     n == 0 ? strFormat("rank %d closed its connection in the middle of a message (its "
                                        "process exited, crashed or was killed)", c.peer)
                            : strFormat("lost the connection to rank %d: %s", c.peer, errnoText(errno).c_str()));
      return true;
    }
    c.recvs.pop_front();
    c.in_header_got = 0;
    finish(r, Request::State::kDone, nullptr);
    completed = true;
  }
}

bool TcpTransport::wantsRead(const Connection& c) const {
  if (c.failed) return false;
  if (c.in_header_got < sizeof(WireHeader)) return true;
  // The same test as driveRecvs' step 2: a header that only looks like an abort
  // (wrong magic) waits for a receive to fail it; polling for it would spin.
  if (c.in_header.magic == kWireMagic && c.in_header.kind == static_cast<uint8_t>(OpKind::kAbort)) return true;
  return !c.recvs.empty();
}

bool TcpTransport::driveAll() {
  bool completed = false;
  for (auto& c : connections_) {
    if (!c || c->failed) continue;
    if (!c->sends.empty()) completed |= driveSends(*c);
    if (!c->failed && wantsRead(*c)) completed |= driveRecvs(*c);
  }
  return completed;
}

void TcpTransport::progress(std::chrono::milliseconds timeout) {
  Deadline deadline = std::chrono::steady_clock::now() + timeout;
  std::vector<pollfd> fds;
  for (;;) {
    if (driveAll()) return;
    int wait_ms = millisecondsUntil(deadline);
    if (wait_ms <= 0) return;
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    for (auto& c : connections_) {
      if (!c || c->failed) continue;
      short events = 0;
      if (!c->sends.empty()) events |= POLLOUT;
      if (wantsRead(*c)) events |= POLLIN;
      if (events != 0) fds.push_back({c->fd, events, 0});
    }
    int rc = ::poll(fds.data(), fds.size(), wait_ms);
    if (rc < 0 && errno != EINTR) throwError(ErrorKind::kGeneric, "poll(): " + errnoText(errno));
    if (rc > 0 && (fds[0].revents & POLLIN)) {
      uint64_t drained = 0;
      ssize_t ignored = ::read(wake_fd_, &drained, sizeof(drained));
      (void)ignored;
      return;  // interrupted: the caller checks why
    }
  }
}

void TcpTransport::interrupt() {
  uint64_t one = 1;
  ssize_t ignored = ::write(wake_fd_, &one, sizeof(one));
  (void)ignored;
}

bool TcpTransport::finishPartialSend(Connection& c, Deadline deadline) {
  if (c.sends.empty() || c.sends.front()->done == 0) return true;
  TcpRequest* r = c.sends.front();
  constexpr size_t kHeader = sizeof(WireHeader);
  std::string why;
  if (r->done < kHeader &&
      !sendAll(c.fd, reinterpret_cast<char*>(&r->header) + r->done, kHeader - r->done, deadline, &why)) {
    return false;
  }
  size_t sent = r->done > kHeader ? r->done - kHeader : 0;
  if (!sendAll(c.fd, r->data + sent, r->bytes - sent, deadline, &why)) return false;
  r->done = kHeader + r->bytes;
  c.sends.pop_front();
  finish(r, Request::State::kDone, nullptr);
  return true;
}

void TcpTransport::abortPeers(ErrorKind kind, const std::string& message) {
  if (aborted_) return;
  aborted_ = true;
  std::string text = message.substr(0, kMaxAbortMessage);
  // Bounded: a peer that stopped reading must not hold this rank's failure up.
  Deadline deadline = std::chrono::steady_clock::now() + kAbortLinger;
  for (auto& c : connections_) {
    if (!c) continue;
    // The abort must start at a message boundary, or the peer would read it as
    // payload. A segment already half on the wire is finished first: its buffer
    // is still alive here, because the op has not been failed yet.
    if (!c->socket_broken && finishPartialSend(*c, deadline)) {
      WireHeader h{};
      h.magic = kWireMagic;
      h.version = kWireVersion;
      h.kind = static_cast<uint8_t>(OpKind::kAbort);
      h.error_kind = static_cast<uint8_t>(kind);
      h.src_rank = static_cast<uint32_t>(info_.rank);
      h.comm_id = info_.comm_id;
      h.bytes = text.size();
      std::string why;
      if (sendAll(c->fd, &h, sizeof(h), deadline, &why)) sendAll(c->fd, text.data(), text.size(), deadline, &why);
    }
    // FIN after the abort text; the socket stays open (and unread data with it)
    // until the communicator is destroyed, so the peer reads the reason first.
    ::shutdown(c->fd, SHUT_WR);
    c->socket_broken = true;
    failConnection(*c, ErrorKind::kAborted, "the communicator was aborted: " + message);
  }
}

}  // namespace rcoll
