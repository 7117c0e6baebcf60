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
using verbs::kRailNote;

// A failed work request fails its connection. A broken path explains it
// (a link failure, rail_endpoint.h) when: no acknowledgement came within the
// retries; work was flushed because the queue pair went to the error state
// for that reason (the flushes may be polled before the error); the send
// could not leave (a local QP operation error: rxe's word for a link that
// went down, which may come before its port reads DOWN); or the port is not
// ACTIVE. The port is read once, for the message and the verdict alike.
void VerbsTransport::failOnCompletion(Connection& c, const ibv_wc& wc) {
  const bool active = portActive();
  const bool link = wc.status == IBV_WC_RETRY_EXC_ERR || wc.status == IBV_WC_WR_FLUSH_ERR ||
                    wc.status == IBV_WC_LOC_QP_OP_ERR || !active;
  failConnection(c, ErrorKind::kPeer, completionError(c, wc, active), false, link);
}

bool VerbsTransport::portActive() const {
  ibv_port_attr attr{};
  return api_.query_port(context_, static_cast<uint8_t>(port_.port), &attr) != 0 || attr.state == IBV_PORT_ACTIVE;
}

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

std::string VerbsTransport::completionError(const Connection& c, const ibv_wc& wc, bool port_active) const {
  // Every message names the port: with several (RCOLL_IB_HCA), the one that failed is what a user checks.
  const std::string port = portName();
  std::string what =
      strFormat("%s (status %d, vendor error 0x%x)", api_.wc_status_str(wc.status), wc.status, wc.vendor_err);
  if (wc.status != IBV_WC_WR_FLUSH_ERR && !port_active) {
    return strFormat("RDMA transfer with rank %d failed: the port %s is not ACTIVE (its link is down): %s", c.peer,
                     port.c_str(), what.c_str());
  }
  switch (wc.status) {
    case IBV_WC_RETRY_EXC_ERR:
      return strFormat(
          "rank %d stopped acknowledging RDMA traffic on the port %s: %s. The peer died, or the path between the two "
          "ports is broken: check RCOLL_IB_GID_INDEX (this rank uses %s), the MTU, and IP routing "
          "between the RoCE interfaces",
          c.peer, port.c_str(), what.c_str(), port_.gid_reason.c_str());
    case IBV_WC_RNR_RETRY_EXC_ERR:
      return strFormat("rank %d posted no receive in time (port %s): %s", c.peer, port.c_str(), what.c_str());
    case IBV_WC_REM_ACCESS_ERR:
    case IBV_WC_LOC_PROT_ERR:
      return strFormat("rank %d refused an RDMA write over the port %s (%s): memory registration problem", c.peer,
                       port.c_str(), what.c_str());
    default:
      return strFormat("RDMA transfer with rank %d over the port %s failed: %s", c.peer, port.c_str(), what.c_str());
  }
}

void VerbsTransport::onCompletion(const ibv_wc& wc) {
  auto* owner = reinterpret_cast<WrOwner*>(static_cast<uintptr_t>(wc.wr_id));
  if (owner->kind == WrOwner::kCtrlRecv) {
    auto* slot = static_cast<CtrlSlot*>(owner);
    Connection& c = *slot->conn;
    --c.recv_posted;
    if (wc.status != IBV_WC_SUCCESS) {
      if (!c.failed) failOnCompletion(c, wc);
    } else if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
      if (!c.failed) postRecvSlot(c, *slot);
      const uint32_t imm = ntohl(wc.imm_data);
      onData(c, imm >> 24, imm & 0xFFFFFFu);
    } else {
      char message[kCtrlBytes];
      std::memcpy(message, slot->buf, sizeof(message));  // the slot is reposted before the message is handled
      if (!c.failed) postRecvSlot(c, *slot);
      onControl(c, message);
    }
    // A link failure's drain ends with the last posted slot's completion
    // (flushed, or what arrived before the error state).
    if (c.draining && c.recv_posted == 0) endLinkFailure(c);
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
      if (!c.failed) failOnCompletion(c, wc);
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
    if (!c.failed) failOnCompletion(c, wc);
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

// A message arrived on `stream` (while a link failure drains too: it counts).
void VerbsTransport::onData(Connection& c, uint32_t stream, uint64_t seq24) {
  if (c.failed && !c.draining) return;
  Stream* s = stream < c.streams.size() ? &c.streams[stream] : nullptr;
  if (s == nullptr || s->recvs.empty() || (s->recvs.front()->seq & 0xFFFFFFu) != seq24) {
    failConnection(c, ErrorKind::kPeer,
                   strFormat("rank %d wrote data for receive #%llu of stream %u, which is not the next one "
                             "(protocol error)",
                             c.peer, static_cast<unsigned long long>(seq24), stream));
    return;
  }
  VerbsRequest* r = s->recvs.front();
  s->recvs.pop_front();
  ++s->arrived;
  finish(r, Request::State::kDone, nullptr);
}

void VerbsTransport::onControl(Connection& c, const char* bytes) {
  if (c.failed && !c.draining) return;
  CtrlMessage m;
  std::memcpy(&m, bytes, sizeof(m));
  if (c.draining && m.type != kEmpty) return;  // only what arrived counts now
  if ((m.type == kCredit || m.type == kEmpty || m.type == kMismatch) && m.stream >= verbs::kMaxStreams) {
    failConnection(c, ErrorKind::kPeer,
                   strFormat("rank %d sent a control message for stream %u (protocol error)", c.peer, m.stream));
    return;
  }
  switch (m.type) {
    case kCredit:
      c.stream(m.stream).credits.push_back(m);
      matchCredits(c, m.stream);
      flush(c);
      return;
    case kEmpty:
      onData(c, m.stream, m.seq & 0xFFFFFFu);
      return;
    case kRailNote:
      if (m.addr < kMaxRails && m.rkey < kMaxRails)
        notes_.push_back(RailNote{c.peer, static_cast<uint32_t>(m.addr), m.rkey, m.stream, m.bytes, m.seq});
      return;
    case kMismatch: {
      const Stream& s = c.stream(m.stream);
      std::string bad = s.recvs.empty() ? std::string() : checkHeader(s.recvs.front()->header, m.header, info_.rank);
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
