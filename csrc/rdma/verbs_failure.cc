// VerbsTransport's failures: news on a peer's side channel (an abort, EOF),
// a connection failed (its queue pair to the error state, its requests failed,
// after a link failure once what had arrived is counted), this rank's own
// abort told to the peers, and what a rails transport asks of a rail
// (rail_endpoint.h).
#include <sys/socket.h>

#include <cerrno>

#include <utility>

#include "log.h"
#include "rdma/ibv_api.h"
#include "rdma/verbs_transport_internal.h"

namespace rcoll {

// The device's async events. A dead device fails every connection. A rail
// whose port is down after its events (the last one for the port says so,
// and so does the port now: a flap that is over changes nothing) fails its
// connections as link failures at once, so that the rails transport moves
// them: a peer's sends may otherwise retry without end (rxe does, into a link
// without carrier) while this end only waits for data, and neither would ever
// fail. A single port keeps its connections: the RC retries may outlast a
// short flap, and there is nowhere else to go.
void VerbsTransport::serviceAsyncEvents() {
  bool fatal = false;
  int port_went = 0;  // the last word on this port: -1 down, 1 active
  ibv_async_event event{};
  for (;;) {
    if (api_.get_async_event(context_, &event) != 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) async_broken_ = true;  // stop polling it
      break;
    }
    if (event.event_type == IBV_EVENT_DEVICE_FATAL) fatal = true;
    if ((event.event_type == IBV_EVENT_PORT_ERR || event.event_type == IBV_EVENT_PORT_ACTIVE) &&
        event.element.port_num == port_.port) {
      port_went = event.event_type == IBV_EVENT_PORT_ERR ? -1 : 1;
    }
    api_.ack_async_event(&event);
  }
  if (!fatal && !(in_rails_ && port_went < 0 && !portActive())) return;
  const std::string why = strFormat("the port %s went down (%s)", portName().c_str(),
                                    fatal ? "IBV_EVENT_DEVICE_FATAL" : "IBV_EVENT_PORT_ERR");
  RCOLL_INFO("rank %d: %s", info_.rank, why.c_str());
  for (auto& c : connections_) {
    if (c && !c->failed && !c->closed) failConnection(*c, ErrorKind::kPeer, why, false, true);
  }
}

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
      if (isLinkFailure(news.error)) {  // the path, not the process: the queue pair may be cut off too
        failConnection(c, ErrorKind::kPeer,
                       strFormat("the connection to rank %d over %s failed: %s", c.peer, portName().c_str(),
                                 errnoText(news.error).c_str()),
                       false, true);
        return;
      }
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
  failQueued(c);
  if (c.in_flight.empty()) failConnection(c, c.failure.kind, c.failure.message);
}

void VerbsTransport::failConnection(Connection& c, ErrorKind kind, const std::string& message, bool peer_reported,
                                    bool link) {
  if (c.failed) return;
  c.failed = true;
  c.failure = {kind, message};
  c.failure.link = link && kind == ErrorKind::kPeer;
  // A rail's link failure is the rails transport's to judge (it may go on over another port).
  if (kind == ErrorKind::kPeer && !peer_reported && !(c.failure.link && in_rails_)) markLost(c.peer);
  // The error state stops the NIC writing into receive buffers before they are
  // handed back, and flushes every posted work request; writes in flight stay
  // listed until their flushed completions return their memory.
  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_ERR;
  const bool flushing = api_.modify_qp(c.qp, &attr, IBV_QP_STATE) == 0;
  RCOLL_INFO("rank %d: RDMA connection to rank %d failed: %s", info_.rank, c.peer, message.c_str());
  if (!c.failure.link || !flushing) {  // without the error state nothing is flushed and no count is exact
    c.failure.link = false;
    failRequests(c);
    return;
  }
  // A link failure: the receive slots' completions, flushed behind whatever
  // had arrived, are awaited first, so that arrived() counts every message
  // that landed (a rails transport sends the rest again on another port).
  if (c.recv_posted > 0) {
    c.draining = true;
    c.drain_deadline = std::chrono::steady_clock::now() + verbs::kDrainBound;
    ++draining_;
    return;
  }
  endLinkFailure(c);
}

