// Rails over RDMA ports (rails_transport.h): a port whose link fails to a
// peer takes no message with it.
//
// A pair's messages are dealt to the rails by size (railFor), the same at
// both ends, and each rail's connection keeps them in order. When the link
// under rail F fails (the NIC stops acknowledging: RC retries exhausted; or
// the rail's side channel times out or loses its route), the connection on F
// goes to the error state at both ends, and:
//
//  * Each end counts what arrived on F before it (rail_endpoint.h: the
//    receives flushed behind whatever had landed are awaited first, so the
//    count is exact), warns once, and sends the count in a note on rail R,
//    the lowest rail that works, which takes F's place for this pair. An end
//    that hears of the failure in the peer's note first takes its own end of
//    F down and does the same.
//  * F's messages from then on travel on R, on a stream of their own
//    (stream 1 + F), in F's order: the receives of F that did not arrive are
//    posted there at once, in order, and so is every later receive the
//    schedule gives F. A send of F waits for the peer's count: the messages
//    it counts arrived (whatever this end's completions said), the rest go on
//    R's stream in order, and so does every later send the schedule gives F.
//    Both ends thus put the same messages in the same order on that stream,
//    however the rest of R's traffic interleaves with it, and railFor() keeps
//    dealing as before, so the pair's other rails are untouched.
//  * The job goes on at the bandwidth left, every result exact. A rail that
//    carries a failed rail's messages cannot hand them on in turn: its own
//    failure, the last rail's, or anything but a link failure (a peer whose
//    process is gone, an abort, a mismatch) fails the pair's requests as with
//    one port, with a PeerError naming the rank.
#include <algorithm>

#include "log.h"
#include "rails_transport.h"

namespace rcoll {

void RailsTransport::takeFailures() {
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    for (int peer : endpoints_[i]->takeLinkFailures()) {
      TransportFailure why;
      endpoints_[i]->connectionFailed(peer, &why);
      startFailover(peer, static_cast<int>(i), why);
    }
  }
  for (RailEndpoint* endpoint : endpoints_) {
    for (const RailNote& note : endpoint->takeNotes()) onNote(note);
  }
}

// Whether a link failure under `rail` to `peer` is still to be decided or
// was replaced; false once it could not be.
bool RailsTransport::mayReplace(int peer, int rail) const {
  return !endpoints_.empty() && !pairs_[static_cast<size_t>(peer)].rails[static_cast<size_t>(rail)].given_up;
}

void RailsTransport::startFailover(int peer, int rail, const TransportFailure& why) {
  Pair& pair = pairs_[static_cast<size_t>(peer)];
  FailedRail& f = pair.rails[static_cast<size_t>(rail)];
  if (f.down || f.given_up) return;
  int rescue = -1;
  bool carries_rescue = false;
  for (size_t j = 0; j < pair.rails.size(); ++j) {
    const FailedRail& other = pair.rails[j];
    if (other.down && other.rescue == rail) carries_rescue = true;
    // A rail not connected yet (peers connected on first use) cannot carry the note: it does not qualify.
    if (rescue < 0 && static_cast<int>(j) != rail && !other.down && !other.given_up && endpoints_[j]->usable(peer)) {
      rescue = static_cast<int>(j);
    }
  }
  RailEndpoint& failed = *endpoints_[static_cast<size_t>(rail)];
  const uint64_t arrived = failed.arrived(peer) - pair.arrived_base[static_cast<size_t>(rail)];
  if (rescue < 0 || carries_rescue || (f.peer_rescue >= 0 && f.peer_rescue != rescue) ||
      !endpoints_[static_cast<size_t>(rescue)]->sendNote(
          RailNote{peer, static_cast<uint32_t>(rail), static_cast<uint32_t>(rescue), arrived})) {
    // Its requests fail with the link's failure (settleRequests), as with one port.
    f.given_up = true;
    std::lock_guard<std::mutex> lock(unreplaced_mutex_);
    unreplaced_.push_back(peer);
    return;
  }
  f.down = true;
  f.rescue = rescue;
  RCOLL_WARN("rank %d: the RDMA port %s to rank %d failed (%s); its messages go on over %s", info_.rank,
             failed.portName().c_str(), peer, why.message.c_str(),
             endpoints_[static_cast<size_t>(rescue)]->portName().c_str());

  // What the rail carried for the peer, in the order it had it.
  std::vector<RailRequest*> moved;
  for (size_t k = 0; k < open_.size();) {
    RailRequest* w = open_[k];
    if (w->peer == peer && w->carrier == rail) {
      moved.push_back(w);
      open_[k] = open_.back();
      open_.pop_back();
    } else {
      ++k;
    }
  }
  std::sort(moved.begin(), moved.end(), [](const RailRequest* a, const RailRequest* b) {
    return a->is_send != b->is_send ? a->is_send < b->is_send : a->number < b->number;
  });
  for (RailRequest* w : moved) {
    if (w->child->state == Request::State::kDone) {  // it arrived (a send: the peer's count says so too)
      settle(w, Request::State::kDone, nullptr);
      continue;
    }
    children_[static_cast<size_t>(rail)]->release(w->child);
    w->child = nullptr;
    if (w->is_send) {
      f.waiting.push_back(w);
      ++waiting_;
    } else {
      carry(w, rescue, 1 + rail);
    }
  }
  if (f.peer_has) resendWaiting(peer, rail);
}

