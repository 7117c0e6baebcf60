#include "peer_listener.h"

#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "log.h"

namespace rcoll {

namespace {

constexpr uint32_t kHandshakeMagic = 0x53484352;  // "RCHS"
constexpr auto kHandshakeTimeout = std::chrono::seconds(10);

// A dialer's hello, the acceptor's ack, or a lower rank's note asking the
// acceptor to dial it (a PendingDial note).
enum HandshakeKind : uint16_t { kHello = 0, kAck = 1, kDialMe = 2 };

#pragma pack(push, 1)
struct Handshake {
  uint32_t magic;
  uint16_t version;
  uint16_t kind;  // HandshakeKind
  uint32_t src_rank;
  uint32_t dst_rank;
  uint64_t comm_id;
  uint8_t token[16];
  uint16_t lane;   // which of the pair's sockets this is
  uint16_t lanes;  // sockets per pair: the dialer's count in a hello, the acceptor's in an ack
};
#pragma pack(pop)
static_assert(sizeof(Handshake) == 44, "the handshake is 44 bytes");
constexpr int kMaxLanes = 64;

Handshake makeHandshake(const ConnectInfo& info, int dst_rank, HandshakeKind kind, int lane, int lanes) {
  Handshake h{};
  h.magic = kHandshakeMagic;
  h.version = kWireVersion;
  h.kind = kind;
  h.src_rank = static_cast<uint32_t>(info.rank);
  h.dst_rank = static_cast<uint32_t>(dst_rank);
  h.comm_id = info.comm_id;
  std::memcpy(h.token, info.token, sizeof(h.token));
  h.lane = static_cast<uint16_t>(lane);
  h.lanes = static_cast<uint16_t>(lanes);
  return h;
}

// Compares tokens in constant time, so that a scanner learns nothing from timing.
bool sameToken(const uint8_t* a, const uint8_t* b) {
  uint8_t diff = 0;
  for (size_t i = 0; i < 16; ++i) diff |= static_cast<uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

// "" if `h` is a valid handshake of our communicator from `expected_src` to
// us. -1: any rank above ours for a hello (the higher rank dials), any rank
// below for a note asking us to dial; an ack comes from the rank we dialed.
std::string checkHandshake(const Handshake& h, const ConnectInfo& info, int expected_src, bool want_ack) {
  if (h.magic != kHandshakeMagic) return "not an rcoll handshake";
  if (h.version != kWireVersion) {
    return strFormat("rcoll wire version %u, this rank speaks %u", h.version, kWireVersion);
  }
  const bool dial_me = !want_ack && h.kind == kDialMe;
  if (!dial_me && h.kind != (want_ack ? kAck : kHello)) return "unexpected handshake direction";
  if (h.comm_id != info.comm_id || !sameToken(h.token, info.token)) {
    return "wrong job token (a process of another job or communicator?)";
  }
  if (static_cast<int>(h.dst_rank) != info.rank) return "addressed to another rank";
  int src = static_cast<int>(h.src_rank);
  const bool src_ok = expected_src >= 0 ? src == expected_src
                      : dial_me         ? src >= 0 && src < info.rank
                                        : src > info.rank && src < info.size;
  if (!src_ok) {
    return strFormat("claims to be rank %d", src);
  }
  if (h.lanes == 0 || h.lanes > kMaxLanes || h.lane >= h.lanes) {
    return strFormat("names socket %u of %u", h.lane, h.lanes);
  }
  return "";
}

// The error for a peer of this job that opens another number of sockets per
// pair: the same words on both ends.
std::string lanesMismatch(const ConnectInfo& info, int peer, int peer_lanes, int lanes) {
  return strFormat(
      "rank %d: rank %d opens %d TCP socket(s) per peer while this rank opens %d: set "
      "RCOLL_SOCKETS_PER_PEER to the same value on every rank",
      info.rank, peer, peer_lanes, lanes);
}

// A peer whose listener refuses after set-up: every rank listens from before
// it publishes its address until its communicator ends.
std::string goneText(const ConnectInfo& info, int peer, const std::string& address) {
  return strFormat(
      "rank %d: rank %d refused the connection at %s: its process exited, or its communicator was shut down or "
      "failed",
      info.rank, peer, address.c_str());
}

// Where a peer's published "host:port" points; false when it cannot be used.
bool resolvePeerAddress(const std::string& address, sockaddr_storage* addr, unsigned* len) {
  std::string host;
  int port = 0;
  return splitHostPort(address, &host, &port) && resolveHost(host, port, addr, len);
}

std::string unusableAddress(const ConnectInfo& info, int peer, const std::string& address) {
  return strFormat("rank %d: rank %d published an unusable address '%s'", info.rank, peer, address.c_str());
}
}  // namespace

// Python cannot raise an exception whose message does not decode (it raised
// UnicodeDecodeError instead of PeerError), so a peer's text is repaired here.
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
  return value == static_cast<uint8_t>(ErrorKind::kMismatch) ? ErrorKind::kMismatch : ErrorKind::kPeer;
}

std::string truncateUtf8(const std::string& text, size_t max_bytes) {
  if (text.size() <= max_bytes) return text;
  size_t end = max_bytes;
  // Step back over continuation bytes (10xxxxxx) to the start of the cut character.
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;
  return text.substr(0, end);
}

WireHeader makeAbortHeader(const ConnectInfo& info, ErrorKind kind, size_t text_bytes) {
  WireHeader h{};
  h.magic = kWireMagic;
  h.version = kWireVersion;
  h.kind = static_cast<uint8_t>(OpKind::kAbort);
  h.error_kind = static_cast<uint8_t>(kind);
  h.src_rank = static_cast<uint32_t>(info.rank);
  h.comm_id = info.comm_id;
  h.bytes = text_bytes;
  return h;
}

struct PeerListener::PendingHandshake {
  int fd = -1;
  std::string from;
  Handshake hello{};
  size_t got = 0;
  Deadline deadline;
};

PeerListener::PeerListener(const ConnectInfo& info, const std::string& bind_host, const SocketOptions& options,
                           int lanes)
    : info_(info), options_(options), lanes_(lanes) {
  // Several addresses (this rank's data interfaces, net_interfaces.h): the
  // wildcard address takes them all; the peers are told each one.
  const std::vector<std::string> hosts = splitCommas(bind_host);
  sockaddr_storage addr{};
  unsigned len = 0;
  const std::string why = resolveSocketAddress(hosts.size() > 1 ? "" : hosts[0], 0, /*passive=*/true, &addr, &len);
  if (!why.empty()) {
    throwError(ErrorKind::kConfig, strFormat("rank %d: cannot resolve the data-socket address '%s': %s", info.rank,
                                             bind_host.c_str(), why.c_str()));
  }
  listen_fd_ = listenSocket(addr, len, std::max(128, info.size));
  if (listen_fd_ < 0) {
    throwError(ErrorKind::kConfig, strFormat("rank %d: cannot listen on %s: %s (set RCOLL_SOCKET_IFNAME "
                                             "to an interface with a usable address)",
                                             info.rank, bind_host.c_str(), errnoText(errno).c_str()));
  }
  sockaddr_storage bound{};
  socklen_t bound_len = sizeof(bound);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &bound_len);
  const int port = portOf(bound);
  for (const std::string& host : hosts) address_ += (address_.empty() ? "" : ",") + joinHostPort(host, port);
}

