#include "shm/shm_transport.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "log.h"
#include "shm/shm_ring.h"
#include "shm/shm_setup.h"
#include "shm/shm_window.h"
#include "socket_util.h"

namespace rcoll {

namespace {

static_assert(sizeof(WireHeader) == shm::kHeaderBytes, "a ring record starts with one wire header");

// Largest copy between two publications of head or tail: the other side starts
// on a piece while the next one is copied, and the piece stays in cache.
constexpr uint64_t kPiece = 64 << 10;

std::string closedMessage(int peer) {
  return strFormat("rank %d closed its connection (its process exited, crashed or was killed)", peer);
}

// poll()'s timeout until `deadline`, rounded up: a sub-millisecond remainder
// must sleep, not spin on poll(0).
int pollMilliseconds(Deadline deadline) {
  const auto left = deadline - std::chrono::steady_clock::now();
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(left + std::chrono::microseconds(999));
  return static_cast<int>(std::max<long long>(0, std::min<long long>(ms.count(), 1 << 30)));
}

}  // namespace

struct ShmTransport::ShmRequest : MessageRequest {
  uint64_t done = 0;  // send: record bytes in the ring (header, payload, padding); recv: payload bytes copied
};

struct ShmTransport::Connection {
  int peer = -1;
  int fd = -1;             // the handshake socket, kept as a side channel
  int peer_doorbell = -1;  // the peer's eventfd
  std::unique_ptr<shm::Segment> segment;
  std::unique_ptr<shm::Segment> window;  // the peer's shared window (null when windows are off)
  uint64_t ring_bytes = 0;
  char* out_ring = nullptr;       // this rank produces
  const char* in_ring = nullptr;  // this rank consumes
  std::atomic<uint64_t>* out_head = nullptr;
  std::atomic<uint64_t>* out_tail = nullptr;
  std::atomic<uint64_t>* in_head = nullptr;
  std::atomic<uint64_t>* in_tail = nullptr;
  std::atomic<uint32_t>* my_sleep = nullptr;
  std::atomic<uint32_t>* peer_sleep = nullptr;
  uint64_t out_pos = 0;  // == *out_head: this rank is its only writer
  uint64_t in_pos = 0;   // == *in_tail: likewise
  uint64_t in_skip = 0;  // padding of the last record, skipped before the next header
  WireHeader in_header{};
  bool have_header = false;     // in_header holds the current record's header
  bool header_checked = false;  // ... and it matched the oldest receive
  std::deque<ShmRequest*> sends;
  std::deque<ShmRequest*> recvs;
  SideChannelReader side_channel;
  bool closed = false;  // the peer is gone: no new sends; what is in the ring can still be received
  bool failed = false;  // no more requests at all
  bool socket_broken = false;
  TransportFailure failure;
};

ShmTransport::ShmTransport(const ConnectInfo& info, const Config& config, const std::string& bind_host)
    : info_(info),
      config_(config),
      ring_bytes_(config.shm_ring_bytes),
      listener_(std::make_unique<PeerListener>(info, bind_host, config.socketOptions())),
      connections_(static_cast<size_t>(info.size)) {
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  doorbell_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0 || doorbell_fd_ < 0) {
    const int err = errno;
    if (wake_fd_ >= 0) ::close(wake_fd_);
    if (doorbell_fd_ >= 0) ::close(doorbell_fd_);
    throwError(ErrorKind::kGeneric, "eventfd(): " + errnoText(err));
  }
  if (config_.shm_coll && info_.size > 1) {
    window_slot_bytes_ = config_.shm_coll_slot_bytes;
    shm::OwnWindow own;
    try {
      own = shm::createWindow(info_, window_slot_bytes_);
    } catch (...) {
      ::close(wake_fd_);
      ::close(doorbell_fd_);
      throw;
    }
    window_ = std::move(own.mapping);
    window_fd_ = own.fd;
  }
  RCOLL_INFO("rank %d: shm transport (rings of %zu bytes per direction, windows of 2 x %zu bytes), handshakes at %s",
             info_.rank, ring_bytes_, window_slot_bytes_, listener_->address().c_str());
}