void RailsTransport::onNote(const RailNote& note) {
  const size_t n = children_.size();
  if (note.peer < 0 || note.peer >= info_.size || note.failed >= n || note.rescue >= n) return;
  FailedRail& f = pairs_[static_cast<size_t>(note.peer)].rails[note.failed];
  if (f.peer_has) return;
  f.peer_has = note.arrived;
  f.peer_rescue = static_cast<int>(note.rescue);
  if (!f.down) {  // this end learns it from the peer: its end of the rail goes down the same way
    if (!f.given_up) {
      endpoints_[note.failed]->failLink(note.peer,
                                        strFormat("rank %d saw the link between the two ports fail", note.peer));
    }
    return;
  }
  if (f.rescue != f.peer_rescue) {
    failWaitingSends(
        f, {ErrorKind::kPeer, strFormat("rank %d moved the messages of a failed RDMA port to port %d, this rank to %d",
                                        note.peer, f.peer_rescue, f.rescue)});
    return;
  }
  resendWaiting(note.peer, static_cast<int>(note.failed));
}

// The peer's count is in: the sends it counts arrived, the rest go again.
void RailsTransport::resendWaiting(int peer, int rail) {
  FailedRail& f = pairs_[static_cast<size_t>(peer)].rails[static_cast<size_t>(rail)];
  const uint64_t has = *f.peer_has;
  if (has < f.sends_done) {  // a send this end saw acknowledged is not counted there: the ends disagree
    failWaitingSends(
        f, {ErrorKind::kPeer,
            strFormat("rank %d counts %llu of this rank's messages on a failed RDMA port where %llu were acknowledged",
                      peer, static_cast<unsigned long long>(has), static_cast<unsigned long long>(f.sends_done))});
    return;
  }
  std::deque<RailRequest*> waiting;
  waiting.swap(f.waiting);
  waiting_ -= static_cast<int>(waiting.size());
  for (RailRequest* w : waiting) {
    if (w->number < has) {
      settle(w, Request::State::kDone, nullptr);
    } else {
      carry(w, f.rescue, 1 + rail);
    }
  }
}

// Sends that wait for the peer's count while the rail that would bring it
// failed: they fail with it.
void RailsTransport::failWaiting() {
  for (size_t peer = 0; peer < pairs_.size(); ++peer) {
    for (FailedRail& f : pairs_[peer].rails) {
      TransportFailure why;
      if (!f.waiting.empty() &&
          endpoints_[static_cast<size_t>(f.rescue)]->connectionFailed(static_cast<int>(peer), &why)) {
        failWaitingSends(f, why);
      }
    }
  }
}

void RailsTransport::failWaitingSends(FailedRail& f, const TransportFailure& why) {
  for (RailRequest* w : f.waiting) settle(w, Request::State::kFailed, &why);
  waiting_ -= static_cast<int>(f.waiting.size());
  f.waiting.clear();
}

}  // namespace rcoll