PeerListener::~PeerListener() { close(); }

void PeerListener::close() {
  for (auto& p : pending_) {
    if (p->fd >= 0) ::close(p->fd);
  }
  pending_.clear();
  if (listen_fd_ >= 0) ::close(listen_fd_);
  listen_fd_ = -1;
}

// Reads what has arrived of a handshake; true once it is complete and valid
// (the peer is acknowledged and *peer set). A bad or dead one closes its fd.
bool PeerListener::serviceHandshake(PendingHandshake& p, const std::vector<bool>& connected, int* peer_out) {
  auto* buf = reinterpret_cast<char*>(&p.hello);
  while (p.got < sizeof(p.hello)) {
    ssize_t n = ::recv(p.fd, buf + p.got, sizeof(p.hello) - p.got, MSG_DONTWAIT);
    if (n > 0) {
      p.got += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;  // wait for more
    RCOLL_WARN("rank %d: dropped a connection from %s that closed before finishing the rcoll handshake", info_.rank,
               p.from.c_str());
    ::close(p.fd);
    p.fd = -1;
    return false;
  }
  std::string bad = checkHandshake(p.hello, info_, -1, /*want_ack=*/false);
  const int peer = static_cast<int>(p.hello.src_rank);
  if (bad.empty() && p.hello.kind == kDialMe) {  // a note, not a connection: nothing to answer
    RCOLL_TRACE("rank %d: rank %d asks to be dialed", info_.rank, peer);
    dial_requests_.push_back(peer);
    ::close(p.fd);
    p.fd = -1;
    return false;
  }
  const int lane = p.hello.lane;
  const bool lanes_differ = bad.empty() && p.hello.lanes != lanes_;
  if (bad.empty() && !lanes_differ && connected[static_cast<size_t>(peer * lanes_ + lane)]) {
    bad = lanes_ > 1 ? strFormat("socket %d of rank %d is already connected", lane, peer)
                     : strFormat("rank %d is already connected", peer);
  }
  if (!bad.empty()) {
    RCOLL_WARN("rank %d: rejected a connection from %s: %s", info_.rank, p.from.c_str(), bad.c_str());
    ::close(p.fd);
    p.fd = -1;
    return false;
  }
  // A rank of this job (it knows the token) that counts sockets differently:
  // the ack carries our count so that it fails at once too, with the same words.
  Handshake ack = makeHandshake(info_, peer, kAck, lane, lanes_);
  std::string why;
  if (lanes_differ) {
    sendAll(p.fd, &ack, sizeof(ack), std::chrono::steady_clock::now() + kHandshakeTimeout, &why);
    ::close(p.fd);
    p.fd = -1;
    throwError(ErrorKind::kConfig, lanesMismatch(info_, peer, p.hello.lanes, lanes_));
  }
  if (!sendAll(p.fd, &ack, sizeof(ack), std::chrono::steady_clock::now() + kHandshakeTimeout, &why)) {
    RCOLL_WARN("rank %d: lost rank %d during the handshake: %s", info_.rank, peer, why.c_str());
    ::close(p.fd);
    p.fd = -1;
    return false;
  }
  *peer_out = peer;
  return true;
}

// One pass: drops handshakes that stalled, reads what has arrived of the
// others and takes new connections, without blocking.
int PeerListener::step(const std::vector<bool>& connected, int* fd_out, int* lane_out) {
  auto take = [&](PendingHandshake& p, int peer) {
    setNonBlocking(p.fd, false);
    *fd_out = p.fd;
    if (lane_out != nullptr) *lane_out = p.hello.lane;
    p.fd = -1;
    return peer;
  };
  const auto now = std::chrono::steady_clock::now();
  // A slow or silent client must not hold a slot.
  for (auto& p : pending_) {
    if (p->fd >= 0 && now >= p->deadline) {
      RCOLL_WARN("rank %d: dropped a connection from %s that sent no valid handshake within %lld s", info_.rank,
                 p->from.c_str(),
                 static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(kHandshakeTimeout).count()));
      ::close(p->fd);
      p->fd = -1;
    }
  }
  int peer = -1;
  for (auto& p : pending_) {
    if (p->fd >= 0 && serviceHandshake(*p, connected, &peer)) return take(*p, peer);
  }
  pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [](const auto& p) { return p->fd < 0; }),
                 pending_.end());
  for (;;) {
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR) continue;
      if (errno == EMFILE || errno == ENFILE) {
        // The connection stays queued and the listener readable: leave it out
        // of the poll a while rather than spin until a descriptor is free.
        RCOLL_WARN("rank %d: cannot accept a peer: %s (raise `ulimit -n`)", info_.rank, errnoText(errno).c_str());
        resting_until_ = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
      }
      return -1;  // EAGAIN: nobody else is waiting; anything else is the next pass's
    }
    applySocketOptions(fd, options_);
    auto p = std::make_unique<PendingHandshake>();
    p->fd = fd;
    p->from = peerName(fd);
    p->deadline = std::chrono::steady_clock::now() + kHandshakeTimeout;
    pending_.push_back(std::move(p));
    // The hello often arrives with the SYN's ACK.
    if (serviceHandshake(*pending_.back(), connected, &peer)) return take(*pending_.back(), peer);
  }
}