ShmTransport::~ShmTransport() {
  listener_->close();
  for (auto& c : connections_) {
    if (!c) continue;
    if (c->fd >= 0) ::close(c->fd);
    if (c->peer_doorbell >= 0) ::close(c->peer_doorbell);
  }
  connections_.clear();  // unmaps the segments
  if (window_fd_ >= 0) ::close(window_fd_);
  ::close(wake_fd_);
  ::close(doorbell_fd_);
}

bool ShmTransport::connected(int peer) const {
  return peer >= 0 && peer < info_.size && connections_[static_cast<size_t>(peer)] != nullptr;
}

// --- set-up ------------------------------------------------------------------

void ShmTransport::connect(int peer, const std::string& address, Deadline deadline) {
  if (peer < 0 || peer >= info_.size || peer == info_.rank || connected(peer)) {
    throwError(ErrorKind::kInvalidArgument, strFormat("rank %d: connect(%d): not a free peer slot", info_.rank, peer));
  }
  adopt(peer, dialPeer(info_, peer, address, deadline, config_.socketOptions()), deadline, /*creator=*/false);
}

int ShmTransport::accept(Deadline deadline) {
  std::vector<bool> connected(static_cast<size_t>(info_.size));
  for (size_t i = 0; i < connected.size(); ++i)
    connected[i] = connections_[i] != nullptr || !serves(static_cast<int>(i));
  int fd = -1;
  const int peer = listener_->accept(deadline, connected, &fd);
  adopt(peer, fd, deadline, /*creator=*/true);
  return peer;
}

void ShmTransport::adopt(int peer, int fd, Deadline deadline, bool creator) {
  shm::PairLink link;
  try {
    const size_t window_bytes = window_ ? shm::windowBytes(window_slot_bytes_) : 0;
    link = creator ? shm::createPair(info_, peer, fd, ring_bytes_, doorbell_fd_, window_fd_, window_bytes, deadline)
                   : shm::joinPair(info_, peer, fd, doorbell_fd_, window_fd_, window_bytes, deadline);
  } catch (...) {
    ::close(fd);
    throw;
  }
  setNonBlocking(fd, true);
  auto c = std::make_unique<Connection>();
  c->peer = peer;
  c->fd = fd;
  c->peer_doorbell = link.peer_doorbell;
  const int s = link.side;  // this rank produces ring s and consumes ring 1 - s
  shm::SegmentControl* control = link.segment->control();
  c->ring_bytes = link.segment->ringBytes();
  c->out_ring = shm::ringData(link.segment->base(), s, c->ring_bytes);
  c->in_ring = shm::ringData(link.segment->base(), 1 - s, c->ring_bytes);
  c->out_head = &control->head[s].value;
  c->out_tail = &control->tail[s].value;
  c->in_head = &control->head[1 - s].value;
  c->in_tail = &control->tail[1 - s].value;
  c->my_sleep = &control->sleeping[s].bits;
  c->peer_sleep = &control->sleeping[1 - s].bits;
  c->segment = std::move(link.segment);
  c->window = std::move(link.peer_window);
  RCOLL_TRACE("rank %d: shared memory with rank %d: rings of %llu bytes, side %d", info_.rank, peer,
              static_cast<unsigned long long>(c->ring_bytes), s);
  connections_[static_cast<size_t>(peer)] = std::move(c);
}

void ShmTransport::closeListener() {
  listener_->close();
  if (window_fd_ >= 0) ::close(window_fd_);  // every peer holds its own reference now
  window_fd_ = -1;
}

// --- shared windows ------------------------------------------------------------

