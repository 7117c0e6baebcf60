// A schedule's sends as the executors post them: one queue per peer, each in
// schedule order.
//
// A send whose dependency has not arrived holds back the later sends to its
// peer (a pair's messages match in order), but not those to other peers: the
// phases of a hierarchical schedule and a ring's two directions move
// independently. Both executors (pipeline_executor.h, device_staging_executor.h)
// post through this; what bounds them differs (a send window, send slots).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "schedule.h"

namespace rcoll {

class SendQueues {
 public:
  struct Peer {
    int peer;
    size_t next = 0;       // position in this peer's queue of its next send to post
    size_t in_flight = 0;  // of its sends, those posted and not finished
  };

  // Queues `schedule`'s sends (ranks below `world`); forgets the previous schedule's.
  void reset(const Schedule& schedule, int world) {
    if (queue_.size() < static_cast<size_t>(world)) {
      queue_.resize(static_cast<size_t>(world));
      peer_index_.resize(static_cast<size_t>(world));
    }
    for (const Peer& previous : peers_) queue_[static_cast<size_t>(previous.peer)].clear();
    peers_.clear();
    for (size_t i = 0; i < schedule.sends.size(); ++i) {
      const size_t peer = static_cast<size_t>(schedule.sends[i].peer);
      if (queue_[peer].empty()) {
        peer_index_[peer] = static_cast<uint32_t>(peers_.size());
        peers_.push_back({schedule.sends[i].peer});
      }
      queue_[peer].push_back(static_cast<uint32_t>(i));
    }
  }

  // The peers this schedule sends to.
  std::vector<Peer>& peers() { return peers_; }
  // The index into schedule.sends of `p`'s next send, or -1 once all are posted.
  int64_t next(const Peer& p) const {
    const std::vector<uint32_t>& q = queue_[static_cast<size_t>(p.peer)];
    return p.next < q.size() ? static_cast<int64_t>(q[p.next]) : -1;
  }
  // The earliest send in schedule order not posted yet (-1: none).
  int64_t earliestUnposted() const {
    int64_t earliest = -1;
    for (const Peer& p : peers_) {
      const int64_t n = next(p);
      if (n >= 0 && (earliest < 0 || n < earliest)) earliest = n;
    }
    return earliest;
  }
  void posted(Peer& p) {
    ++p.next;
    ++p.in_flight;
  }
  void finished(int peer) { --peers_[peer_index_[static_cast<size_t>(peer)]].in_flight; }

 private:
  std::vector<std::vector<uint32_t>> queue_;  // per rank: its sends' indices, in schedule order
  std::vector<Peer> peers_;
  std::vector<uint32_t> peer_index_;  // per rank: its index in peers_
};

}  // namespace rcoll