int PeerListener::accept(Deadline deadline, const std::vector<bool>& connected, int* fd_out, int* lane_out) {
  if (listen_fd_ < 0) throwError(ErrorKind::kGeneric, "accept() after the listener was closed");
  std::vector<pollfd> fds;
  for (;;) {
    const int peer = step(connected, fd_out, lane_out);
    if (peer >= 0) return peer;
    if (std::chrono::steady_clock::now() >= deadline) {
      size_t done = 0;  // peers with every lane
      for (size_t i = 0; i + static_cast<size_t>(lanes_) <= connected.size(); i += static_cast<size_t>(lanes_)) {
        done += std::all_of(connected.begin() + static_cast<long>(i), connected.begin() + static_cast<long>(i) + lanes_,
                            [](bool b) { return b; });
      }
      throwError(ErrorKind::kTimeout, strFormat("rank %d: timed out waiting for peers to connect (%zu of %d connected)",
                                                info_.rank, done, info_.size - 1));
    }
    fds.clear();
    appendPollFds(&fds);
    Deadline wake = deadline;
    for (auto& p : pending_) wake = std::min(wake, p->deadline);
    int rc = ::poll(fds.data(), fds.size(), std::max(1, millisecondsUntil(wake)));
    if (rc < 0 && errno != EINTR) throwError(ErrorKind::kGeneric, "poll(): " + errnoText(errno));
  }
}

