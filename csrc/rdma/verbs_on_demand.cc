// VerbsTransport's connections on demand (transport.h): the OnDemandConnector
// delivers the socket, and the progress thread swaps queue pairs over it in
// steps (Handshake), never waiting on the peer; the requests wait in order.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "log.h"
#include "rdma/verbs_transport_internal.h"
#include "socket_util.h"

namespace rcoll {

using verbs::sideChannelOptions;

void VerbsTransport::connectOnDemand(const std::vector<std::string>& addresses) {
  if (std::all_of(addresses.begin(), addresses.end(), [](const std::string& a) { return a.empty(); })) return;
  on_demand_.start(std::make_unique<OnDemandConnector>(info_, std::move(listener_), addresses,
                                                       sideChannelOptions(config_), 1, config_.connect_timeout),
                   info_.size);
}

void VerbsTransport::connectAhead(int peer) {
  if (aborted_ || peer < 0 || peer >= info_.size || peer == info_.rank) return;
  on_demand_.want(peer, connected(peer) || handshaking(peer));
}

bool VerbsTransport::handshaking(int peer) const {
  return std::any_of(handshakes_.begin(), handshakes_.end(),
                     [&](const std::unique_ptr<Handshake>& h) { return h->conn->peer == peer; });
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
    // A connection made ahead that nothing waited for (connectAhead) loses
    // no peer: a message dealt to this rail later fails with why.
    if (!waiting.empty() && (o.failure.kind == ErrorKind::kPeer || o.failure.kind == ErrorKind::kTimeout)) {
      markLost(o.peer);
    }
    for (VerbsRequest* r : waiting) finish(r, Request::State::kFailed, &o.failure);
    return;
  }
  if (aborted_ || connected(o.peer) || handshaking(o.peer)) {  // abortPeers() failed what waited
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
  // As in adoptOutcome(): a connection made ahead that nothing waited for loses no peer.
  failConnection(c, ErrorKind::kPeer,
                 strFormat("setting up the RDMA connection to rank %d on first use: %s", peer, failure.c_str()),
                 /*peer_reported=*/waiting.empty());
  for (VerbsRequest* r : waiting) finish(r, Request::State::kFailed, &c.failure);
}

}  // namespace rcoll
