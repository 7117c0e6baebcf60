// VerbsTransport's posting (the protocol: verbs_transport.h): a receive sends
// its credit, a send waits for the credit that matches it (in its stream's
// order), then RDMA-writes its payload with the stream and sequence number as
// immediate data; control messages and writes queue in order while the send
// queue or the control slots are full.
#include <arpa/inet.h>

#include <algorithm>
#include <cstring>

#include "rdma/verbs_transport_internal.h"

namespace rcoll {

using verbs::CtrlMessage;
using verbs::kCredit;
using verbs::kCtrlBytes;
using verbs::kEmpty;
using verbs::kMismatch;

Request* VerbsTransport::isend(int peer, const WireHeader& header, const void* data, size_t bytes) {
  return post(requests_.take(true, peer, header, data, bytes));
}

Request* VerbsTransport::irecv(int peer, const WireHeader& expected, void* data, size_t bytes) {
  return post(requests_.take(false, peer, expected, data, bytes));
}

// A rescue stream of a rails transport (rail_endpoint.h).
Request* VerbsTransport::isendOn(int stream, int peer, const WireHeader& header, const void* data, size_t bytes) {
  VerbsRequest* r = requests_.take(true, peer, header, data, bytes);
  r->stream = static_cast<uint32_t>(stream);
  return post(r);
}

Request* VerbsTransport::irecvOn(int stream, int peer, const WireHeader& expected, void* data, size_t bytes) {
  VerbsRequest* r = requests_.take(false, peer, expected, data, bytes);
  r->stream = static_cast<uint32_t>(stream);
  return post(r);
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
  Stream& stream = c->stream(r->stream);
  if (r->is_send) {
    r->seq = stream.next_send_seq++;
    stream.unmatched.push_back(r);
    matchCredits(*c, r->stream);
  } else {
    r->seq = stream.next_recv_seq++;
    if (!acquireMemory(r, /*writable=*/true)) return r;
    stream.recvs.push_back(r);
    Outgoing credit;
    credit.message.type = kCredit;
    credit.message.stream = r->stream;
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

// Pairs a stream's sends with the credits their receives sent, in order. The
// header check happens here, before any payload moves.
void VerbsTransport::matchCredits(Connection& c, uint32_t s) {
  Stream& stream = c.stream(s);
  while (!c.failed && !stream.unmatched.empty() && !stream.credits.empty()) {
    VerbsRequest* r = stream.unmatched.front();
    CtrlMessage credit = stream.credits.front();
    stream.unmatched.pop_front();
    stream.credits.pop_front();
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
      notice.message.stream = s;
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
      item.message.stream = s;
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
      wr.imm_data = htonl(verbs::immediateFor(r->stream, r->seq));
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
    if (i == 0) {
      c.in_flight.push_back(r);
      r->metered = EdgeMeter::metered(r->bytes);
      if (r->metered) meter_.began(c.peer);
    }
    ++r->holds;
    ++c.sq_used;
  }
  return true;
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
    return;
  }
  ++c.recv_posted;
}

}  // namespace rcoll