int PeerListener::acceptNow(const std::vector<bool>& connected, int* fd_out, int* lane_out) {
  if (listen_fd_ < 0) return -1;
  try {
    return step(connected, fd_out, lane_out);
  } catch (const RcollError& e) {  // a rank that counts sockets differently: it fails itself, from the ack
    RCOLL_WARN("%s", e.what());
    pending_.erase(std::remove_if(pending_.begin(), pending_.end(), [](const auto& p) { return p->fd < 0; }),
                   pending_.end());
    return -1;
  }
}

void PeerListener::appendPollFds(std::vector<pollfd>* fds) const {
  if (listen_fd_ < 0) return;
  if (std::chrono::steady_clock::now() >= resting_until_) fds->push_back({listen_fd_, POLLIN, 0});
  for (const auto& p : pending_) {
    if (p->fd >= 0) fds->push_back({p->fd, POLLIN, 0});
  }
}

std::vector<int> PeerListener::takeDialRequests() {
  std::vector<int> requests;
  requests.swap(dial_requests_);
  return requests;
}

int dialPeer(const ConnectInfo& info, int peer, const std::string& address, Deadline deadline,
             const SocketOptions& options, int lane, int lanes) {
  sockaddr_storage addr{};
  unsigned len = 0;
  if (!resolvePeerAddress(address, &addr, &len)) throwError(ErrorKind::kConfig, unusableAddress(info, peer, address));
  std::string why = "timed out";
  while (std::chrono::steady_clock::now() < deadline) {
    int fd = ::socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) throwError(ErrorKind::kPeer, "socket(): " + errnoText(errno));
    applySocketOptions(fd, options);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
      why = errnoText(errno);
      ::close(fd);
      ::usleep(50 * 1000);  // the peer listens before it publishes; this is only a transient refusal
      continue;
    }
    Handshake hello = makeHandshake(info, peer, kHello, lane, lanes);
    Handshake ack{};
    if (sendAll(fd, &hello, sizeof(hello), deadline, &why) && recvAll(fd, &ack, sizeof(ack), deadline, &why)) {
      std::string bad = checkHandshake(ack, info, peer, /*want_ack=*/true);
      if (bad.empty() && ack.lane != lane) bad = strFormat("acknowledged socket %u instead of %d", ack.lane, lane);
      if (bad.empty() && ack.lanes != lanes) {
        ::close(fd);
        throwError(ErrorKind::kConfig, lanesMismatch(info, peer, ack.lanes, lanes));
      }
      if (bad.empty()) return fd;
      ::close(fd);
      throwError(ErrorKind::kPeer, strFormat("rank %d: the process at %s is not rank %d of this job: %s", info.rank,
                                             address.c_str(), peer, bad.c_str()));
    }
    ::close(fd);
    // The peer dropped us (for example it was still busy); retry until the deadline.
    ::usleep(50 * 1000);
  }
  throwError(ErrorKind::kTimeout, strFormat("rank %d: could not connect to rank %d at %s: %s", info.rank, peer,
                                            address.c_str(), why.c_str()));
}