char* ShmTransport::window(int rank) const {
  if (rank == info_.rank) return window_ ? window_->base() : nullptr;
  if (!connected(rank)) return nullptr;
  const auto& c = connections_[static_cast<size_t>(rank)];
  return c->window ? c->window->base() : nullptr;
}

void ShmTransport::ringDoorbell(int peer) {
  if (!connected(peer)) return;
  signalEventfd(connections_[static_cast<size_t>(peer)]->peer_doorbell);
}

const TransportFailure* ShmTransport::peerDown(int peer) const {
  if (!connected(peer)) return nullptr;
  const auto& c = connections_[static_cast<size_t>(peer)];
  return c->failed || c->closed ? &c->failure : nullptr;
}

bool ShmTransport::incomingMessage(int peer, WireHeader* header) const {
  if (!connected(peer)) return false;
  const Connection& c = *connections_[static_cast<size_t>(peer)];
  if (c.have_header) {
    *header = c.in_header;
    return true;
  }
  const uint64_t head = c.in_head->load(std::memory_order_acquire);
  if (head - c.in_pos < c.in_skip + sizeof(WireHeader)) return false;
  shm::ringRead(c.in_ring, c.ring_bytes, c.in_pos + c.in_skip, header, sizeof(WireHeader));
  return true;
}

bool ShmTransport::sleepForWindows(Deadline deadline) {
  if (interrupted_.load(std::memory_order_acquire)) {
    takeInterrupt();
    return true;
  }
  poll_fds_.clear();
  poll_fds_.push_back({wake_fd_, POLLIN, 0});
  appendWakeSources(&poll_fds_);
  const int rc = ::poll(poll_fds_.data(), poll_fds_.size(), pollMilliseconds(deadline));
  if (rc < 0 && errno != EINTR) throwError(ErrorKind::kGeneric, "poll(): " + errnoText(errno));
  if (rc <= 0) return false;
  handleWakeSources(poll_fds_.data() + 1, poll_fds_.size() - 1);
  if (poll_fds_[0].revents & POLLIN) {
    takeInterrupt();
    return true;
  }
  return false;
}

// --- requests ----------------------------------------------------------------

void ShmTransport::release(Request* request) { requests_.release(request); }

void ShmTransport::finish(ShmRequest* r, Request::State state, const TransportFailure* why) {
  requests_.finish(r, state, why);
  progressed_ = true;
}

TransportFailure ShmTransport::failure(Request* request) const { return requests_.failure(request); }

Request* ShmTransport::isend(int peer, const WireHeader& header, const void* data, size_t bytes) {
  ShmRequest* r = requests_.take(true, peer, header, data, bytes);
  const uint64_t announced = header.bytes;
  if (announced != bytes) {  // the record length comes from the header: they must agree
    r->state = Request::State::kFailed;
    r->why = {ErrorKind::kInvalidArgument,
              strFormat("rank %d: a send to rank %d announces %llu bytes in its header but carries %zu", info_.rank,
                        peer, static_cast<unsigned long long>(announced), bytes)};
    return r;
  }
  return post(r);
}

Request* ShmTransport::irecv(int peer, const WireHeader& expected, void* data, size_t bytes) {
  return post(requests_.take(false, peer, expected, data, bytes));
}

Request* ShmTransport::post(ShmRequest* r) {
  // On a connection that already failed the request fails at once, with the
  // connection's cause, so the caller sees why without waiting.
  Connection* c = connected(r->peer) ? connections_[static_cast<size_t>(r->peer)].get() : nullptr;
  if (c == nullptr || c->failed || aborted_ || (c->closed && r->is_send)) {
    r->state = Request::State::kFailed;
    r->why = c && (c->failed || c->closed) ? c->failure
                                           : TransportFailure{aborted_ ? ErrorKind::kAborted : ErrorKind::kPeer,
                                                              strFormat("no connection to rank %d", r->peer)};
    return r;
  }
  if (r->is_send) {
    c->sends.push_back(r);
    return r;
  }
  c->recvs.push_back(r);
  if (c->closed) {
    // The peer is gone, but what it wrote before going is still in the ring
    // (as a TCP socket still delivers what arrived before the FIN).
    driveRecvs(*c);
    if (!c->failed && !c->recvs.empty()) failConnection(*c, c->failure.kind, c->failure.message, true);
  }
  return r;
}

