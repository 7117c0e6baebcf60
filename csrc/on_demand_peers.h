// A transport's side of connections on demand (on_demand_connector.h): the
// connector, what it delivered that the transport has not adopted yet, the
// requests that wait for their peer's connection (in the order they were
// posted) and why a peer could not be reached. TCP adopts a delivered peer's
// sockets at once; verbs first swaps queue pairs over them. Used from the
// transport's own thread only.
#pragma once

#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <deque>
#include <memory>
#include <vector>

#include "error.h"
#include "on_demand_connector.h"
#include "socket_util.h"
#include "transport.h"

namespace rcoll {

template <class R>  // the transport's request type: has peer, state, why
class OnDemandPeers {
 public:
  using Outcome = OnDemandConnector::Outcome;

  OnDemandPeers() = default;
  ~OnDemandPeers() {
    for (const Outcome& o : delivered_) {
      for (int fd : o.fds) ::close(fd);
    }
  }
  OnDemandPeers(const OnDemandPeers&) = delete;
  OnDemandPeers& operator=(const OnDemandPeers&) = delete;

  void start(std::unique_ptr<OnDemandConnector> connector, int size) {
    connector_ = std::move(connector);
    waiting_.resize(static_cast<size_t>(size));
    unreachable_.resize(static_cast<size_t>(size));
  }
  bool started() const { return connector_ != nullptr; }
  bool onDemand(int peer) const { return connector_ && connector_->onDemand(peer); }
  int readyFd() const { return connector_->readyFd(); }

  // For post(): true when `r` cannot go out because its peer connects on
  // demand and is not `connected` yet. `r` then waits here (the first one
  // asks the connector for the peer), or has failed with why the peer could
  // not be reached.
  bool hold(R* r, bool connected) {
    if (!connector_ || stopped_ || connected || !connector_->onDemand(r->peer)) return false;
    const auto p = static_cast<size_t>(r->peer);
    if (unreachable_[p]) {
      r->state = Request::State::kFailed;
      r->why = *unreachable_[p];
      return true;
    }
    if (waiting_[p].empty()) connector_->want(r->peer);
    waiting_[p].push_back(r);
    return true;
  }

  // Asks the connector for `peer` ahead of its first message: nothing for a
  // peer of set-up, one `connected` (or swapping queue pairs), one a message
  // already asked for, or one that could not be reached.
  void want(int peer, bool connected) {
    if (!connector_ || stopped_ || connected || !connector_->onDemand(peer)) return;
    const auto p = static_cast<size_t>(peer);
    if (unreachable_[p] || !waiting_[p].empty()) return;
    connector_->want(peer);
  }

  // What the connector finished, to adopt now, oldest first. `in_setup`
  // (accept()): at most one set-up peer among them, which accept() returns;
  // the other set-up peers stay for the next call. Otherwise (progress())
  // only peers on demand: a set-up peer's connection is accept()'s to return,
  // also when progress() runs during set-up (the rails' measurement,
  // rails_probe.h, drives its rails while other peers dial in).
  std::deque<Outcome> take(bool in_setup) {
    for (Outcome& o : connector_->take()) delivered_.push_back(std::move(o));
    std::deque<Outcome> now, later;
    bool setup_peer_taken = false;
    for (Outcome& o : delivered_) {
      const bool setup_peer = !connector_->onDemand(o.peer);
      if (setup_peer && (!in_setup || setup_peer_taken)) {
        later.push_back(std::move(o));
        continue;
      }
      setup_peer_taken |= setup_peer;
      now.push_back(std::move(o));
    }
    delivered_ = std::move(later);
    return now;
  }

  // accept() during set-up, when the connector owns the listener: adopts
  // what comes (`adopt(outcome)`, peers on demand that dial this early
  // included) until a set-up peer came, and returns that peer.
  template <class Adopt>
  int acceptSetupPeer(const Transport& transport, const ConnectInfo& info, Deadline deadline, Adopt adopt) {
    for (;;) {
      int setup_peer = -1;
      for (Outcome& o : take(/*in_setup=*/true)) {
        if (!connector_->onDemand(o.peer)) setup_peer = o.peer;
        adopt(o);
      }
      if (setup_peer >= 0) return setup_peer;
      const int wait_ms = millisecondsUntil(deadline);
      if (wait_ms <= 0) {
        int connected = 0;
        for (int p = 0; p < info.size; ++p) connected += p != info.rank && transport.connected(p) ? 1 : 0;
        throwError(ErrorKind::kTimeout,
                   strFormat("rank %d: timed out waiting for peers to connect (%d of %d connected)", info.rank,
                             connected, info.size - 1));
      }
      pollfd ready{connector_->readyFd(), POLLIN, 0};
      ::poll(&ready, 1, wait_ms);
    }
  }

  // The requests that waited for `peer`, in order; from now on none waits.
  std::deque<R*> release(int peer) {
    std::deque<R*> out;
    out.swap(waiting_[static_cast<size_t>(peer)]);
    return out;
  }

  // `peer` cannot be reached: later requests to it fail at once with `why`;
  // returns those that waited, for the caller to fail.
  std::deque<R*> setUnreachable(int peer, const TransportFailure& why) {
    unreachable_[static_cast<size_t>(peer)] = std::make_unique<TransportFailure>(why);
    return release(peer);
  }

  // The transport aborts: every waiting request (to fail), and the connector
  // stops (a peer that dials from now on is refused: this rank is gone).
  std::vector<R*> stop() {
    std::vector<R*> out;
    for (auto& waiting : waiting_) {
      out.insert(out.end(), waiting.begin(), waiting.end());
      waiting.clear();
    }
    stopped_ = true;
    if (connector_) connector_->stop();
    return out;
  }

 private:
  std::unique_ptr<OnDemandConnector> connector_;
  std::vector<std::deque<R*>> waiting_;                         // per peer
  std::vector<std::unique_ptr<TransportFailure>> unreachable_;  // per peer
  std::deque<Outcome> delivered_;                               // taken from the connector, not yet adopted
  bool stopped_ = false;
};

}  // namespace rcoll
