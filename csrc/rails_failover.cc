// Rails over RDMA ports (rails_transport.h): a port whose link fails to a
// peer takes no message with it, nor does the port that took its messages
// over when its own link fails in turn, as long as one port works.
//
// A pair's messages are dealt to the rails by size (railFor), the same at
// both ends; the messages dealt to rail H are H's ("home H"), numbered in
// order each way. Home H's messages travel on a carrier rail: H itself
// (stream 0) until H's link fails, then another rail, on a stream of their
// own there (stream 1 + H), in H's order, so that both ends agree on them
// however the rest of that rail's traffic interleaves. When the link under a
// carrier C fails (the NIC stops acknowledging: RC retries exhausted; the
// port goes down; or the rail's side channel times out or loses its route),
// the connection on C goes to the error state at both ends, and for every
// home whose messages C carried (its own, and those of rails that failed
// before it):
//
//  * Each end counts the home's messages that arrived before the failure
//    (rail_endpoint.h: the receives flushed behind whatever had landed are
//    awaited first, so the count is exact), warns once per failed rail, and
//    sends the count in a note on N, the lowest rail it can use, which
//    carries the home's messages from then on. The note also names the rails
//    this end could not use: the peer takes those down for the pair at its
//    end too, so that two ends that saw failures in different orders, or a
//    rail that one end had not connected yet, still end on the same carrier.
//  * The receives not arrived are posted on N's stream 1 + H at once, in
//    order, and so is every later receive the schedule gives H. The sends
//    wait for the peer's note naming the same carrier: the messages it counts
//    arrived (whatever this end's completions said), the rest go on N's
//    stream in order, and so does every later send the schedule gives H.
//    Both ends thus put the same messages in the same order on that stream,
//    and railFor() keeps dealing as before, so the other homes are untouched.
//  * The job goes on at the bandwidth left, every result exact. The last
//    rail's failure, or anything but a link failure (a peer whose process is
//    gone, an abort, a mismatch), fails the pair's requests as with one port,
//    with a PeerError naming the rank.
#include <algorithm>
#include <vector>

#include "log.h"
#include "rails_transport.h"