// --- data path -----------------------------------------------------------------

// Tells the peer about new bytes or new room, if it sleeps waiting for them.
// Called right after a seq_cst store of head or tail; with sleep()'s seq_cst
// store of the sleep word and load of the rings, either the peer sees what was
// just published, or this load sees its sleep word (shm_ring.h).
void ShmTransport::wakePeer(Connection& c, uint32_t wanted) {
  if ((c.peer_sleep->load(std::memory_order_seq_cst) & wanted) == 0) return;
  if (c.peer_sleep->exchange(0, std::memory_order_relaxed) == 0) return;  // someone else woke it
  signalEventfd(c.peer_doorbell);
}

void ShmTransport::publishTail(Connection& c) {
  c.in_tail->store(c.in_pos, std::memory_order_seq_cst);
  wakePeer(c, shm::kWantSpace);
}

bool ShmTransport::driveSends(Connection& c) {
  bool moved = false;
  uint64_t budget = c.ring_bytes;  // per call, so that one large send cannot starve the receives
  while (!c.sends.empty()) {
    ShmRequest* r = c.sends.front();
    const uint64_t record = shm::recordBytes(r->bytes);
    if (r->done < record) {
      const uint64_t tail = c.out_tail->load(std::memory_order_acquire);
      if (tail > c.out_pos || c.out_pos - tail > c.ring_bytes) {
        failConnection(
            c, ErrorKind::kPeer,
            strFormat("the ring to rank %d is corrupt (written %llu, read %llu): protocol error or "
                      "memory corruption",
                      c.peer, static_cast<unsigned long long>(c.out_pos), static_cast<unsigned long long>(tail)));
        return true;
      }
      const uint64_t room = c.ring_bytes - (c.out_pos - tail);
      if (room == 0 || budget == 0) break;
      const uint64_t n = std::min({room, record - r->done, kPiece, budget});
      // The piece [done, done + n) of the record: header, then payload; padding is only counted.
      uint64_t s = r->done;
      const uint64_t e = s + n;
      uint64_t pos = c.out_pos;
      if (s < shm::kHeaderBytes) {
        const uint64_t k = std::min<uint64_t>(e, shm::kHeaderBytes) - s;
        shm::ringWrite(c.out_ring, c.ring_bytes, pos, reinterpret_cast<const char*>(&r->header) + s, k);
        pos += k;
        s += k;
      }
      const uint64_t payload_end = shm::kHeaderBytes + r->bytes;
      if (s < e && s < payload_end) {
        shm::ringWrite(c.out_ring, c.ring_bytes, pos, r->data + (s - shm::kHeaderBytes), std::min(e, payload_end) - s);
      }
      c.out_pos += n;
      r->done += n;
      budget -= n;
      c.out_head->store(c.out_pos, std::memory_order_seq_cst);
      wakePeer(c, shm::kWantData);
      moved = true;
      continue;
    }
    c.sends.pop_front();
    finish(r, Request::State::kDone, nullptr);
    moved = true;
  }
  return moved;
}

