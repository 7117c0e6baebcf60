// VerbsTransport's completions: each finished work request (a control
// message received or sent, an RDMA write done) moves its request or connection
// on; a failed one fails the connection with what the status means.
#include <arpa/inet.h>

#include <algorithm>
#include <cstring>

#include "rdma/ibv_api.h"
#include "rdma/verbs_transport_internal.h"

namespace rcoll {

using verbs::CtrlMessage;
using verbs::kCredit;
using verbs::kCtrlBytes;
using verbs::kEmpty;
using verbs::kMismatch;

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
    if (r->metered) {
      r->metered = false;
      meter_.ended(c.peer, r->state == Request::State::kDone ? r->bytes : 0);
    }
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

}  // namespace rcoll