namespace rcoll {

void RailsTransport::takeFailures() {
  for (size_t i = 0; i < endpoints_.size(); ++i) {
    for (int peer : endpoints_[i]->takeLinkFailures()) {
      TransportFailure why;
      endpoints_[i]->connectionFailed(peer, &why);
      railFailed(peer, static_cast<int>(i), why);
    }
  }
  for (RailEndpoint* endpoint : endpoints_) {
    for (const RailNote& note : endpoint->takeNotes()) onNote(note);
  }
}

// Whether a link failure under the carrier of `home`'s messages to `peer` is
// still to be decided or was replaced; false once it could not be.
bool RailsTransport::mayReplace(int peer, int home) const {
  return !endpoints_.empty() && !pairs_[static_cast<size_t>(peer)].homes[static_cast<size_t>(home)].given_up;
}

// How many of `peer`'s messages of `home` arrived here, on every rail that carried them.
uint64_t RailsTransport::countArrived(int peer, int home) const {
  const HomeRail& h = pairs_[static_cast<size_t>(peer)].homes[static_cast<size_t>(home)];
  return h.recv_base + endpoints_[static_cast<size_t>(h.carrier)]->arrived(peer, streamOn(home, h.carrier)) -
         h.stream_base;
}

// The lowest rail to `peer` this end can use, not in `unusable` (-1: none);
// `lost` gets every rail it cannot use, for the note, so that the peer does
// not use them either and the two ends meet on one carrier. That includes a
// rail not connected yet (peers connected on first use), which cannot carry
// the note: the peer takes it down for the pair even where its end is
// connected, rather than wait on a carrier this end will not take.
int RailsTransport::nextCarrier(int peer, uint64_t unusable, uint64_t* lost) const {
  int next = -1;
  *lost = 0;
  for (size_t j = 0; j < children_.size(); ++j) {
    if ((unusable >> j & 1) != 0 || !endpoints_[j]->usable(peer)) {
      *lost |= uint64_t{1} << j;
    } else if (next < 0) {
      next = static_cast<int>(j);
    }
  }
  return next;
}

// The link under `rail` to `peer` failed, and what arrived on it is counted:
// the homes it carried move to the lowest rail that works.
void RailsTransport::railFailed(int peer, int rail, const TransportFailure& why) {
  Pair& pair = pairs_[static_cast<size_t>(peer)];
  if ((pair.lost >> rail & 1) != 0) return;
  pair.lost |= uint64_t{1} << rail;
  uint64_t unusable = pair.lost | pair.taken_down, lost = 0;  // nor a rail the peer lost, connected here or not
  int next = nextCarrier(peer, unusable, &lost);
  RailEndpoint& failed = *endpoints_[static_cast<size_t>(rail)];
  bool warned = false;
  std::vector<int> moved_homes;
  for (size_t home = 0; home < pair.homes.size(); ++home) {
    HomeRail& h = pair.homes[home];
    if (h.carrier != rail || h.given_up) continue;
    const int H = static_cast<int>(home);
    const uint64_t arrived = countArrived(peer, H);
    // A note that cannot go: that rail failed as it was written to; the next one, then.
    while (next >= 0 &&
           !endpoints_[static_cast<size_t>(next)]->sendNote(RailNote{
               peer, static_cast<uint32_t>(home), static_cast<uint32_t>(next), pair.notes_sent + 1, lost, arrived})) {
      unusable |= uint64_t{1} << next;
      next = nextCarrier(peer, unusable, &lost);
    }
    if (next < 0) {
      giveUp(peer, H, why);
      continue;
    }
    ++pair.notes_sent;
    if (!warned) {
      RCOLL_WARN("rank %d: the RDMA port %s to rank %d failed (%s); its messages go on over %s", info_.rank,
                 failed.portName().c_str(), peer, why.message.c_str(),
                 endpoints_[static_cast<size_t>(next)]->portName().c_str());
      warned = true;
    }
    h.carrier = next;
    h.recv_base = arrived;
    h.stream_base = endpoints_[static_cast<size_t>(next)]->arrived(peer, streamOn(H, next));

    // What the failed rail carried of this home, in order: the receives not
    // arrived go on the next carrier now, the sends not acknowledged wait
    // for the peer's count with those that waited already.
    std::vector<RailRequest*> moved;
    for (size_t k = 0; k < open_.size();) {
      RailRequest* w = open_[k];
      if (w->peer == peer && w->home == H && w->carrier == rail) {
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
      if (w->child->state == Request::State::kFailed) {
        const TransportFailure own = children_[static_cast<size_t>(rail)]->failure(w->child);
        if (!own.link) {  // it failed for a reason of its own (its memory could not be registered)
          settle(w, Request::State::kFailed, &own);
          continue;
        }
      }
      children_[static_cast<size_t>(rail)]->release(w->child);
      w->child = nullptr;
      if (w->is_send) {
        h.waiting.push_back(w);
        ++waiting_;
      } else {
        carry(w, next, streamOn(H, next));
      }
    }
    std::sort(h.waiting.begin(), h.waiting.end(),
              [](const RailRequest* a, const RailRequest* b) { return a->number < b->number; });
    moved_homes.push_back(H);
  }
  // Once every home moved: afterNote() may send the waiting ones now.
  for (int home : moved_homes) afterNote(peer, home);
}

// No rail is left for `home`'s messages: its requests fail, those on the
// failed rail with the link's failure (settleRequests), the waiting ones
// with `why`, as with one port.
void RailsTransport::giveUp(int peer, int home, const TransportFailure& why) {
  HomeRail& h = pairs_[static_cast<size_t>(peer)].homes[static_cast<size_t>(home)];
  h.given_up = true;
  failWaitingRequests(h, why);
  std::lock_guard<std::mutex> lock(unreplaced_mutex_);
  unreplaced_.push_back(peer);
}

void RailsTransport::onNote(const RailNote& note) {
  const size_t n = children_.size();
  if (note.peer < 0 || note.peer >= info_.size || note.home >= n || note.carrier >= n) return;
  Pair& pair = pairs_[static_cast<size_t>(note.peer)];
  HomeRail& h = pair.homes[note.home];
  if (note.number <= h.peer_note) return;  // older than the one held (a home's notes come over different rails)
  h.peer_note = note.number;
  h.peer_has = note.arrived;
  h.peer_carrier = static_cast<int>(note.carrier);
  // A rail the peer could not use goes down here too, as its link failure
  // (railFailed() comes, and moves what it carried); one not connected here
  // is never chosen as a carrier (railFailed: taken_down).
  for (size_t r = 0; r < n; ++r) {
    const uint64_t bit = uint64_t{1} << r;
    if ((note.lost & bit) != 0 && ((pair.lost | pair.taken_down) & bit) == 0) {
      pair.taken_down |= bit;
      endpoints_[r]->failLink(note.peer, strFormat("rank %d saw the link between the two ports fail", note.peer));
    }
  }
  afterNote(note.peer, static_cast<int>(note.home));
}

// Where both ends put the home's messages on the same carrier, the sends
// that waited go. Until then one end is behind, and the rails it has yet to
// take down (its own failures, or the peer's note) move it on.
void RailsTransport::afterNote(int peer, int home) {
  HomeRail& h = pairs_[static_cast<size_t>(peer)].homes[static_cast<size_t>(home)];
  if (h.given_up || h.peer_note == 0 || h.carrier == home || h.carrier != h.peer_carrier) return;
  resendWaiting(peer, home);
}

// The peer's count is in: the sends it counts arrived, the rest go again.
void RailsTransport::resendWaiting(int peer, int home) {
  HomeRail& h = pairs_[static_cast<size_t>(peer)].homes[static_cast<size_t>(home)];
  const uint64_t has = h.peer_has;
  const uint64_t sent = pairs_[static_cast<size_t>(peer)].sent[static_cast<size_t>(home)];
  // A send this end saw acknowledged that is not counted there, or more
  // counted than were sent: the ends disagree.
  if (has < h.sends_done || has > sent) {  // the home is given up: later sends would meet the wrong receives
    giveUp(peer, home,
           {ErrorKind::kPeer,
            strFormat("rank %d counts %llu of this rank's messages on a failed RDMA port where %llu were "
                      "acknowledged of %llu sent",
                      peer, static_cast<unsigned long long>(has), static_cast<unsigned long long>(h.sends_done),
                      static_cast<unsigned long long>(sent))});
    return;
  }
  std::deque<RailRequest*> waiting;
  waiting.swap(h.waiting);
  waiting_ -= static_cast<int>(waiting.size());
  for (RailRequest* w : waiting) {
    if (w->number < has) {
      settle(w, Request::State::kDone, nullptr);
    } else {
      carry(w, h.carrier, streamOn(home, h.carrier));
    }
  }
}

// Requests that wait while the rail that would bring the peer's note failed
// for another reason than its link (or no rail is left): they fail with it.
// A link failure moves them on instead (railFailed).
void RailsTransport::failWaiting() {
  for (size_t peer = 0; peer < pairs_.size(); ++peer) {
    for (HomeRail& h : pairs_[peer].homes) {
      if (h.waiting.empty()) continue;
      TransportFailure why;
      if (h.given_up) {
        failWaitingRequests(h, {ErrorKind::kPeer, strFormat("no RDMA port to rank %zu works any more", peer)});
      } else if (endpoints_[static_cast<size_t>(h.carrier)]->connectionFailed(static_cast<int>(peer), &why) &&
                 !why.link) {
        failWaitingRequests(h, why);
      }
    }
  }
}

void RailsTransport::failWaitingRequests(HomeRail& h, const TransportFailure& why) {
  for (RailRequest* w : h.waiting) settle(w, Request::State::kFailed, &why);
  waiting_ -= static_cast<int>(h.waiting.size());
  h.waiting.clear();
}

}  // namespace rcoll