PendingDial::PendingDial(const ConnectInfo& info, int peer, const std::string& address, const SocketOptions& options,
                         int lane, int lanes, bool note, Deadline deadline)
    : info_(info), peer_(peer), address_(address), lane_(lane), lanes_(lanes), note_(note), deadline_(deadline) {
  sockaddr_storage addr{};
  unsigned len = 0;
  if (!resolvePeerAddress(address, &addr, &len)) {
    fail(ErrorKind::kConfig, unusableAddress(info, peer, address));
    return;
  }
  fd_ = ::socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd_ < 0) {
    fail(ErrorKind::kGeneric, strFormat("rank %d: socket(): %s", info.rank, errnoText(errno).c_str()));
    return;
  }
  applySocketOptions(fd_, options);
  const Handshake hello = makeHandshake(info, peer, note ? kDialMe : kHello, lane, lanes);
  const auto* bytes = reinterpret_cast<const unsigned char*>(&hello);
  out_.assign(bytes, bytes + sizeof(hello));
  in_.resize(sizeof(Handshake));
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&addr), len) == 0) {
    phase_ = Phase::kSending;
  } else if (errno != EINPROGRESS) {
    const int err = errno;
    refused_ = err == ECONNREFUSED;
    fail(ErrorKind::kPeer, err == ECONNREFUSED ? goneText(info, peer, address)
                                               : strFormat("rank %d: could not connect to rank %d at %s: %s", info.rank,
                                                           peer, address.c_str(), errnoText(err).c_str()));
  }
}

PendingDial::~PendingDial() {
  if (fd_ >= 0) ::close(fd_);
}

void PendingDial::fail(ErrorKind kind, const std::string& message) {
  state_ = State::kFailed;
  failure_ = {kind, message};
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

pollfd PendingDial::pollFd() const {
  return {fd_, static_cast<short>(phase_ == Phase::kReceiving ? POLLIN : POLLOUT), 0};
}

int PendingDial::takeFd() {
  const int fd = fd_;
  fd_ = -1;
  setNonBlocking(fd, false);
  return fd;
}

PendingDial::State PendingDial::step(short revents) {
  if (state_ != State::kRunning) return state_;
  if (std::chrono::steady_clock::now() >= deadline_) {
    fail(ErrorKind::kTimeout, strFormat("rank %d: could not %s rank %d at %s: no answer in time", info_.rank,
                                        note_ ? "reach" : "connect to", peer_, address_.c_str()));
    return state_;
  }
  if (phase_ == Phase::kConnecting) {
    if (revents == 0) return state_;
    int err = 0;
    socklen_t err_len = sizeof(err);
    getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &err_len);
    if (err != 0) {
      refused_ = err == ECONNREFUSED;
      fail(ErrorKind::kPeer, err == ECONNREFUSED
                                 ? goneText(info_, peer_, address_)
                                 : strFormat("rank %d: could not connect to rank %d at %s: %s", info_.rank, peer_,
                                             address_.c_str(), errnoText(err).c_str()));
      return state_;
    }
    phase_ = Phase::kSending;
  }
  while (phase_ == Phase::kSending) {
    const ssize_t n = ::send(fd_, out_.data() + sent_, out_.size() - sent_, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return state_;
    if (n < 0) {
      fail(ErrorKind::kPeer,
           strFormat("rank %d: lost rank %d during the handshake: %s", info_.rank, peer_, errnoText(errno).c_str()));
      return state_;
    }
    sent_ += static_cast<size_t>(n);
    if (sent_ == out_.size()) {
      if (note_) {  // nothing comes back: the peer answers by dialing
        ::close(fd_);
        fd_ = -1;
        state_ = State::kDone;
        return state_;
      }
      phase_ = Phase::kReceiving;
    }
  }
  while (got_ < in_.size()) {
    const ssize_t n = ::recv(fd_, in_.data() + got_, in_.size() - got_, MSG_DONTWAIT);
    if (n > 0) {
      got_ += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return state_;
    fail(ErrorKind::kPeer,
         n == 0 ? strFormat("rank %d: rank %d at %s closed the connection during the handshake (it refused this rank, "
                            "or it is shutting down)",
                            info_.rank, peer_, address_.c_str())
                : strFormat("rank %d: lost rank %d during the handshake: %s", info_.rank, peer_,
                            errnoText(errno).c_str()));
    return state_;
  }
  Handshake ack{};
  std::memcpy(&ack, in_.data(), sizeof(ack));
  std::string bad = checkHandshake(ack, info_, peer_, /*want_ack=*/true);
  if (bad.empty() && ack.lane != lane_) bad = strFormat("acknowledged socket %u instead of %d", ack.lane, lane_);
  if (bad.empty() && ack.lanes != lanes_) {
    fail(ErrorKind::kConfig, lanesMismatch(info_, peer_, ack.lanes, lanes_));
    return state_;
  }
  if (!bad.empty()) {
    fail(ErrorKind::kPeer, strFormat("rank %d: the process at %s is not rank %d of this job: %s", info_.rank,
                                     address_.c_str(), peer_, bad.c_str()));
    return state_;
  }
  state_ = State::kDone;
  return state_;
}

}  // namespace rcoll
