// VerbsTransport's connections made at set-up (verbs_transport_internal.h): a
// queue pair per peer, created, swapped with the peer over the authenticated
// socket and brought to RTS. The steps are shared with connections on demand.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include "log.h"
#include "rdma/ib_device.h"
#include "rdma/ibv_api.h"
#include "rdma/verbs_transport_internal.h"
#include "socket_util.h"

namespace rcoll {

using verbs::kCtrlBytes;
using verbs::mtuName;
using verbs::sideChannelOptions;

namespace {

constexpr uint32_t kQpInfoMagic = 0x50514352;  // "RCQP"

}  // namespace

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
  // RoCE v2 packets are IPv4 or IPv6 by the GIDs at both ends: one of each
  // family never connects (the writes would only time out after every retry).
  if (port_.ethernet && port_.gid_index >= 0 && isIpv4MappedGid(gid_) != isIpv4MappedGid(theirs.gid)) {
    *why = strFormat(
        "this rank's GID %s and the peer's GID %s are of different IP families (one IPv4-mapped, one IPv6), and RoCE "
        "connects only one family: set RCOLL_IB_ADDR_FAMILY (or RCOLL_IB_GID_INDEX) on every rank to one family, or "
        "give the ports' netdevs addresses of one family",
        gidText(gid_).c_str(), gidText(theirs.gid).c_str());
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

}  // namespace rcoll
