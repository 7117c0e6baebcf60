#include "rdma/verbs_transport.h"

#include <arpa/inet.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>

#include "log.h"
#include "rdma/ibv_api.h"
#include "rdma/mr_cache.h"
#include "rdma/verbs_factory.h"
#include "socket_util.h"

namespace rcoll {

namespace {

// The side channel carries handshakes and abort messages, not data: default
// buffers, but the same dead-peer bound as every connection (a cut link is
// seen there while the queue pairs only retry).
SocketOptions sideChannelOptions(const Config& config) {
  SocketOptions options = config.socketOptions();
  options.buffer_bytes = 0;
  return options;
}

constexpr uint32_t kQpInfoMagic = 0x50514352;  // "RCQP"
constexpr size_t kCtrlBytes = 128;             // one control slot
constexpr int kWantRecvSlots = 128;            // posted receives per peer (credits, data immediates)
constexpr int kWantSendSlots = 64;             // control messages in flight per peer
constexpr int kWantSendQueue = 256;            // work requests in flight per peer
constexpr auto kAbortLinger = std::chrono::seconds(2);
constexpr auto kSpin = std::chrono::microseconds(30);  // poll the CQ this long before sleeping
constexpr int kAccessRemote = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;

enum CtrlType : uint32_t { kCredit = 1, kEmpty = 2, kMismatch = 3 };

#pragma pack(push, 1)
struct CtrlMessage {
  uint32_t type;
  uint32_t rkey;
  uint64_t seq;  // the receive's number between the two ranks
  uint64_t addr;
  uint64_t bytes;
  WireHeader header;  // credit: what the receiver expects; mismatch: what the sender had
};
#pragma pack(pop)
static_assert(sizeof(CtrlMessage) <= kCtrlBytes, "a control message fits its slot");

const char* mtuName(int mtu) {
  switch (mtu) {
    case IBV_MTU_256:
      return "256";
    case IBV_MTU_512:
      return "512";
    case IBV_MTU_1024:
      return "1024";
    case IBV_MTU_2048:
      return "2048";
    case IBV_MTU_4096:
      return "4096";
  }
  return "?";
}

}  // namespace

// What the two ends of a queue pair swap over the socket, each way.
#pragma pack(push, 1)
struct VerbsTransport::QpInfo {
  uint32_t magic;
  uint32_t rank;
  uint32_t qpn;
  uint32_t psn;
  uint16_t lid;
  uint8_t ethernet;
  uint8_t mtu;  // ibv_mtu
  uint8_t gid[16];
};
#pragma pack(pop)

// Every work request's wr_id points at its owner, so a completion finds it.
struct VerbsTransport::WrOwner {
  enum Kind : uint8_t { kCtrlRecv, kCtrlSend, kData };
  Kind kind;
  explicit WrOwner(Kind k) : kind(k) {}
};

struct VerbsTransport::CtrlSlot : WrOwner {
  CtrlSlot(Kind k, Connection* c, char* b) : WrOwner(k), conn(c), buf(b) {}
  Connection* conn;
  char* buf;
  VerbsRequest* request = nullptr;  // a zero-byte send completes with its control message
};

// holds: work requests posted and not yet completed (the NIC may still read
// or write the memory, so the request and its registration wait for them).
struct VerbsTransport::VerbsRequest : MessageRequest, WrOwner {
  VerbsRequest() : WrOwner(kData) {}
  uint64_t seq = 0;  // per peer and direction, matches credits to sends
  uint64_t remote_addr = 0;
  uint32_t rkey = 0;
  MrCache::Entry* mr = nullptr;
};

// Something to post on a connection's send queue, in order.
struct VerbsTransport::Outgoing {
  CtrlMessage message{};            // a control message, when request is null or a zero-byte send
  VerbsRequest* request = nullptr;  // a send whose credit arrived
};

struct VerbsTransport::Connection {
  int peer = -1;
  int fd = -1;  // the handshake socket, kept as a side channel
  ibv_qp* qp = nullptr;
  std::vector<std::unique_ptr<CtrlSlot>> recv_slots;
  std::vector<std::unique_ptr<CtrlSlot>> send_slots;
  std::vector<CtrlSlot*> free_send_slots;
  int sq_used = 0;
  std::deque<VerbsRequest*> recvs;      // posted receives, oldest first
  std::deque<VerbsRequest*> unmatched;  // sends waiting for their credit
  std::deque<VerbsRequest*> in_flight;  // sends whose work requests are posted
  std::deque<CtrlMessage> credits;      // credits that arrived before their send
  std::deque<Outgoing> backlog;         // waiting for send-queue room, in order
  uint64_t next_send_seq = 0, next_recv_seq = 0;
  SideChannelReader side_channel;
  bool closed = false;  // the peer is gone: no new requests; posted writes may still finish
  bool failed = false;  // no more requests at all
  bool socket_broken = false;
  TransportFailure failure;
  uint32_t psn = 0;  // the first packet sequence number of this side's sends
};

// A queue-pair exchange on first use, over a non-blocking socket. Each side
// sends its QpInfo, moves its queue pair to RTS once the peer's has come, then
// sends one byte; the connection is usable once the peer's byte has come (its
// queue pair is ready for writes), as in setUpConnection.
struct VerbsTransport::Handshake {
  std::unique_ptr<Connection> conn;
  char out[sizeof(QpInfo) + 1] = {};  // this side's QpInfo, then the ready byte
  size_t out_end = sizeof(QpInfo);    // bytes of `out` to send so far
  size_t sent = 0;
  QpInfo theirs{};
  size_t got = 0;  // bytes of theirs, then of the peer's ready byte
  bool wants_write() const { return sent < out_end; }
};

VerbsTransport::VerbsTransport(const ConnectInfo& info, const Config& config, const std::string& bind_host,
                               const IbPortChoice& port)
    : api_([] {
        std::string why;
        const IbvApi* api = ibvApi(&why);
        if (api == nullptr) throwError(ErrorKind::kConfig, "RDMA transport unavailable: " + why);
        return std::cref(*api);
      }()),
      info_(info),
      config_(config),
      port_(port),
      listener_(std::make_unique<PeerListener>(info, bind_host, sideChannelOptions(config))),
      listen_address_(listener_->address()),
      connections_(static_cast<size_t>(info.size)) {
  auto fail = [&](const std::string& what) {
    throwError(ErrorKind::kConfig, strFormat("rank %d: RDMA device %s: %s failed: %s", info_.rank, port_.device.c_str(),
                                             what.c_str(), std::strerror(errno)));
  };
  int count = 0;
  ibv_device** list = api_.get_device_list(&count);
  if (list == nullptr) fail("ibv_get_device_list");
  for (int i = 0; i < count && context_ == nullptr; ++i) {
    if (port_.device == api_.get_device_name(list[i])) context_ = api_.open_device(list[i]);
  }
  api_.free_device_list(list);
  if (context_ == nullptr) fail("ibv_open_device");
  ibv_device_attr dev{};
  if (api_.query_device(context_, &dev) != 0) fail("ibv_query_device");
  ibv_port_attr pattr{};
  if (api_.query_port(context_, static_cast<uint8_t>(port_.port), &pattr) != 0) fail("ibv_query_port");
  active_mtu_ = pattr.active_mtu;
  lid_ = pattr.lid;
  max_msg_bytes_ = std::min<uint64_t>(pattr.max_msg_sz != 0 ? pattr.max_msg_sz : (1ull << 31), 1ull << 30);
  max_mr_bytes_ = dev.max_mr_size;
  if (port_.gid_index >= 0) {
    ibv_gid gid{};
    if (api_.query_gid(context_, static_cast<uint8_t>(port_.port), port_.gid_index, &gid) != 0) fail("ibv_query_gid");
    std::memcpy(gid_, gid.raw, sizeof(gid_));
  }
  // Respect what the device allows: PVRDMA and rxe have far smaller queues than mlx5.
  sq_depth_ = std::max(4, std::min(kWantSendQueue, dev.max_qp_wr));
  recv_slots_ = std::max(4, std::min(kWantRecvSlots, dev.max_qp_wr));
  send_slots_ = std::max(2, std::min(kWantSendSlots, sq_depth_ / 2));
  const int peers = info_.size - 1;
  pd_ = api_.alloc_pd(context_);
  if (pd_ == nullptr) fail("ibv_alloc_pd");
  channel_ = api_.create_comp_channel(context_);
  if (channel_ == nullptr) fail("ibv_create_comp_channel");
  setNonBlocking(channel_->fd, true);
  int cqe = std::min(dev.max_cqe, std::max(64, peers * (recv_slots_ + sq_depth_) + 16));
  cq_ = api_.create_cq(context_, cqe, nullptr, channel_, 0);
  if (cq_ == nullptr) fail(strFormat("ibv_create_cq(%d entries)", cqe));
  const size_t ctrl_bytes =
      static_cast<size_t>(std::max(peers, 1)) * static_cast<size_t>(recv_slots_ + send_slots_) * kCtrlBytes;
  ctrl_memory_ = static_cast<char*>(std::aligned_alloc(4096, (ctrl_bytes + 4095) / 4096 * 4096));
  if (ctrl_memory_ == nullptr) throwError(ErrorKind::kGeneric, "out of memory for RDMA control slots");
  std::memset(ctrl_memory_, 0, ctrl_bytes);
  ctrl_mr_ = api_.reg_mr(pd_, ctrl_memory_, ctrl_bytes, IBV_ACCESS_LOCAL_WRITE);
  if (ctrl_mr_ == nullptr) {
    fail(
        strFormat("registering %zu bytes of control slots (if 'Cannot allocate memory': raise the "
                  "locked-memory limit, ulimit -l)",
                  ctrl_bytes));
  }
  auto reg = [this](MrCache::Entry& e, std::string* why) {
    const size_t len = e.end - e.start;
    if (len > max_mr_bytes_) {
      *why = strFormat("a buffer of %zu bytes exceeds the device's largest registration (max_mr_size %llu)", len,
                       static_cast<unsigned long long>(max_mr_bytes_));
      return false;
    }
    void* addr = reinterpret_cast<void*>(e.start);
    ibv_mr* mr = api_.reg_mr(pd_, addr, len, kAccessRemote);
    if (mr == nullptr && !e.writable && (errno == EFAULT || errno == EACCES)) {
      mr = api_.reg_mr(pd_, addr, len, 0);  // read-only memory can still be sent from
    } else if (mr != nullptr) {
      e.writable = true;
    }
    if (mr == nullptr) {
      int err = errno;
      *why = strFormat("registering %zu bytes of memory with the RDMA device failed: %s", len, std::strerror(err));
      if (err == ENOMEM || err == EAGAIN) {
        *why +=
            " (the locked-memory limit is too low: raise it with `ulimit -l unlimited`, "
            "LimitMEMLOCK=infinity in systemd, or --ulimit memlock=-1 in Docker)";
      }
      return false;
    }
    e.handle = mr;
    e.lkey = mr->lkey;
    e.rkey = mr->rkey;
    return true;
  };
  auto dereg = [this](MrCache::Entry& e) { api_.dereg_mr(static_cast<ibv_mr*>(e.handle)); };
  mr_cache_ = std::make_unique<MrCache>(reg, dereg, config_.ib_mr_cache_bytes);
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  RCOLL_INFO("rank %d: ib transport on %s:%d (GID %s, MTU %s, max_qp_wr %d, max_msg %llu), handshakes at %s",
             info_.rank, port_.device.c_str(), port_.port, port_.gid_reason.c_str(), mtuName(active_mtu_),
             dev.max_qp_wr, static_cast<unsigned long long>(max_msg_bytes_), listen_address_.c_str());
}

VerbsTransport::~VerbsTransport() {
  for (auto& h : handshakes_) connections_[static_cast<size_t>(h->conn->peer)] = std::move(h->conn);
  for (auto& c : connections_) {
    if (!c) continue;
    if (c->qp != nullptr) api_.destroy_qp(c->qp);
    if (c->fd >= 0) ::close(c->fd);
  }
  mr_cache_.reset();  // deregisters while the protection domain is alive
  if (ctrl_mr_ != nullptr) api_.dereg_mr(ctrl_mr_);
  if (cq_ != nullptr) {
    if (unacked_cq_events_ > 0) api_.ack_cq_events(cq_, unacked_cq_events_);
    api_.destroy_cq(cq_);
  }
  if (channel_ != nullptr) api_.destroy_comp_channel(channel_);
  if (pd_ != nullptr) api_.dealloc_pd(pd_);
  if (context_ != nullptr) api_.close_device(context_);
  std::free(ctrl_memory_);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

bool VerbsTransport::connected(int peer) const {
  return peer >= 0 && peer < info_.size && connections_[static_cast<size_t>(peer)] != nullptr;
}

void VerbsTransport::connect(int peer, const std::string& address, Deadline deadline) {
  setUpConnection(peer, dialPeer(info_, peer, address, deadline, sideChannelOptions(config_)), deadline);
}

int VerbsTransport::accept(Deadline deadline) {
  if (on_demand_.started()) {
    auto adopt = [&](OnDemandPeers<VerbsRequest>::Outcome& o) {
      if (on_demand_.onDemand(o.peer)) return adoptOutcome(o);
      if (o.fds.size() != 1) throwError(o.failure.kind, o.failure.message);
      setUpConnection(o.peer, o.fds[0], deadline);
    };
    return on_demand_.acceptSetupPeer(*this, info_, deadline, adopt);
  }
  std::vector<bool> connected(static_cast<size_t>(info_.size));
  for (size_t i = 0; i < connected.size(); ++i)
    connected[i] = connections_[i] != nullptr || !serves(static_cast<int>(i));
  int fd = -1;
  int peer = listener_->accept(deadline, connected, &fd);
  setUpConnection(peer, fd, deadline);
  return peer;
}

// Creates the queue pair, swaps its coordinates with the peer over the
// authenticated socket and brings it to RTS. Both sides send before they
// receive (the messages are small, so neither blocks), then swap one byte once
// their queue pair is ready, so that no write reaches a queue pair still in INIT.
void VerbsTransport::setUpConnection(int peer, int fd, Deadline deadline) {
  auto fail = [&](const std::string& what, Connection* c) {
    if (c != nullptr) api_.destroy_qp(c->qp);
    ::close(fd);
    throwError(ErrorKind::kPeer,
               strFormat("rank %d: setting up the RDMA connection to rank %d: %s", info_.rank, peer, what.c_str()));
  };
  std::string why;
  std::unique_ptr<Connection> c = createQp(peer, fd, &why);
  if (!c) fail(why, nullptr);
  const QpInfo mine = describeQp(*c);
  QpInfo theirs{};
  if (!sendAll(fd, &mine, sizeof(mine), deadline, &why) || !recvAll(fd, &theirs, sizeof(theirs), deadline, &why)) {
    fail("exchanging queue pair numbers: " + why, c.get());
  }
  if (!connectQp(*c, theirs, &why)) fail(why, c.get());
  char ready = 1, their_ready = 0;
  if (!sendAll(fd, &ready, 1, deadline, &why) || !recvAll(fd, &their_ready, 1, deadline, &why)) {
    fail("waiting for the peer's queue pair: " + why, c.get());
  }
  setNonBlocking(fd, true);
  connections_[static_cast<size_t>(peer)] = std::move(c);
}

// A queue pair for `peer` in INIT, its receive slots posted; the connection
// owns `fd` from here on (null: failed, fd still the caller's, `why` says why).
std::unique_ptr<VerbsTransport::Connection> VerbsTransport::createQp(int peer, int fd, std::string* why) {
  auto c = std::make_unique<Connection>();
  c->peer = peer;
  auto fail = [&](const char* what) {
    *why = strFormat("%s failed: %s", what, std::strerror(errno));
    if (c->qp != nullptr) api_.destroy_qp(c->qp);
    return nullptr;
  };
  ibv_qp_init_attr init{};
  init.send_cq = cq_;
  init.recv_cq = cq_;
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = static_cast<uint32_t>(sq_depth_);
  init.cap.max_recv_wr = static_cast<uint32_t>(recv_slots_);
  init.cap.max_send_sge = 1;
  init.cap.max_recv_sge = 1;
  init.sq_sig_all = 1;
  errno = 0;
  c->qp = api_.create_qp(pd_, &init);
  if (c->qp == nullptr) return fail("ibv_create_qp");
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = static_cast<uint8_t>(port_.port);
  attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
  if (api_.modify_qp(c->qp, &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) != 0) {
    return fail("moving the queue pair to INIT");
  }
  // Control slots of this peer: a fixed slice of the registered block.
  const size_t peer_index = static_cast<size_t>(peer < info_.rank ? peer : peer - 1);
  char* base = ctrl_memory_ + peer_index * static_cast<size_t>(recv_slots_ + send_slots_) * kCtrlBytes;
  for (int i = 0; i < recv_slots_; ++i) {
    c->recv_slots.push_back(std::make_unique<CtrlSlot>(WrOwner::kCtrlRecv, c.get(), base));
    base += kCtrlBytes;
    postRecvSlot(*c, *c->recv_slots.back());
    if (c->failed) return fail("posting receive slots");
  }
  for (int i = 0; i < send_slots_; ++i) {
    c->send_slots.push_back(std::make_unique<CtrlSlot>(WrOwner::kCtrlSend, c.get(), base));
    c->free_send_slots.push_back(c->send_slots.back().get());
    base += kCtrlBytes;
  }
  c->psn = static_cast<uint32_t>(std::random_device{}() & 0xffffff);
  c->fd = fd;
  return c;
}

VerbsTransport::QpInfo VerbsTransport::describeQp(const Connection& c) const {
  QpInfo mine{};
  mine.magic = kQpInfoMagic;
  mine.rank = static_cast<uint32_t>(info_.rank);
  mine.qpn = c.qp->qp_num;
  mine.psn = c.psn;
  mine.lid = lid_;
  mine.ethernet = port_.ethernet ? 1 : 0;
  mine.mtu = static_cast<uint8_t>(active_mtu_);
  std::memcpy(mine.gid, gid_, sizeof(gid_));
  return mine;
}

// With the peer's QpInfo: checks it, then RTR and RTS.
bool VerbsTransport::connectQp(Connection& c, const QpInfo& theirs, std::string* why) {
  if (theirs.magic != kQpInfoMagic || theirs.rank != static_cast<uint32_t>(c.peer)) {
    *why = "the peer sent no valid queue pair information (another rcoll version?)";
    return false;
  }
  if (theirs.ethernet != (port_.ethernet ? 1 : 0)) {
    *why = "one rank uses RoCE (Ethernet) and the other InfiniBand: select matching ports with RCOLL_IB_HCA";
    return false;
  }
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_RTR;
  attr.path_mtu = static_cast<ibv_mtu>(std::min<int>(active_mtu_, theirs.mtu));  // min of both sides
  attr.dest_qp_num = theirs.qpn;
  attr.rq_psn = theirs.psn;
  attr.max_dest_rd_atomic = 1;
  attr.min_rnr_timer = 12;  // 0.64 ms before a sender retries into a full receive queue
  attr.ah_attr.port_num = static_cast<uint8_t>(port_.port);
  attr.ah_attr.dlid = theirs.lid;
  if (port_.gid_index >= 0) {  // RoCE always; InfiniBand when asked for global routing
    attr.ah_attr.is_global = 1;
    std::memcpy(attr.ah_attr.grh.dgid.raw, theirs.gid, sizeof(theirs.gid));
    attr.ah_attr.grh.sgid_index = static_cast<uint8_t>(port_.gid_index);
    attr.ah_attr.grh.hop_limit = 64;
  }
  if (api_.modify_qp(c.qp, &attr,
                     IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER) != 0) {
    *why = strFormat(
        "moving the queue pair to RTR failed: %s (GID index %d, MTU %s; check RCOLL_IB_GID_INDEX and that "
        "both ports are on one network)",
        std::strerror(errno), port_.gid_index, mtuName(attr.path_mtu));
    return false;
  }
  attr = ibv_qp_attr{};
  attr.qp_state = IBV_QPS_RTS;
  attr.sq_psn = c.psn;
  attr.timeout = static_cast<uint8_t>(config_.ib_timeout);
  attr.retry_cnt = static_cast<uint8_t>(config_.ib_retry_cnt);
  attr.rnr_retry = 7;  // infinite: a full receive queue only delays control messages
  attr.max_rd_atomic = 1;
  if (api_.modify_qp(c.qp, &attr,
                     IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                         IBV_QP_MAX_QP_RD_ATOMIC) != 0) {
    *why = strFormat("moving the queue pair to RTS failed: %s", std::strerror(errno));
    return false;
  }
  RCOLL_TRACE("rank %d: RDMA connection to rank %d: qpn %u -> %u, MTU %s", info_.rank, c.peer, c.qp->qp_num, theirs.qpn,
              mtuName(std::min<int>(active_mtu_, theirs.mtu)));
  return true;
}

// --- connections on demand ----------------------------------------------------

void VerbsTransport::connectOnDemand(const std::vector<std::string>& addresses) {
  if (std::all_of(addresses.begin(), addresses.end(), [](const std::string& a) { return a.empty(); })) return;
  on_demand_.start(std::make_unique<OnDemandConnector>(info_, std::move(listener_), addresses,
                                                       sideChannelOptions(config_), 1, config_.connect_timeout),
                   info_.size);
}

// What the connector finished, and the handshakes' sockets: cheap when
// nothing happened (the connector's flag; no handshake, no system call).
void VerbsTransport::serviceOnDemand() {
  if (!on_demand_.started()) return;
  for (OnDemandPeers<VerbsRequest>::Outcome& o : on_demand_.take(/*in_setup=*/false)) adoptOutcome(o);
  for (size_t i = 0; i < handshakes_.size();) {
    const std::optional<std::string> ended = stepHandshake(*handshakes_[i]);
    if (ended) {
      endHandshake(i, *ended);
    } else {
      ++i;
    }
  }
}

void VerbsTransport::adoptOutcome(OnDemandPeers<VerbsRequest>::Outcome& o) {
  if (o.fds.empty()) {
    const std::deque<VerbsRequest*> waiting = on_demand_.setUnreachable(o.peer, o.failure);
    if (o.failure.kind == ErrorKind::kPeer || o.failure.kind == ErrorKind::kTimeout) markLost(o.peer);
    for (VerbsRequest* r : waiting) finish(r, Request::State::kFailed, &o.failure);
    return;
  }
  const bool handshaking = std::any_of(handshakes_.begin(), handshakes_.end(),
                                       [&](const std::unique_ptr<Handshake>& h) { return h->conn->peer == o.peer; });
  if (aborted_ || connected(o.peer) || handshaking) {  // abortPeers() failed what waited
    for (int fd : o.fds) ::close(fd);
    return;
  }
  std::string why;
  std::unique_ptr<Connection> c = createQp(o.peer, o.fds[0], &why);
  if (!c) {
    ::close(o.fds[0]);  // the peer's exchange ends at EOF
    const TransportFailure failure{
        ErrorKind::kGeneric,
        strFormat("setting up the RDMA connection to rank %d on first use: %s", o.peer, why.c_str())};
    for (VerbsRequest* r : on_demand_.setUnreachable(o.peer, failure)) {
      finish(r, Request::State::kFailed, &failure);
    }
    return;
  }
  setNonBlocking(c->fd, true);
  auto h = std::make_unique<Handshake>();
  const QpInfo mine = describeQp(*c);
  std::memcpy(h->out, &mine, sizeof(mine));
  h->conn = std::move(c);
  handshakes_.push_back(std::move(h));
  if (std::optional<std::string> ended = stepHandshake(*handshakes_.back())) {
    endHandshake(handshakes_.size() - 1, *ended);
  }
}

// Sends what it can, reads what came, never waits. Returns nothing while the
// exchange goes on; once it ended, "" (connected) or why it failed.
std::optional<std::string> VerbsTransport::stepHandshake(Handshake& h) {
  const int fd = h.conn->fd;
  const int peer = h.conn->peer;
  for (;;) {
    while (h.wants_write()) {
      const ssize_t n = ::send(fd, h.out + h.sent, h.out_end - h.sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        h.sent += static_cast<size_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      return "sending this rank's queue pair numbers failed: " + errnoText(errno);
    }
    // Exactly the QpInfo and the ready byte: what follows is the side channel's.
    const size_t want = sizeof(QpInfo) + 1;
    if (h.got == want) return h.wants_write() ? std::nullopt : std::optional<std::string>("");
    if (h.got == sizeof(QpInfo) && h.out_end == sizeof(QpInfo)) {
      std::string why;
      if (!connectQp(*h.conn, h.theirs, &why)) return why;
      h.out[sizeof(QpInfo)] = 1;
      h.out_end = sizeof(h.out);
      continue;  // send the ready byte
    }
    char ready = 0;
    char* into = h.got < sizeof(QpInfo) ? reinterpret_cast<char*>(&h.theirs) + h.got : &ready;
    const size_t len = h.got < sizeof(QpInfo) ? sizeof(QpInfo) - h.got : 1;
    const ssize_t n = ::recv(fd, into, len, MSG_DONTWAIT);
    if (n > 0) {
      h.got += static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return std::nullopt;
    if (n == 0) {
      return strFormat("rank %d closed the connection during the queue pair exchange (its process exited or failed)",
                       peer);
    }
    return "reading the peer's queue pair numbers failed: " + errnoText(errno);
  }
}

// handshakes_[index]'s connection joins the others: connected, its waiting
// requests posted in order, or failed with them (the peer's requests fail
// from now on).
void VerbsTransport::endHandshake(size_t index, const std::string& failure) {
  std::unique_ptr<Connection> conn = std::move(handshakes_[index]->conn);
  handshakes_.erase(handshakes_.begin() + static_cast<std::ptrdiff_t>(index));
  const int peer = conn->peer;
  Connection& c = *conn;
  connections_[static_cast<size_t>(peer)] = std::move(conn);
  std::deque<VerbsRequest*> waiting = on_demand_.release(peer);
  if (failure.empty()) {
    RCOLL_INFO("rank %d: RDMA connection to rank %d made on first use", info_.rank, peer);
    for (VerbsRequest* r : waiting) post(r);
    return;
  }
  c.socket_broken = true;
  failConnection(c, ErrorKind::kPeer,
                 strFormat("setting up the RDMA connection to rank %d on first use: %s", peer, failure.c_str()));
  for (VerbsRequest* r : waiting) finish(r, Request::State::kFailed, &c.failure);
}

void VerbsTransport::postRecvSlot(Connection& c, CtrlSlot& slot) {
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uintptr_t>(slot.buf);
  sge.length = kCtrlBytes;
  sge.lkey = ctrl_mr_->lkey;
  ibv_recv_wr wr{};
  wr.wr_id = reinterpret_cast<uintptr_t>(static_cast<WrOwner*>(&slot));
  wr.sg_list = &sge;
  wr.num_sge = 1;
  ibv_recv_wr* bad = nullptr;
  int rc = postRecv(c.qp, &wr, &bad);
  if (rc != 0) {
    failConnection(c, ErrorKind::kPeer,
                   strFormat("posting a receive for rank %d failed: %s", c.peer, std::strerror(rc)));
  }
}

// --- memory --------------------------------------------------------------

MemoryHandle VerbsTransport::registerMemory(void* data, size_t bytes) {
  std::string why;
  MrCache::Entry* e = mr_cache_->acquire(data, bytes, /*writable=*/true, &why);
  if (e == nullptr) throwError(ErrorKind::kGeneric, strFormat("rank %d: %s", info_.rank, why.c_str()));
  return e;
}

MemoryHandle VerbsTransport::registerDeviceMemory(void* data, size_t bytes, int dmabuf_fd, uint64_t dmabuf_offset,
                                                  std::string* why) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t start = reinterpret_cast<uintptr_t>(data);
  // The cache looks registrations up by whole pages: a range that is not
  // page-aligned would be found for neighbouring bytes it does not cover.
  if (start % page != 0 || bytes % page != 0 || bytes == 0) {
    *why = strFormat("device memory at %p (%zu bytes) is not page-aligned", data, bytes);
    return nullptr;
  }
  if (bytes > max_mr_bytes_) {
    *why = strFormat("%zu bytes exceed the device's largest registration (max_mr_size %llu)", bytes,
                     static_cast<unsigned long long>(max_mr_bytes_));
    return nullptr;
  }
  ibv_mr* mr = nullptr;
  if (dmabuf_fd >= 0) {
    if (api_.reg_dmabuf_mr == nullptr) {
      *why = "ibv_reg_dmabuf_mr is missing from " + api_.library + " (rdma-core 34 or newer has it)";
      return nullptr;
    }
    // iova = the device address: work requests name the memory by it, as for host memory.
    mr = api_.reg_dmabuf_mr(pd_, dmabuf_offset, bytes, static_cast<uint64_t>(start), dmabuf_fd, kAccessRemote);
    if (mr == nullptr) {
      const int err = errno;
      *why = strFormat("ibv_reg_dmabuf_mr on %s failed: %s%s", port_.device.c_str(), std::strerror(err),
                       err == EOPNOTSUPP || err == ENOSYS || err == EPROTONOSUPPORT
                           ? " (the RDMA driver does not take dma-bufs)"
                           : "");
      return nullptr;
    }
  } else {
    mr = api_.reg_mr(pd_, data, bytes, kAccessRemote);
    if (mr == nullptr) {
      const int err = errno;
      *why = strFormat("ibv_reg_mr of device memory on %s failed: %s (needs the nvidia-peermem module)",
                       port_.device.c_str(), std::strerror(err));
      return nullptr;
    }
  }
  return mr_cache_->adopt(start, start + bytes, mr, mr->lkey, mr->rkey);
}

void VerbsTransport::deregisterMemory(MemoryHandle handle) {
  if (handle != nullptr) mr_cache_->release(static_cast<MrCache::Entry*>(handle));
}

void VerbsTransport::invalidateMemory(const void* data, size_t bytes) { mr_cache_->invalidate(data, bytes); }

bool VerbsTransport::acquireMemory(VerbsRequest* r, bool writable) {
  if (r->bytes == 0) return true;
  std::string why;
  r->mr = mr_cache_->acquire(r->data, r->bytes, writable, &why);
  if (r->mr != nullptr) return true;
  TransportFailure f{ErrorKind::kGeneric, why};
  finish(r, Request::State::kFailed, &f);
  return false;
}

// --- requests --------------------------------------------------------------

void VerbsTransport::maybeRecycle(VerbsRequest* r) { requests_.settle(r); }

void VerbsTransport::releaseRegistration(VerbsRequest* r) {
  if (r->mr != nullptr) {  // the NIC is done with the memory
    mr_cache_->release(r->mr);
    r->mr = nullptr;
  }
}

void VerbsTransport::finish(VerbsRequest* r, Request::State state, const TransportFailure* why) {
  if (requests_.finish(r, state, why)) progressed_ = true;
}

void VerbsTransport::release(Request* request) { requests_.release(request); }

TransportFailure VerbsTransport::failure(Request* request) const { return requests_.failure(request); }

Request* VerbsTransport::isend(int peer, const WireHeader& header, const void* data, size_t bytes) {
  return post(requests_.take(true, peer, header, data, bytes));
}

Request* VerbsTransport::irecv(int peer, const WireHeader& expected, void* data, size_t bytes) {
  return post(requests_.take(false, peer, expected, data, bytes));
}

Request* VerbsTransport::post(VerbsRequest* r) {
  // A peer connected on demand: its first message asks the connector for it;
  // until its queue pair is up, its messages wait there in order.
  if (!aborted_ && on_demand_.hold(r, connected(r->peer))) return r;
  Connection* c = connected(r->peer) ? connections_[static_cast<size_t>(r->peer)].get() : nullptr;
  if (c == nullptr || c->failed || c->closed || aborted_) {
    TransportFailure f = c && (c->failed || c->closed)
                             ? c->failure
                             : TransportFailure{aborted_ ? ErrorKind::kAborted : ErrorKind::kPeer,
                                                strFormat("no connection to rank %d", r->peer)};
    r->state = Request::State::kFailed;
    r->why = f;
    return r;
  }
  if (r->is_send) {
    r->seq = c->next_send_seq++;
    c->unmatched.push_back(r);
    matchCredits(*c);
  } else {
    r->seq = c->next_recv_seq++;
    if (!acquireMemory(r, /*writable=*/true)) return r;
    c->recvs.push_back(r);
    Outgoing credit;
    credit.message.type = kCredit;
    credit.message.seq = r->seq;
    credit.message.addr = reinterpret_cast<uintptr_t>(r->data);
    credit.message.rkey = r->mr != nullptr ? r->mr->rkey : 0;
    credit.message.bytes = r->bytes;
    credit.message.header = r->header;
    c->backlog.push_back(credit);
  }
  flush(*c);
  return r;
}

// Pairs sends with the credits their receives sent, in order. The header check
// happens here, before any payload moves.
void VerbsTransport::matchCredits(Connection& c) {
  while (!c.failed && !c.unmatched.empty() && !c.credits.empty()) {
    VerbsRequest* r = c.unmatched.front();
    CtrlMessage credit = c.credits.front();
    c.unmatched.pop_front();
    c.credits.pop_front();
    if (credit.seq != r->seq) {
      failConnection(c, ErrorKind::kPeer,
                     strFormat("rank %d's receive #%llu arrived where send #%llu was next (protocol error)", c.peer,
                               static_cast<unsigned long long>(credit.seq), static_cast<unsigned long long>(r->seq)));
      finish(r, Request::State::kFailed, &c.failure);
      return;
    }
    // checkHeader words it as the receiver would: it names both ranks and ops.
    std::string bad = checkHeader(credit.header, r->header, c.peer);
    if (bad.empty() && credit.bytes != r->bytes) {
      bad = strFormat("rank %d expects %llu bytes where rank %d sends %llu", c.peer,
                      static_cast<unsigned long long>(credit.bytes), info_.rank,
                      static_cast<unsigned long long>(r->bytes));
    }
    if (!bad.empty()) {
      Outgoing notice;
      notice.message.type = kMismatch;
      notice.message.seq = r->seq;
      notice.message.header = r->header;
      c.backlog.push_back(notice);
      flush(c);  // best effort: the peer then fails with its own view of the mismatch
      failConnection(c, ErrorKind::kMismatch, bad);
      finish(r, Request::State::kFailed, &c.failure);
      return;
    }
    r->remote_addr = credit.addr;
    r->rkey = credit.rkey;
    if (!acquireMemory(r, /*writable=*/false)) continue;
    Outgoing item;
    item.request = r;
    if (r->bytes == 0) {
      item.message.type = kEmpty;
      item.message.seq = r->seq;
    }
    c.backlog.push_back(item);
  }
}

// Posts what waits in the backlog, in order, while the send queue has room.
void VerbsTransport::flush(Connection& c) {
  while (!c.backlog.empty() && !c.failed) {
    Outgoing& item = c.backlog.front();
    bool posted = (item.request != nullptr && item.request->bytes > 0) ? postData(c, item.request) : postCtrl(c, item);
    if (!posted) return;
    c.backlog.pop_front();
  }
}

bool VerbsTransport::postCtrl(Connection& c, const Outgoing& item) {
  if (c.free_send_slots.empty() || c.sq_used >= sq_depth_) return false;
  CtrlSlot* slot = c.free_send_slots.back();
  std::memcpy(slot->buf, &item.message, sizeof(item.message));
  ibv_sge sge{};
  sge.addr = reinterpret_cast<uintptr_t>(slot->buf);
  sge.length = sizeof(CtrlMessage);
  sge.lkey = ctrl_mr_->lkey;
  ibv_send_wr wr{};
  wr.wr_id = reinterpret_cast<uintptr_t>(static_cast<WrOwner*>(slot));
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.opcode = IBV_WR_SEND;
  wr.send_flags = IBV_SEND_SIGNALED;
  ibv_send_wr* bad = nullptr;
  int rc = postSend(c.qp, &wr, &bad);
  if (rc != 0) {
    failConnection(c, ErrorKind::kPeer, strFormat("posting a send to rank %d failed: %s", c.peer, std::strerror(rc)));
    return false;
  }
  c.free_send_slots.pop_back();
  ++c.sq_used;
  slot->request = item.request;  // a zero-byte send completes with this message
  if (item.request != nullptr) {
    item.request->holds = 1;
    c.in_flight.push_back(item.request);
  }
  return true;
}

bool VerbsTransport::postData(Connection& c, VerbsRequest* r) {
  const size_t pieces = static_cast<size_t>((r->bytes + max_msg_bytes_ - 1) / max_msg_bytes_);
  if (c.sq_used + static_cast<int>(pieces) > sq_depth_) return false;
  for (size_t i = 0; i < pieces; ++i) {
    const size_t offset = i * max_msg_bytes_;
    const size_t len = std::min<size_t>(max_msg_bytes_, r->bytes - offset);
    ibv_sge sge{};
    sge.addr = reinterpret_cast<uintptr_t>(r->data + offset);
    sge.length = static_cast<uint32_t>(len);
    sge.lkey = r->mr->lkey;
    ibv_send_wr wr{};
    wr.wr_id = reinterpret_cast<uintptr_t>(static_cast<WrOwner*>(r));
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.wr.rdma.remote_addr = r->remote_addr + offset;
    wr.wr.rdma.rkey = r->rkey;
    if (i + 1 == pieces) {
      wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;  // the last piece completes the receive
      wr.imm_data = htonl(static_cast<uint32_t>(r->seq));
    } else {
      wr.opcode = IBV_WR_RDMA_WRITE;
    }
    ibv_send_wr* bad = nullptr;
    int rc = postSend(c.qp, &wr, &bad);
    if (rc != 0) {
      failConnection(c, ErrorKind::kPeer,
                     strFormat("posting an RDMA write to rank %d failed: %s", c.peer, std::strerror(rc)));
      if (i == 0) finish(r, Request::State::kFailed, &c.failure);
      return false;
    }
    if (i == 0) c.in_flight.push_back(r);
    ++r->holds;
    ++c.sq_used;
  }
  return true;
}

// --- completions -----------------------------------------------------------

int VerbsTransport::pollCompletions() {
  int total = 0;
  ibv_wc wcs[32];
  for (;;) {
    int n = pollCq(cq_, 32, wcs);
    if (n < 0) throwError(ErrorKind::kGeneric, "ibv_poll_cq failed");
    for (int i = 0; i < n; ++i) onCompletion(wcs[i]);
    total += n;
    if (n < 32) return total;
  }
}

std::string VerbsTransport::completionError(const Connection& c, const ibv_wc& wc) const {
  std::string what =
      strFormat("%s (status %d, vendor error 0x%x)", api_.wc_status_str(wc.status), wc.status, wc.vendor_err);
  switch (wc.status) {
    case IBV_WC_RETRY_EXC_ERR:
      return strFormat(
          "rank %d stopped acknowledging RDMA traffic: %s. The peer died, or the path between the two "
          "ports is broken: check RCOLL_IB_GID_INDEX (this rank uses %s), the MTU, and IP routing "
          "between the RoCE interfaces",
          c.peer, what.c_str(), port_.gid_reason.c_str());
    case IBV_WC_RNR_RETRY_EXC_ERR:
      return strFormat("rank %d posted no receive in time: %s", c.peer, what.c_str());
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_LOC_PROT_ERR:
      return strFormat("rank %d refused an RDMA write (%s): memory registration problem", c.peer, what.c_str());
    default:
      return strFormat("RDMA transfer with rank %d failed: %s", c.peer, what.c_str());
  }
}

void VerbsTransport::onCompletion(const ibv_wc& wc) {
  auto* owner = reinterpret_cast<WrOwner*>(static_cast<uintptr_t>(wc.wr_id));
  if (owner->kind == WrOwner::kCtrlRecv) {
    auto* slot = static_cast<CtrlSlot*>(owner);
    Connection& c = *slot->conn;
    if (wc.status != IBV_WC_SUCCESS) {
      if (!c.failed) failConnection(c, ErrorKind::kPeer, completionError(c, wc));
      return;
    }
    if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
      postRecvSlot(c, *slot);
      onData(c, ntohl(wc.imm_data));
    } else {
      char message[kCtrlBytes];
      std::memcpy(message, slot->buf, sizeof(message));  // the slot is reposted before the message is handled
      postRecvSlot(c, *slot);
      onControl(c, message);
    }
    return;
  }
  if (owner->kind == WrOwner::kCtrlSend) {
    auto* slot = static_cast<CtrlSlot*>(owner);
    Connection& c = *slot->conn;
    --c.sq_used;
    c.free_send_slots.push_back(slot);
    VerbsRequest* r = slot->request;
    slot->request = nullptr;
    if (r != nullptr) {
      --r->holds;
      auto it = std::find(c.in_flight.begin(), c.in_flight.end(), r);
      if (it != c.in_flight.end()) c.in_flight.erase(it);
    }
    if (wc.status != IBV_WC_SUCCESS) {
      if (!c.failed) failConnection(c, ErrorKind::kPeer, completionError(c, wc));
      if (r != nullptr) finish(r, Request::State::kFailed, &c.failure);
    } else if (r != nullptr) {
      finish(r, Request::State::kDone, nullptr);
    }
    if (r != nullptr) maybeRecycle(r);
    if (c.closed && c.in_flight.empty()) failConnection(c, c.failure.kind, c.failure.message);
    flush(c);
    return;
  }
  auto* r = static_cast<VerbsRequest*>(owner);
  Connection& c = *connections_[static_cast<size_t>(r->peer)];
  --c.sq_used;
  --r->holds;
  if (wc.status != IBV_WC_SUCCESS) {
    if (!c.failed) failConnection(c, ErrorKind::kPeer, completionError(c, wc));
    finish(r, Request::State::kFailed, &c.failure);
  }
  if (r->holds == 0) {
    auto it = std::find(c.in_flight.begin(), c.in_flight.end(), r);
    if (it != c.in_flight.end()) c.in_flight.erase(it);
    finish(r, Request::State::kDone, nullptr);  // no-op if it already failed
    maybeRecycle(r);
  }
  if (c.closed && c.in_flight.empty()) failConnection(c, c.failure.kind, c.failure.message);
  flush(c);
}

void VerbsTransport::onData(Connection& c, uint64_t seq32) {
  if (c.failed) return;
  if (c.recvs.empty() || static_cast<uint32_t>(c.recvs.front()->seq) != static_cast<uint32_t>(seq32)) {
    failConnection(c, ErrorKind::kPeer,
                   strFormat("rank %d wrote data for receive #%llu, which is not the next one (protocol error)", c.peer,
                             static_cast<unsigned long long>(seq32)));
    return;
  }
  VerbsRequest* r = c.recvs.front();
  c.recvs.pop_front();
  finish(r, Request::State::kDone, nullptr);
}

void VerbsTransport::onControl(Connection& c, const char* bytes) {
  if (c.failed) return;
  CtrlMessage m;
  std::memcpy(&m, bytes, sizeof(m));
  switch (m.type) {
    case kCredit:
      c.credits.push_back(m);
      matchCredits(c);
      flush(c);
      return;
    case kEmpty:
      onData(c, m.seq);
      return;
    case kMismatch: {
      std::string bad = c.recvs.empty() ? std::string() : checkHeader(c.recvs.front()->header, m.header, info_.rank);
      if (bad.empty()) bad = strFormat("rank %d reported that its send does not match this rank's receive", c.peer);
      failConnection(c, ErrorKind::kMismatch, bad);
      return;
    }
    default:
      failConnection(
          c, ErrorKind::kPeer,
          strFormat("rank %d sent an unknown control message (type %u): another rcoll version?", c.peer, m.type));
  }
}

// --- side channel, failure ---------------------------------------------------

void VerbsTransport::serviceSideChannel(Connection& c) {
  const SideChannelNews news = c.side_channel.read(c.fd);
  switch (news.kind) {
    case SideChannelNews::Kind::kNothing:
      return;
    case SideChannelNews::Kind::kGarbage:
      failConnection(c, ErrorKind::kPeer, strFormat("rank %d sent garbage on its connection", c.peer));
      return;
    case SideChannelNews::Kind::kClosed:
      c.socket_broken = true;
      pollCompletions();  // what the peer did before it went is already in the completion queue
      peerClosed(c);
      return;
    case SideChannelNews::Kind::kAbort:
      c.socket_broken = true;  // the peer has stopped: no point in answering it
      failConnection(c, news.abort_kind, strFormat("rank %d failed: %s", c.peer, news.text.c_str()), true);
      return;
  }
}

// The peer's process is gone. Receives and unmatched sends can never finish;
// writes already posted may still be acknowledged (the peer may have read them
// and exited before our NIC saw the ack), so they finish or fail on their own.
void VerbsTransport::peerClosed(Connection& c) {
  if (c.failed || c.closed) return;
  markLost(c.peer);
  c.closed = true;
  c.failure = {ErrorKind::kPeer,
               strFormat("rank %d closed its connection (its process exited, crashed or was killed)", c.peer)};
  for (VerbsRequest* r : c.recvs) finish(r, Request::State::kFailed, &c.failure);
  for (VerbsRequest* r : c.unmatched) finish(r, Request::State::kFailed, &c.failure);
  for (Outgoing& item : c.backlog) {
    if (item.request != nullptr) finish(item.request, Request::State::kFailed, &c.failure);
  }
  c.recvs.clear();
  c.unmatched.clear();
  c.backlog.clear();
  if (c.in_flight.empty()) failConnection(c, c.failure.kind, c.failure.message);
}

void VerbsTransport::failConnection(Connection& c, ErrorKind kind, const std::string& message, bool peer_reported) {
  if (c.failed) return;
  if (kind == ErrorKind::kPeer && !peer_reported) markLost(c.peer);
  c.failed = true;
  c.failure = {kind, message};
  // The error state stops the NIC writing into receive buffers before they are
  // handed back, and flushes every posted work request; writes in flight stay
  // listed until their flushed completions return their memory.
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  api_.modify_qp(c.qp, &attr, IBV_QP_STATE);
  for (VerbsRequest* r : c.recvs) finish(r, Request::State::kFailed, &c.failure);
  for (VerbsRequest* r : c.unmatched) finish(r, Request::State::kFailed, &c.failure);
  for (VerbsRequest* r : c.in_flight) finish(r, Request::State::kFailed, &c.failure);
  for (Outgoing& item : c.backlog) {
    if (item.request != nullptr) finish(item.request, Request::State::kFailed, &c.failure);
  }
  c.recvs.clear();
  c.unmatched.clear();
  c.backlog.clear();
  c.credits.clear();
  RCOLL_INFO("rank %d: RDMA connection to rank %d failed: %s", info_.rank, c.peer, message.c_str());
}

// --- progress ---------------------------------------------------------------

void VerbsTransport::progress(std::chrono::milliseconds timeout) {
  const Deadline deadline = std::chrono::steady_clock::now() + timeout;
  progressed_ = false;
  for (;;) {
    serviceOnDemand();
    pollCompletions();
    if (progressed_) return;
    // Completions usually follow within microseconds on real hardware: a short
    // spin saves the sleep and wake-up. Emulated devices (rxe) gain nothing.
    const auto spin_until = std::min(deadline, std::chrono::steady_clock::now() + kSpin);
    while (std::chrono::steady_clock::now() < spin_until) {
      if (pollCompletions() > 0) break;
    }
    if (progressed_) return;
    int wait_ms = millisecondsUntil(deadline);
    if (wait_ms <= 0) return;
    poll_fds_.clear();
    poll_fds_.push_back({wake_fd_, POLLIN, 0});
    if (!prepareSleep(&poll_fds_)) {
      finishSleep(nullptr, 0);
      if (progressed_) return;
      continue;
    }
    int rc = ::poll(poll_fds_.data(), poll_fds_.size(), wait_ms);
    if (rc < 0 && errno != EINTR) throwError(ErrorKind::kGeneric, "poll(): " + errnoText(errno));
    if (rc <= 0) continue;
    finishSleep(poll_fds_.data() + 1, poll_fds_.size() - 1);
    if (poll_fds_[0].revents & POLLIN) {
      drainEventfd(wake_fd_);
      return;  // interrupted: the caller checks why
    }
    if (progressed_) return;
  }
}

Activity VerbsTransport::progressNow() {
  progressed_ = false;
  serviceOnDemand();
  const int completions = pollCompletions();
  return progressed_ ? Activity::kFinished : completions > 0 ? Activity::kMoved : Activity::kIdle;
}

// Arms the completion channel, then looks once more: a completion that came in
// between would otherwise raise no event. progressed_ spans this call and
// finishSleep(), which reports it.
bool VerbsTransport::prepareSleep(std::vector<pollfd>* fds) {
  progressed_ = false;
  poll_peers_.clear();
  if (reqNotifyCq(cq_, 0) != 0) throwError(ErrorKind::kGeneric, "ibv_req_notify_cq failed");
  if (pollCompletions() > 0) return false;
  fds->push_back({channel_->fd, POLLIN, 0});
  for (auto& c : connections_) {
    if (!c || c->failed || c->socket_broken) continue;
    fds->push_back({c->fd, POLLIN, 0});
    poll_peers_.push_back(c.get());
  }
  const size_t before = fds->size();
  if (on_demand_.started()) fds->push_back({on_demand_.readyFd(), POLLIN, 0});
  for (auto& h : handshakes_) {
    fds->push_back({h->conn->fd, static_cast<short>(POLLIN | (h->wants_write() ? POLLOUT : 0)), 0});
  }
  poll_on_demand_ = fds->size() - before;
  return true;
}

// `fds`: the completion channel, then poll_peers_' side channels (none when nobody slept).
Activity VerbsTransport::finishSleep(const pollfd* fds, size_t count) {
  if (count > 0 && (fds[0].revents & POLLIN)) {
    ibv_cq* cq = nullptr;
    void* context = nullptr;
    if (api_.get_cq_event(channel_, &cq, &context) == 0 && ++unacked_cq_events_ >= 64) {
      api_.ack_cq_events(cq_, unacked_cq_events_);  // acking is a lock round trip: batch it
      unacked_cq_events_ = 0;
    }
  }
  for (size_t i = 0; i < poll_peers_.size() && i + 1 < count; ++i) {
    if (fds[i + 1].revents != 0) serviceSideChannel(*poll_peers_[i]);
  }
  for (size_t i = 1 + poll_peers_.size(); i < count && i < 1 + poll_peers_.size() + poll_on_demand_; ++i) {
    if (fds[i].revents != 0) {
      serviceOnDemand();
      break;
    }
  }
  return progressed_ ? Activity::kFinished : Activity::kIdle;
}

void VerbsTransport::interrupt() { signalEventfd(wake_fd_); }

void VerbsTransport::abortPeers(ErrorKind kind, const std::string& message) {
  if (aborted_) return;
  aborted_ = true;
  std::string text = truncateUtf8(message, kMaxAbortText);
  WireHeader h = makeAbortHeader(info_, kind, text.size());
  // Bounded: a peer that stopped reading must not hold this rank's failure up.
  Deadline deadline = std::chrono::steady_clock::now() + kAbortLinger;
  // Peers whose queue pairs are still being swapped see the socket close
  // (their exchange fails); requests that waited for a peer fail here.
  for (auto& h : handshakes_) {
    h->conn->socket_broken = true;
    ::shutdown(h->conn->fd, SHUT_RDWR);
    connections_[static_cast<size_t>(h->conn->peer)] = std::move(h->conn);
  }
  handshakes_.clear();
  const TransportFailure aborted{ErrorKind::kAborted, "the communicator was aborted: " + message};
  for (VerbsRequest* r : on_demand_.stop()) finish(r, Request::State::kFailed, &aborted);
  for (auto& c : connections_) {
    if (!c) continue;
    if (!c->socket_broken) {
      std::string why;
      if (sendAll(c->fd, &h, sizeof(h), deadline, &why)) sendAll(c->fd, text.data(), text.size(), deadline, &why);
      ::shutdown(c->fd, SHUT_WR);  // the socket stays open until the communicator is destroyed
      c->socket_broken = true;
    }
    failConnection(*c, ErrorKind::kAborted, "the communicator was aborted: " + message);
  }
}

}  // namespace rcoll

namespace rcoll {

std::unique_ptr<Transport> makeVerbsTransport(const ConnectInfo& info, const Config& config,
                                              const std::string& bind_host, const IbPortChoice& port) {
  return std::make_unique<VerbsTransport>(info, config, bind_host, port);
}

}  // namespace rcoll
