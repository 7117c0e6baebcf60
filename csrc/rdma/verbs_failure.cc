// VerbsTransport's failures: news on a peer's side channel (an abort, EOF),
// a connection failed (its queue pair to the error state, its requests failed),
// and this rank's own abort told to the peers.
#include <sys/socket.h>

#include "log.h"
#include "rdma/ibv_api.h"
#include "rdma/verbs_transport_internal.h"

namespace rcoll {

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

void VerbsTransport::abortPeers(ErrorKind kind, const std::string& message) {
  if (aborted_) return;
  aborted_ = true;
  const AbortMessage abort(info_, kind, message);
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
  abortOverSideChannels(abort, connections_, [&](Connection& c) {
    failConnection(c, ErrorKind::kAborted, "the communicator was aborted: " + message);
  });
}

}  // namespace rcoll