bool ShmTransport::driveRecvs(Connection& c) {
  bool moved = false;
  uint64_t budget = c.ring_bytes;
  while (!c.recvs.empty()) {
    const uint64_t head = c.in_head->load(std::memory_order_acquire);
    if (head < c.in_pos || head - c.in_pos > c.ring_bytes) {
      failConnection(
          c, ErrorKind::kPeer,
          strFormat("the ring from rank %d is corrupt (written %llu, read %llu): protocol error or "
                    "memory corruption",
                    c.peer, static_cast<unsigned long long>(head), static_cast<unsigned long long>(c.in_pos)));
      return true;
    }
    uint64_t avail = head - c.in_pos;
    // 1. The next header, whole (it never wraps: records are 64-aligned).
    if (!c.have_header) {
      if (avail < c.in_skip + shm::kHeaderBytes) break;
      c.in_pos += c.in_skip;
      c.in_skip = 0;
      shm::ringRead(c.in_ring, c.ring_bytes, c.in_pos, &c.in_header, shm::kHeaderBytes);
      c.in_pos += shm::kHeaderBytes;
      avail = head - c.in_pos;
      c.have_header = true;
      c.header_checked = false;
      publishTail(c);
      moved = true;
    }
    // 2. It must be what the oldest receive expects, before a payload byte moves.
    ShmRequest* r = c.recvs.front();
    if (!c.header_checked) {
      std::string bad = checkHeader(r->header, c.in_header, info_.rank);
      const uint64_t announced = c.in_header.bytes;  // a copy: the packed field may be misaligned
      if (bad.empty() && c.in_header.src_rank != static_cast<uint32_t>(c.peer)) {
        bad = strFormat("a message on rank %d's connection claims to come from rank %u", c.peer, c.in_header.src_rank);
      }
      if (bad.empty() && announced != r->bytes) {
        bad = strFormat("rank %d sent a %llu-byte message where rank %d posted a %zu-byte receive", c.peer,
                        static_cast<unsigned long long>(announced), info_.rank, r->bytes);
      }
      if (!bad.empty()) {
        failConnection(c, ErrorKind::kMismatch, bad);
        return true;
      }
      c.header_checked = true;
    }
    // 3. The payload, straight into the destination, as it arrives.
    if (r->done < r->bytes) {
      if (avail == 0 || budget == 0) break;
      const uint64_t n = std::min({avail, static_cast<uint64_t>(r->bytes - r->done), kPiece, budget});
      shm::ringRead(c.in_ring, c.ring_bytes, c.in_pos, r->data + r->done, static_cast<size_t>(n));
      c.in_pos += n;
      r->done += n;
      budget -= n;
      publishTail(c);
      moved = true;
      continue;
    }
    c.recvs.pop_front();
    c.have_header = false;
    c.in_skip = shm::recordBytes(r->bytes) - shm::kHeaderBytes - r->bytes;
    finish(r, Request::State::kDone, nullptr);
    moved = true;
  }
  return moved;
}

bool ShmTransport::driveAll() {
  bool moved = false;
  for (auto& c : connections_) {
    if (!c || c->failed || c->closed) continue;
    if (!c->sends.empty()) moved |= driveSends(*c);
    if (!c->failed && !c->recvs.empty()) moved |= driveRecvs(*c);
  }
  return moved;
}

// Whether driveSends/driveRecvs would move something now (or find corruption).
// seq_cst loads: sleep() relies on them (see wakePeer).
bool ShmTransport::canMove(Connection& c) {
  if (!c.sends.empty()) {
    const uint64_t tail = c.out_tail->load(std::memory_order_seq_cst);
    if (tail > c.out_pos || c.out_pos - tail != c.ring_bytes) return true;
  }
  if (!c.recvs.empty()) {
    const uint64_t head = c.in_head->load(std::memory_order_seq_cst);
    if (head < c.in_pos || head - c.in_pos > c.ring_bytes) return true;
    const uint64_t avail = head - c.in_pos;
    if (!c.have_header) return avail >= c.in_skip + shm::kHeaderBytes;
    return !c.header_checked || avail > 0;
  }
  return false;
}

// --- waiting -------------------------------------------------------------------