// What arrived is counted: the requests fail, and a rails transport hears of it.
void VerbsTransport::endLinkFailure(Connection& c) {
  if (c.draining) {
    c.draining = false;
    --draining_;
  }
  failRequests(c);
  link_failures_.push_back(c.peer);
}

void VerbsTransport::failRequests(Connection& c) {
  failQueued(c);
  for (VerbsRequest* r : c.in_flight) finish(r, Request::State::kFailed, &c.failure);
}

// Receives and sends not posted to the queue pair yet.
void VerbsTransport::failQueued(Connection& c) {
  for (Stream& s : c.streams) {
    for (VerbsRequest* r : s.recvs) finish(r, Request::State::kFailed, &c.failure);
    for (VerbsRequest* r : s.unmatched) finish(r, Request::State::kFailed, &c.failure);
    s.recvs.clear();
    s.unmatched.clear();
    s.credits.clear();
  }
  for (Outgoing& item : c.backlog) {
    if (item.request != nullptr) finish(item.request, Request::State::kFailed, &c.failure);
  }
  c.backlog.clear();
}

std::chrono::milliseconds VerbsTransport::maxSleep() const {
  if (draining_ == 0) return std::chrono::milliseconds::max();
  auto earliest = Deadline::max();
  for (const auto& c : connections_) {
    if (c && c->draining) earliest = std::min(earliest, c->drain_deadline);
  }
  return std::chrono::milliseconds(std::max(1, millisecondsUntil(earliest)));
}

// The verbs specification flushes every posted work request once a queue
// pair is in the error state; a drain that outlives its deadline (a driver
// that does not) ends with what has been counted.
void VerbsTransport::checkDrains() {
  if (draining_ == 0) return;
  const auto now = std::chrono::steady_clock::now();
  for (auto& c : connections_) {
    if (!c || !c->draining || now < c->drain_deadline) continue;
    RCOLL_WARN("rank %d: the RDMA connection to rank %d did not flush its receives within %lld s of failing",
               info_.rank, c->peer, static_cast<long long>(verbs::kDrainBound.count()));
    endLinkFailure(*c);
  }
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

// --- RailEndpoint (rail_endpoint.h) ------------------------------------------

std::vector<int> VerbsTransport::takeLinkFailures() { return std::exchange(link_failures_, {}); }

uint64_t VerbsTransport::arrived(int peer, int stream) const {
  if (!connected(peer) || stream < 0) return 0;
  const std::vector<Stream>& streams = connections_[static_cast<size_t>(peer)]->streams;
  return static_cast<size_t>(stream) < streams.size() ? streams[static_cast<size_t>(stream)].arrived : 0;
}

void VerbsTransport::failLink(int peer, const std::string& why) {
  if (connected(peer)) failConnection(*connections_[static_cast<size_t>(peer)], ErrorKind::kPeer, why, false, true);
}

bool VerbsTransport::connectionFailed(int peer, TransportFailure* why) const {
  if (!connected(peer)) return false;
  const Connection& c = *connections_[static_cast<size_t>(peer)];
  if (!(c.failed && !c.draining) && !c.closed) return false;
  *why = c.failure;
  return true;
}

bool VerbsTransport::usable(int peer) const {
  if (!connected(peer)) return false;
  const Connection& c = *connections_[static_cast<size_t>(peer)];
  return !c.failed && !c.closed && !aborted_;
}

bool VerbsTransport::sendNote(const RailNote& note) {
  if (!usable(note.peer)) return false;
  Connection& c = *connections_[static_cast<size_t>(note.peer)];
  Outgoing item;
  item.message.type = verbs::kRailNote;
  item.message.seq = note.arrived;
  item.message.addr = note.home;
  item.message.rkey = note.carrier;
  item.message.bytes = note.lost;
  item.message.stream = note.number;
  c.backlog.push_back(item);
  flush(c);
  return true;
}

std::vector<RailNote> VerbsTransport::takeNotes() { return std::exchange(notes_, {}); }

std::string VerbsTransport::portName() const { return port_.device + ":" + std::to_string(port_.port); }

}  // namespace rcoll
