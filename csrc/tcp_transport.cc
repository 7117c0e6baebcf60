#include "tcp_transport.h"

#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <linux/sockios.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "lane_control.h"
#include "lane_probe.h"
#include "net_interfaces.h"
#include "tcp_connection.h"
#include "log.h"
#include "peer_listener.h"

namespace rcoll {

namespace {

constexpr size_t kMaxAbortMessage = 4096;
constexpr auto kAbortLinger = std::chrono::seconds(2);

std::string closedText(int peer) {
  return strFormat("rank %d closed its connection (its process exited, crashed or was killed)", peer);
}

}  // namespace

TcpTransport::TcpTransport(const ConnectInfo& info, const Config& config, const std::string& bind_host)
    : info_(info),
      config_(config),
      lanes_(std::max(1, config.sockets_per_peer)),
      listener_(std::make_unique<PeerListener>(info, bind_host, config.socketOptions(), lanes_)),
      connections_(static_cast<size_t>(info.size) * static_cast<size_t>(lanes_)),
      schedules_(static_cast<size_t>(info.size), Lanes{LaneSchedule(lanes_), LaneSchedule(lanes_)}),
      networks_(std::max(1, config.socket_networks)),
      numbered_(networks_ > 1 && lanes_ > 1),
      pairs_(numbered_ ? static_cast<size_t>(info.size) : 0),
      meter_(info.size),
      ack_watch_(config.peer_timeout) {
  listen_address_ = listener_->address();
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  RCOLL_INFO("tcp transport listening on %s (%d socket(s) per peer)", listen_address_.c_str(), lanes_);
}

TcpTransport::~TcpTransport() {
  closeListener();
  for (auto& c : connections_) {
    if (c && c->fd >= 0) ::close(c->fd);
  }
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void TcpTransport::closeListener() {
  if (listener_) listener_->close();
}

// A peer is connected once every lane to it is.
bool TcpTransport::connected(int peer) const {
  if (peer < 0 || peer >= info_.size) return false;
  for (int k = 0; k < lanes_; ++k) {
    if (laneTo(peer, k) == nullptr) return false;
  }
  return true;
}

void TcpTransport::adopt(int peer, int lane, int fd) {
  setNonBlocking(fd, true);  // dialPeer() and the listener applied the socket options already
  // From here on ack_watch_ judges what the peer's host acknowledges: the
  // kernel's timer would fail the socket of a peer that is only slow to read.
  if (ack_watch_.enabled()) leaveAcksToOwner(fd);
  auto conn = std::make_unique<Connection>();
  conn->fd = fd;
  conn->peer = peer;
  conn->lane = lane;
  if (numbered_) conn->route = socketRoute(fd);
  connections_[static_cast<size_t>(peer * lanes_ + lane)] = std::move(conn);
  RCOLL_TRACE("connected to rank %d, socket %d of %d (%s)", peer, lane, lanes_, peerName(fd).c_str());
}

// Test hook (see the header): adopt() behind an argument check.
void TcpTransport::adoptConnectedSocket(int peer, int fd) {
  if (peer < 0 || peer >= info_.size || peer == info_.rank || connected(peer)) {
    throwError(ErrorKind::kInvalidArgument,
               strFormat("rank %d: adoptConnectedSocket(%d): not a free peer slot", info_.rank, peer));
  }
  int k = 0;
  while (laneTo(peer, k) != nullptr) ++k;
  applySocketOptions(fd, config_.socketOptions());  // the socket came from elsewhere
  adopt(peer, k, fd);
}

void TcpTransport::connect(int peer, const std::string& address, Deadline deadline) {
  for (int k = 0; k < lanes_; ++k) {
    adopt(peer, k, dialPeer(info_, peer, laneAddress(address, k), deadline, config_.socketOptions(), k, lanes_));
  }
  weighLanes(peer, /*dialer=*/true, deadline);
}

// Peers connected at set-up over several networks: both ends measure the
// lanes once, before the pair's first message. Peers connected on first use
// keep equal shares at both ends.
void TcpTransport::weighLanes(int peer, bool dialer, Deadline deadline) {
  if (networks_ < 2) return;
  std::vector<int> fds;
  for (int k = 0; k < lanes_; ++k) fds.push_back(laneTo(peer, k)->fd);
  std::vector<double> rates;
  const std::vector<int> weights = dialer ? probeLanesAsDialer(fds, deadline, info_.rank, peer)
                                          : probeLanesAsAcceptor(fds, deadline, info_.rank, peer, &rates);
  Lanes& lanes = schedules_[static_cast<size_t>(peer)];
  lanes.sends.setWeights(weights);
  lanes.recvs.setWeights(weights);
  RCOLL_INFO("rank %d: the sockets to rank %d take shares %s", info_.rank, peer,
             describeShares(weights, rates).c_str());
}

// Lanes of different peers may come in any order: returns the first peer
// whose lanes are all connected.
int TcpTransport::accept(Deadline deadline) {
  if (on_demand_.started()) {
    auto adopt = [this](OnDemandPeers<TcpRequest>::Outcome& o) {
      bool failed = false;
      adoptOutcome(o, &failed);
    };
    const int peer = on_demand_.acceptSetupPeer(*this, info_, deadline, adopt);
    weighLanes(peer, /*dialer=*/false, deadline);
    return peer;
  }
  for (;;) {
    std::vector<bool> taken(connections_.size());
    for (size_t i = 0; i < taken.size(); ++i) {
      taken[i] = connections_[i] != nullptr || !serves(static_cast<int>(i / static_cast<size_t>(lanes_)));
    }
    int fd = -1;
    int k = 0;
    int peer = listener_->accept(deadline, taken, &fd, &k);
    adopt(peer, k, fd);
    if (connected(peer)) {
      weighLanes(peer, /*dialer=*/false, deadline);
      return peer;
    }
  }
}

void TcpTransport::release(Request* request) { requests_.release(request); }

void TcpTransport::finish(TcpRequest* r, Request::State state, const TransportFailure* why) {
  requests_.finish(r, state, why);
}

TransportFailure TcpTransport::failure(Request* request) const { return requests_.failure(request); }

Request* TcpTransport::isend(int peer, const WireHeader& header, const void* data, size_t bytes) {
  return post(requests_.take(true, peer, header, data, bytes));
}

Request* TcpTransport::irecv(int peer, const WireHeader& expected, void* data, size_t bytes) {
  return post(requests_.take(false, peer, expected, data, bytes));
}

// The header is read as soon as it arrives (driveRecvs, step 1), posted
// receive or not; the next receive will read the lane its number picks.
bool TcpTransport::peekIncoming(int peer, WireHeader* header) {
  if (peer < 0 || peer >= info_.size || peer == info_.rank) return false;
  if (numbered_ && connected(peer)) return peekNumbered(peer, header);
  const Connection* c = laneTo(peer, schedules_[static_cast<size_t>(peer)].recvs.peek());
  if (c == nullptr || c->failed || c->in_header_got < sizeof(WireHeader)) return false;
  *header = c->in_header;
  return true;
}

void TcpTransport::connectOnDemand(const std::vector<std::string>& addresses) {
  if (std::all_of(addresses.begin(), addresses.end(), [](const std::string& a) { return a.empty(); })) return;
  on_demand_.start(std::make_unique<OnDemandConnector>(info_, std::move(listener_), addresses, config_.socketOptions(),
                                                       lanes_, config_.connect_timeout),
                   info_.size);
}

bool TcpTransport::adoptOnDemand() {
  bool failed = false;
  for (OnDemandPeers<TcpRequest>::Outcome& o : on_demand_.take(/*in_setup=*/false)) adoptOutcome(o, &failed);
  return failed;
}

void TcpTransport::adoptOutcome(OnDemandPeers<TcpRequest>::Outcome& o, bool* failed) {
  if (o.fds.empty()) {
    const std::deque<TcpRequest*> waiting = on_demand_.setUnreachable(o.peer, o.failure);
    if (o.failure.kind == ErrorKind::kPeer || o.failure.kind == ErrorKind::kTimeout) markLost(o.peer);
    for (TcpRequest* r : waiting) finish(r, Request::State::kFailed, &o.failure);
    *failed |= !waiting.empty();
    return;
  }
  if (aborted_ || connected(o.peer)) {  // abortPeers() failed what waited
    for (int fd : o.fds) ::close(fd);
    return;
  }
  for (int k = 0; k < lanes_; ++k) adopt(o.peer, k, o.fds[static_cast<size_t>(k)]);
  for (TcpRequest* r : on_demand_.release(o.peer)) post(r);
}

Request* TcpTransport::post(TcpRequest* r) {
  // A peer connected on demand: its first message asks the connector for it;
  // until it is connected, its messages wait there in order.
  if (!aborted_ && on_demand_.hold(r, connected(r->peer))) return r;
  // On a connection that already failed the request fails at once, with the
  // connection's cause, so the caller sees why without waiting.
  Connection* c = nullptr;
  if (connected(r->peer)) {
    if (numbered_ && !aborted_ && (!laneTo(r->peer, 0)->failed || pairs_[static_cast<size_t>(r->peer)].stopped)) {
      postNumbered(r, laneTo(r->peer, 0));
      return r;
    }
    Lanes& lanes = schedules_[static_cast<size_t>(r->peer)];
    c = laneTo(r->peer, (r->is_send ? lanes.sends : lanes.recvs).next());
  }
  if (c != nullptr && c->closed_by_peer && !r->is_send) failConnection(*c, ErrorKind::kPeer, closedText(c->peer));
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

void TcpTransport::failConnection(Connection& c, ErrorKind kind_seen, const std::string& message_seen,
                                  bool peer_reported) {
  // A peer that sent its abort on another socket (peerStopped): that is why.
  const std::optional<TransportFailure>* stopped = numbered_ ? &pairs_[static_cast<size_t>(c.peer)].stopped : nullptr;
  const bool told = stopped != nullptr && stopped->has_value();
  const ErrorKind kind = told ? (*stopped)->kind : kind_seen;
  const std::string& message = told ? (*stopped)->message : message_seen;
  peer_reported = peer_reported || told;
  // Only a mismatch (or a local abort) leaves the socket usable: it can still
  // carry our abort message to the peer. Everything else means it is gone.
  if (kind != ErrorKind::kMismatch && kind != ErrorKind::kAborted) c.socket_broken = true;
  if (c.failed) return;
  if (kind == ErrorKind::kPeer && !peer_reported) markLost(c.peer);
  // The lanes to a peer carry one ordered stream between them: when one fails,
  // they all do, with its cause (the others stay usable for our abort message).
  const TransportFailure failure{kind, message};
  for (int k = 0; k < lanes_; ++k) {
    if (Connection* l = laneTo(c.peer, k)) failLane(*l, failure);
  }
  if (numbered_) failNumbered(c.peer, failure);
  RCOLL_INFO("connection to rank %d failed: %s", c.peer, message.c_str());
}

void TcpTransport::failLane(Connection& c, const TransportFailure& failure) {
  if (c.failed) return;
  c.failed = true;
  stopMetering(c);
  c.failure = failure;
  if (!c.sends.empty() && c.sends.front()->done > 0) c.unfinished = *c.sends.front();
  for (TcpRequest* r : c.sends) finish(r, Request::State::kFailed, &c.failure);
  for (TcpRequest* r : c.recvs) finish(r, Request::State::kFailed, &c.failure);
  for (TcpRequest* r : c.unacked) finish(r, Request::State::kFailed, &c.failure);
  if (c.current != nullptr) finish(c.current, Request::State::kFailed, &c.failure);
  c.sends.clear();
  c.recvs.clear();
  c.unacked.clear();
  c.current = nullptr;
}

bool TcpTransport::driveSends(Connection& c) {
  bool completed = false;
  for (;;) {
    // Control frames go between messages (several networks).
    if (c.hasControl() && (c.sends.empty() || c.sends.front()->done == 0) && !writeControl(c, &completed)) break;
    if (c.sends.empty() || c.failed || c.down) break;
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
      // the error names the original cause rather than a broken pipe. (Not
      // where the link failed: that socket is closed now, and would read as
      // closed by the peer.)
      if (!numbered_ || !isLinkFailure(err)) driveRecvs(c);
      loseSocket(c, err,
                 strFormat("lost the connection to rank %d while sending: %s (the peer process "
                           "probably exited or was killed)",
                           c.peer, errnoText(err).c_str()));
      return true;
    }
    r->done += static_cast<size_t>(n);
    if (r->done == kHeader + r->bytes) {
      c.sends.pop_front();
      if (numbered_) {
        sentWhole(c, r);  // done once the peer acknowledges it
        continue;
      }
      finish(r, Request::State::kDone, nullptr);
      completed = true;
    }
  }
  return completed;
}

// Reads up to `want` bytes of the stream into `dst`, recv()'s way (> 0 bytes,
// 0 at EOF, -1 with errno). Small reads go through the inbox (kInboxBytes),
// which takes as much as the socket holds; a large remainder of a payload goes
// straight to its destination.
ssize_t TcpTransport::readStream(Connection& c, char* dst, size_t want) {
  if (c.inbox_pos == c.inbox_end) {
    if (want >= kInboxBytes) return ::recv(c.fd, dst, want, MSG_DONTWAIT);
    ssize_t n = ::recv(c.fd, c.inbox.get(), kInboxBytes, MSG_DONTWAIT);
    if (n <= 0) return n;
    c.inbox_pos = 0;
    c.inbox_end = static_cast<size_t>(n);
  }
  size_t n = std::min(want, c.inbox_end - c.inbox_pos);
  std::memcpy(dst, c.inbox.get() + c.inbox_pos, n);
  c.inbox_pos += n;
  return static_cast<ssize_t>(n);
}

bool TcpTransport::driveRecvs(Connection& c) {
  bool completed = false;
  for (;;) {
    // 1. The next header, read even before a receive is posted so that an abort
    //    from the peer is seen at once.
    if (c.in_header_got < sizeof(WireHeader)) {
      ssize_t n =
          readStream(c, reinterpret_cast<char*>(&c.in_header) + c.in_header_got, sizeof(WireHeader) - c.in_header_got);
      if (n == 0) {
        if (c.in_header_got == 0 && (numbered_ || c.recvs.empty()) && !lastOpenLane(c)) {
          c.closed_by_peer = true;  // see Connection::closed_by_peer
          return completed;
        }
        failConnection(c, ErrorKind::kPeer, closedText(c.peer));
        return true;
      }
      if (n < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return completed;
        const int err = errno;
        loseSocket(c, err, strFormat("lost the connection to rank %d: %s", c.peer, errnoText(err).c_str()));
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
        ssize_t n = readStream(c, buf, want - c.abort_text.size());
        if (n > 0) {
          c.abort_text.append(buf, static_cast<size_t>(n));
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return completed;
        break;  // closed mid-message: report what we have
      }
      c.socket_broken = true;  // the peer has stopped: no point in answering it
      const TransportFailure told{errorKindFromWire(c.in_header.error_kind),
                                  strFormat("rank %d failed: %s", c.peer, validUtf8(c.abort_text).c_str())};
      if (!numbered_ || !peerStopped(c, told)) failConnection(c, told.kind, told.message, true);
      return true;
    }
    // 3. Several networks: a control frame, or a message matched by its number.
    if (numbered_) {
      bool finished = false;
      const bool more = readNumbered(c, &finished);
      completed |= finished;
      if (!more) return completed;
      continue;
    }
    // 3. A data message: it must match the oldest posted receive.
    if (c.recvs.empty()) return completed;
    TcpRequest* r = c.recvs.front();
    if (!c.in_header_checked) {
      std::string bad = checkHeader(r->header, c.in_header, info_.rank);
      if (bad.empty() && c.in_header.src_rank != static_cast<uint32_t>(c.peer)) {
        bad = strFormat("a message on rank %d's connection claims to come from rank %u", c.peer, c.in_header.src_rank);
      }
      if (!bad.empty()) {
        failConnection(c, ErrorKind::kMismatch, bad);
        return true;
      }
      c.in_header_checked = true;
    }
    const PayloadRead read = readPayload(c, r->data, r->bytes, &r->done);
    if (read != PayloadRead::kWhole) return read == PayloadRead::kLost || completed;
    c.recvs.pop_front();
    c.in_header_got = 0;
    finish(r, Request::State::kDone, nullptr);
    completed = true;
    // With nothing more posted, the next header waits for the next pass (or
    // poll()'s POLLIN): looking now would cost a system call on the path that
    // returns this completion to its caller.
    if (c.recvs.empty() && c.inbox_pos == c.inbox_end) return completed;
  }
}

// The rest of a payload, [*done, bytes) of `data`; a socket that fails on the
// way is lost (loseSocket) and says so.
TcpTransport::PayloadRead TcpTransport::readPayload(Connection& c, char* data, size_t bytes, size_t* done) {
  if (!c.metering && *done < bytes && EdgeMeter::metered(bytes)) {
    c.metering = true;
    meter_.began(c.peer);
  }
  while (*done < bytes) {
    ssize_t n = readStream(c, data + *done, bytes - *done);
    if (n > 0) {
      *done += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return PayloadRead::kWait;
    const int err = n == 0 ? 0 : errno;
    loseSocket(c, err,
               n == 0 ? strFormat("rank %d closed its connection in the middle of a message (its "
                                  "process exited, crashed or was killed)",
                                  c.peer)
                      : strFormat("lost the connection to rank %d: %s", c.peer, errnoText(err).c_str()));
    return PayloadRead::kLost;
  }
  if (c.metering) {
    c.metering = false;
    meter_.ended(c.peer, bytes);
  }
  return PayloadRead::kWhole;
}

void TcpTransport::stopMetering(Connection& c) {
  if (!c.metering) return;
  c.metering = false;
  meter_.ended(c.peer, 0);
}

void TcpTransport::edgeTraffic(std::vector<EdgeTraffic>* out) const { meter_.appendTo(out, name(), false); }

bool TcpTransport::lastOpenLane(const Connection& c) const {
  for (int k = 0; k < lanes_; ++k) {
    const Connection* other = laneTo(c.peer, k);
    if (other != &c && other != nullptr && !other->failed && !other->down && !other->closed_by_peer) return false;
  }
  return true;
}

bool TcpTransport::wantsRead(const Connection& c) const {
  if (c.failed || c.down || c.closed_by_peer) return false;
  if (c.in_header_got < sizeof(WireHeader)) return true;
  // The same test as driveRecvs' step 2: a header that only looks like an abort
  // (wrong magic) waits for a receive to fail it; polling for it would spin.
  if (c.in_header.magic == kWireMagic && c.in_header.kind == static_cast<uint8_t>(OpKind::kAbort)) return true;
  if (numbered_) return wantsNumbered(c);
  return !c.recvs.empty();
}

// `now`: the caller's clock reading, for the AckWatch's looks (the spin
// loop reads the clock on every pass anyway).
bool TcpTransport::driveAll(std::chrono::steady_clock::time_point now) {
  bool completed = on_demand_.started() && adoptOnDemand();
  if (ack_watch_.due(now)) completed |= loseSilentSockets(now);
  for (auto& c : connections_) {
    if (!c || c->failed || c->down) continue;
    if (!c->sends.empty() || c->hasControl()) completed |= driveSends(*c);
    if (!c->failed && wantsRead(*c)) completed |= driveRecvs(*c);
    // Several networks: what was just read is acknowledged at once, so that a
    // sender waits no longer than the wire takes.
    if (c->ack_due && !c->failed && !c->down) completed |= driveSends(*c);
  }
  return completed;
}

// Sockets whose peer host acknowledged nothing for 2/3 of RCOLL_PEER_TIMEOUT
// (ack_watch.h) are lost as the kernel's TCP_USER_TIMEOUT would have lost
// them: a link under one of several sockets, or the peer.
bool TcpTransport::loseSilentSockets(std::chrono::steady_clock::time_point now) {
  bool lost = false;
  for (auto& c : connections_) {
    if (!c || c->failed || c->down || c->socket_broken || c->closed_by_peer) continue;
    if (!ack_watch_.dead(c->fd, now, &c->acks)) continue;
    const std::string silence = strFormat("its host acknowledged nothing for %.1f s",
                                          static_cast<double>(ack_watch_.silentAfter().count()) / 1e3);
    loseSocket(*c, ETIMEDOUT,
               strFormat("lost the connection to rank %d: %s (RCOLL_PEER_TIMEOUT %.0f s): a link on the way or the "
                         "host is down",
                         c->peer, silence.c_str(), static_cast<double>(config_.peer_timeout.count()) / 1e3),
               silence);
    lost = true;
  }
  return lost;
}

void TcpTransport::progress(std::chrono::milliseconds timeout) {
  const auto start = std::chrono::steady_clock::now();
  Deadline deadline = start + timeout;
  // Spin a little before sleeping in poll(): an answer that comes within
  // microseconds is then taken without a wake-up, which costs tens of
  // microseconds on a virtual or busy machine (RCOLL_SPIN_US, as shm does).
  // sched_yield() keeps the spin polite: it hands the core to any runnable
  // thread, often the very peer this rank waits for.
  const auto spin_until = start + std::min<std::chrono::microseconds>(config_.spin, timeout);
  auto now = start;
  for (; now < spin_until; now = std::chrono::steady_clock::now()) {
    if (driveAll(now)) return;
    sched_yield();
  }
  for (;; now = std::chrono::steady_clock::now()) {
    if (driveAll(now)) return;
    int wait_ms = millisecondsUntil(deadline);
    if (wait_ms <= 0) return;
    wait_ms = static_cast<int>(std::min<long long>(wait_ms, maxSleep().count()));
    poll_fds_.clear();
    poll_fds_.push_back({wake_fd_, POLLIN, 0});
    if (!prepareSleep(&poll_fds_)) continue;  // bytes wait in an inbox
    int rc = ::poll(poll_fds_.data(), poll_fds_.size(), wait_ms);
    if (rc < 0 && errno != EINTR) throwError(ErrorKind::kGeneric, "poll(): " + errnoText(errno));
    if (rc > 0 && (poll_fds_[0].revents & POLLIN)) {
      drainEventfd(wake_fd_);
      return;  // interrupted: the caller checks why
    }
  }
}

Activity TcpTransport::progressNow() {
  return driveAll(std::chrono::steady_clock::now()) ? Activity::kFinished : Activity::kIdle;
}

// Sockets need no announcement: the kernel wakes whoever polls them. Bytes
// already in an inbox would not wake anyone, though: with a receive waiting
// for them, the caller must look again instead of sleeping.
bool TcpTransport::prepareSleep(std::vector<pollfd>* fds) {
  bool may_sleep = true;
  if (on_demand_.started()) fds->push_back({on_demand_.readyFd(), POLLIN, 0});
  for (auto& c : connections_) {
    if (!c || c->failed || c->down) continue;
    if (c->inbox_pos < c->inbox_end && wantsRead(*c)) may_sleep = false;
    short events = 0;
    if (!c->sends.empty() || c->hasControl()) events |= POLLOUT;
    if (wantsRead(*c)) events |= POLLIN;
    if (events != 0) fds->push_back({c->fd, events, 0});
  }
  return may_sleep;
}

std::chrono::milliseconds TcpTransport::maxSleep() const {
  return ack_watch_.untilDue(std::chrono::steady_clock::now());
}

// The next progressNow() reads and writes whatever became ready.
Activity TcpTransport::finishSleep(const pollfd*, size_t) { return Activity::kIdle; }

void TcpTransport::interrupt() { signalEventfd(wake_fd_); }

// The buffer of a partly written send is still alive here: abortPeers() runs
// before the failed op is reported to its caller.
bool TcpTransport::finishPartialSend(Connection& c, Deadline deadline) {
  std::string why;
  if (c.control_sent > 0 && c.control_sent < c.control.size()) {  // a control frame half written
    if (!sendAll(c.fd, c.control.data() + c.control_sent, c.control.size() - c.control_sent, deadline, &why)) {
      return false;
    }
    c.control.clear();
    c.control_sent = 0;
  }
  TcpRequest* r = nullptr;
  if (!c.sends.empty() && c.sends.front()->done > 0) {
    r = c.sends.front();
  } else if (c.unfinished.done > 0) {
    r = &c.unfinished;
  }
  if (r == nullptr) return true;
  constexpr size_t kHeader = sizeof(WireHeader);
  if (r->done < kHeader &&
      !sendAll(c.fd, reinterpret_cast<char*>(&r->header) + r->done, kHeader - r->done, deadline, &why)) {
    return false;
  }
  size_t sent = r->done > kHeader ? r->done - kHeader : 0;
  if (!sendAll(c.fd, r->data + sent, r->bytes - sent, deadline, &why)) return false;
  if (r == &c.unfinished) {
    c.unfinished.done = 0;
    return true;
  }
  r->done = kHeader + r->bytes;
  c.sends.pop_front();
  finish(r, Request::State::kDone, nullptr);
  return true;
}

void TcpTransport::abortPeers(ErrorKind kind, const std::string& message) {
  if (aborted_) return;
  aborted_ = true;
  std::string text = truncateUtf8(message, kMaxAbortMessage);
  // Bounded: a peer that stopped reading must not hold this rank's failure up.
  Deadline deadline = std::chrono::steady_clock::now() + kAbortLinger;
  for (auto& c : connections_) {
    if (!c) continue;
    // The abort must start at a message boundary, or the peer would read it as
    // payload. A segment already half on the wire is finished first: its buffer
    // is still alive here, because the op has not been failed yet.
    // Several networks: what was read here is acknowledged first, or the
    // peer would take its last sends for lost.
    // A socket whose peer's host acknowledged nothing at the AckWatch's last
    // look (the other sockets over a link that just failed) is not tried:
    // it would only hold this rank's failure up for the whole linger.
    const bool silent = ack_watch_.silentLately(c->acks, std::chrono::steady_clock::now());
    if (!c->socket_broken && !silent && finishPartialSend(*c, deadline) && (!numbered_ || sendDueAck(*c, deadline))) {
      WireHeader h = makeAbortHeader(info_, kind, text.size());
      std::string why;
      if (sendAll(c->fd, &h, sizeof(h), deadline, &why)) sendAll(c->fd, text.data(), text.size(), deadline, &why);
    }
    // FIN after the abort text; the socket stays open (and unread data with it)
    // until the communicator is destroyed, so the peer reads the reason first.
    ::shutdown(c->fd, SHUT_WR);
    c->socket_broken = true;
  }
  // Only now: failing a lane fails its siblings, whose queues (a partly
  // written send) the loop above still needed.
  for (auto& c : connections_) {
    if (c) failConnection(*c, ErrorKind::kAborted, "the communicator was aborted: " + message);
  }
  // Peers not connected yet: their messages fail, and a peer that dials now
  // is refused, which tells it this rank is gone.
  const TransportFailure aborted{ErrorKind::kAborted, "the communicator was aborted: " + message};
  for (TcpRequest* r : on_demand_.stop()) finish(r, Request::State::kFailed, &aborted);
}

// The abort message waits in each socket's send queue, perhaps behind
// megabytes of payload on a slow link. Closing a socket with unread input
// resets the connection, which throws away what it still had to send, and the
// peer would see "connection reset" instead of the reason. So, bounded: keep
// reading (and dropping) what the peer sends until everything sent here is
// acknowledged (SIOCOUTQ 0) and the peer has gone quiet (it read the abort
// and stopped sending) or closed.
void TcpTransport::settleAbort() {
  if (!aborted_ || settled_) return;
  settled_ = true;
  constexpr auto kQuiet = std::chrono::milliseconds(50);
  const Deadline deadline = std::chrono::steady_clock::now() + kAbortLinger;
  struct Open {
    int fd;
    std::chrono::steady_clock::time_point heard;
  };
  std::vector<Open> open;
  for (auto& c : connections_) {
    if (c && c->fd >= 0) open.push_back({c->fd, std::chrono::steady_clock::now()});
  }
  std::vector<char> sink(64 << 10);
  std::vector<pollfd> fds;
  while (!open.empty() && std::chrono::steady_clock::now() < deadline) {
    fds.clear();
    for (const Open& o : open) fds.push_back({o.fd, POLLIN, 0});
    ::poll(fds.data(), fds.size(), 10);
    const auto now = std::chrono::steady_clock::now();
    for (size_t i = 0; i < open.size();) {
      bool closed = false;
      for (;;) {
        const ssize_t n = ::recv(open[i].fd, sink.data(), sink.size(), MSG_DONTWAIT);
        if (n > 0) {
          open[i].heard = now;
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        closed = n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK);
        break;
      }
      int unsent = 0;
      const bool delivered = ::ioctl(open[i].fd, SIOCOUTQ, &unsent) == 0 && unsent == 0;
      if (closed || (delivered && now - open[i].heard >= kQuiet)) {
        open[i] = open.back();
        open.pop_back();
      } else {
        ++i;
      }
    }
  }
}

}  // namespace rcoll