void ShmTransport::progress(std::chrono::milliseconds timeout) {
  const Deadline deadline = std::chrono::steady_clock::now() + timeout;
  progressed_ = false;
  auto last_move = std::chrono::steady_clock::now();
  for (;;) {
    const bool moved = driveAll();
    if (progressed_) return;
    if (interrupted_.load(std::memory_order_acquire)) {
      takeInterrupt();
      return;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return;
    if (moved) {
      last_move = now;
      continue;
    }
    // Poll the rings for RCOLL_SPIN_US after the last byte moved before
    // sleeping: an active peer answers well within it, without a wake-up on either side.
    if (now - last_move < config_.spin) {
      // sched_yield(), not a pause loop: on a core with nothing else to run it
      // returns at once (the spin stays a spin), and on an oversubscribed host
      // it hands the core to whoever is runnable, often the very peer this rank
      // waits for. A pause loop there holds the core the answer needs.
      sched_yield();
      continue;
    }
    if (sleep(deadline) || progressed_) return;
    last_move = std::chrono::steady_clock::now();
  }
}

// Sleeps until a peer rings this rank's doorbell, a side channel speaks
// (abort, EOF), interrupt() or `deadline`. True if interrupted.
bool ShmTransport::sleep(Deadline deadline) {
  poll_fds_.clear();
  poll_fds_.push_back({wake_fd_, POLLIN, 0});
  const bool ready = !prepareSleep(&poll_fds_) || interrupted_.load(std::memory_order_relaxed);
  int rc = 0;
  if (!ready) {
    rc = ::poll(poll_fds_.data(), poll_fds_.size(), pollMilliseconds(deadline));
    if (rc < 0 && errno != EINTR) {
      const int err = errno;
      finishSleep(nullptr, 0);
      throwError(ErrorKind::kGeneric, "poll(): " + errnoText(err));
    }
  }
  if (rc <= 0) {
    finishSleep(nullptr, 0);
    return false;
  }
  finishSleep(poll_fds_.data() + 1, poll_fds_.size() - 1);
  if (poll_fds_[0].revents & POLLIN) {
    takeInterrupt();
    return true;
  }
  return false;
}

Activity ShmTransport::progressNow() {
  progressed_ = false;
  const bool moved = driveAll();
  return progressed_ ? Activity::kFinished : moved ? Activity::kMoved : Activity::kIdle;
}

// Announces what this rank waits for, then looks once more (shm_ring.h; pairs
// with wakePeer): a peer that published in between is seen here, and one that
// publishes after sees the announcement and rings the doorbell.
bool ShmTransport::prepareSleep(std::vector<pollfd>* fds) {
  for (auto& c : connections_) {
    if (!c || c->failed || c->closed) continue;
    const uint32_t bits = (c->recvs.empty() ? 0 : shm::kWantData) | (c->sends.empty() ? 0 : shm::kWantSpace);
    c->my_sleep->store(bits, std::memory_order_seq_cst);
  }
  poll_peers_.clear();
  for (auto& c : connections_) {
    if (c && !c->failed && !c->closed && canMove(*c)) return false;
  }
  appendWakeSources(fds);
  return true;
}

// The doorbell, then every open side channel (their peers in poll_peers_).
void ShmTransport::appendWakeSources(std::vector<pollfd>* fds) {
  poll_peers_.clear();
  fds->push_back({doorbell_fd_, POLLIN, 0});
  for (auto& c : connections_) {
    if (!c || c->failed || c->closed || c->socket_broken) continue;
    fds->push_back({c->fd, POLLIN, 0});
    poll_peers_.push_back(c->peer);
  }
}

// `fds`: what appendWakeSources() appended, revents filled (count 0: nobody slept).
void ShmTransport::handleWakeSources(const pollfd* fds, size_t count) {
  if (count > 0 && (fds[0].revents & POLLIN)) drainEventfd(doorbell_fd_);
  for (size_t i = 0; i < poll_peers_.size() && i + 1 < count; ++i) {
    if (fds[i + 1].revents != 0) serviceSideChannel(*connections_[static_cast<size_t>(poll_peers_[i])]);
  }
}

// `fds`: the doorbell, then poll_peers_' side channels (none when nobody slept).
Activity ShmTransport::finishSleep(const pollfd* fds, size_t count) {
  progressed_ = false;
  for (auto& c : connections_) {
    if (c && !c->failed && !c->closed) c->my_sleep->store(0, std::memory_order_relaxed);
  }
  handleWakeSources(fds, count);
  return progressed_ ? Activity::kFinished : Activity::kIdle;
}

void ShmTransport::takeInterrupt() {
  interrupted_.store(false, std::memory_order_relaxed);
  drainEventfd(wake_fd_);
}

void ShmTransport::interrupt() {
  interrupted_.store(true, std::memory_order_release);
  signalEventfd(wake_fd_);
}

// --- side channel, failure -------------------------------------------------------

void ShmTransport::serviceSideChannel(Connection& c) {
  const SideChannelNews news = c.side_channel.read(c.fd);
  switch (news.kind) {
    case SideChannelNews::Kind::kNothing:
      return;
    case SideChannelNews::Kind::kGarbage:
      c.socket_broken = true;
      failConnection(c, ErrorKind::kPeer, strFormat("rank %d sent garbage on its connection", c.peer));
      return;
    case SideChannelNews::Kind::kClosed:
      c.socket_broken = true;
      // A reset is a close with our own abort text unread: the same news.
      peerClosed(c, {ErrorKind::kPeer,
                     news.error == 0 || news.error == ECONNRESET
                         ? closedMessage(c.peer)
                         : strFormat("lost the connection to rank %d: %s", c.peer, errnoText(news.error).c_str())});
      return;
    case SideChannelNews::Kind::kAbort:
      c.socket_broken = true;  // the peer has stopped: no point in answering it
      peerClosed(c, {news.abort_kind, strFormat("rank %d failed: %s", c.peer, news.text.c_str())}, true);
      return;
  }
}

// The peer's process is gone (or it aborted): it will never read or write
// again. Unfinished sends fail; receives complete from what it wrote before it
// went, and those that cannot fail at once with `why`.
void ShmTransport::peerClosed(Connection& c, const TransportFailure& why, bool peer_reported) {
  if (c.failed || c.closed) return;
  if (why.kind == ErrorKind::kPeer && !peer_reported) markLost(c.peer);
  c.closed = true;
  c.failure = why;
  for (ShmRequest* r : c.sends) finish(r, Request::State::kFailed, &c.failure);
  c.sends.clear();
  driveRecvs(c);
  if (!c.failed && !c.recvs.empty()) failConnection(c, why.kind, why.message, true);  // marked above
  RCOLL_INFO("rank %d: shared-memory connection to rank %d closed: %s", info_.rank, c.peer, why.message.c_str());
}

void ShmTransport::failConnection(Connection& c, ErrorKind kind, const std::string& message, bool peer_reported) {
  if (c.failed) return;
  if (kind == ErrorKind::kPeer && !peer_reported) markLost(c.peer);
  c.failed = true;
  c.failure = {kind, message};
  for (ShmRequest* r : c.sends) finish(r, Request::State::kFailed, &c.failure);
  for (ShmRequest* r : c.recvs) finish(r, Request::State::kFailed, &c.failure);
  c.sends.clear();
  c.recvs.clear();
  RCOLL_INFO("rank %d: shared-memory connection to rank %d failed: %s", info_.rank, c.peer, message.c_str());
}

void ShmTransport::abortPeers(ErrorKind kind, const std::string& message) {
  if (aborted_) return;
  aborted_ = true;
  abortOverSideChannels(AbortMessage(info_, kind, message), connections_, [&](Connection& c) {
    failConnection(c, ErrorKind::kAborted, "the communicator was aborted: " + message);
  });
}

}  // namespace rcoll
