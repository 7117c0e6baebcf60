// The step protocol of the shared-window collectives, written once for host
// data (shm_collectives.h) and device data (cuda_ipc/cuda_ipc_collectives.h).
//
// Every rank of one host has a window (shm_window.h): two slots and a control
// page of counters. An op runs in steps of at most one slot; step t uses slot
// t % 2. In each step a rank
//   1. claims its slot (every peer has finished the step that used it last),
//   2. fills it (its part of the op) and publishes "arrived",
//   3. waits until every peer arrived and checks that all run the same op,
//   4. reads the peers' slots (in one or two phases), and publishes "finished".
// forEachStep() is that loop; the collectives supply steps 2 and 4.
//
// Waiting spins RCOLL_SPIN_US (yielding the core), then sleeps on this rank's
// doorbell (see shm_window.h for the wake-up protocol). Failures: a peer's
// descriptor that differs from this rank's op is a MismatchError naming both;
// a peer that runs another op, or sends a ring message where none is due, is
// one too; a dead or aborting peer (side channel) a PeerError; the deadline a
// TimeoutError naming the ranks that did not arrive; the abort flag an
// AbortedError.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "shm/shm_transport.h"
#include "shm/shm_window.h"
#include "socket_util.h"
#include "wire.h"

namespace rcoll {

// Rank r's slice [*lo, *lo + *len) of a step of n elements cut into P slices
// that start on multiples of `align` elements (allreduce's sliced steps).
inline void sliceOfStep(size_t n, size_t P, size_t r, size_t align, size_t* lo, size_t* len) {
  const size_t units = (n + align - 1) / align;
  const size_t a = std::min(n, units * r / P * align), b = std::min(n, units * (r + 1) / P * align);
  *lo = a;
  *len = b - a;
}

class WindowSteps {
 public:
  enum class Counter { kArrived, kReduced, kFinished, kDevicePublished, kDeviceOpened };
  struct RunContext {
    const OpDesc& op;
    Deadline deadline;
    std::chrono::milliseconds timeout;
    const std::atomic<bool>& abort_flag;
    bool device = false;  // the op's buffers are device memory
  };

  // True when `transport` has the window of every rank of `members` (the
  // group's ranks, ascending: every rank of a one-host job, or the ranks of
  // this host in a job of several hosts).
  static bool available(const ShmTransport& transport, const std::vector<int>& members);

  // `rank` is one of `members`. Inside the group a rank is known by its index
  // in `members` (slots, counters); messages name the communicator's ranks.
  WindowSteps(ShmTransport& transport, std::vector<int> members, int rank, std::chrono::microseconds spin);

  int rank() const { return me_; }  // this rank's index in the group
  int size() const { return size_; }
  int member(int index) const { return members_[static_cast<size_t>(index)]; }  // the communicator's rank
  // The group's index of a communicator rank, -1 if it is not in the group.
  int indexOf(int rank) const {
    const auto it = std::find(members_.begin(), members_.end(), rank);
    return it == members_.end() ? -1 : static_cast<int>(it - members_.begin());
  }
  int globalRank() const { return rank_; }
  uint64_t step() const { return step_; }
  size_t slotBytes() const { return slot_bytes_; }
  // The host slot of the rank at `index` in the group, for the current step.
  char* slot(int index) const { return shm::windowSlot(windows_[static_cast<size_t>(index)], step_, slot_bytes_); }
  shm::WindowControl* control(int index) const { return controls_[static_cast<size_t>(index)]; }
  shm::WindowControl* mine() const { return mine_; }

  // Called for every op the communicator runs, whether the windows carry it
  // or not: a peer stuck in a window op sees that this rank runs something else.
  void announce(const OpDesc& op, bool device);

  // The loop above: for each step of at most `per_step` of `total` elements
  // (at least one step, for a count of 0 too: the descriptors still meet),
  // fill(done, n) then, once every peer arrived and runs the same op,
  // consume(done, n).
  template <typename Fill, typename Consume>
  void forEachStep(const RunContext& run, size_t total, size_t per_step, Fill&& fill, Consume&& consume) {
    first_completion_ = {};
    size_t done = 0;
    do {
      const size_t n = std::min(per_step, total - done);
      beginStep(run);
      fill(done, n);
      publish(Counter::kArrived);
      waitAll(run, Counter::kArrived, step_);
      checkDescriptors(run);
      consume(done, n);
      publish(Counter::kFinished);
      done += n;
    } while (done < total);
  }
  // A second phase inside consume(): publishes `counter` for this step and
  // waits for every peer's.
  void exchange(const RunContext& run, Counter counter) {
    publish(counter);
    waitAll(run, counter, step_);
  }

  // Publishes a set-up counter value (device windows) and wakes sleeping peers.
  void publishValue(Counter counter, uint64_t value);
  // Until every peer's counter reaches `target` (checking failures between looks).
  void waitAll(const RunContext& run, Counter counter, uint64_t target);
  uint64_t counter(int index, Counter counter) const;

  // When the first step found every peer arrived (the end of "wait for peers").
  std::chrono::steady_clock::time_point firstCompletion() const { return first_completion_; }

 private:
  // Claims the next step's slot (every peer finished the step that used it)
  // and writes this rank's step descriptor.
  void beginStep(const RunContext& run);
  void publish(Counter counter);
  // Rings the doorbell of every peer that sleeps waiting on a counter (after a store it must see).
  void wakeSleepingPeers();
  void checkDescriptors(const RunContext& run);
  // Throws if a peer (`index` in the group) failed, runs another op, sent a
  // message, or the deadline/abort came.
  void checkPeer(const RunContext& run, int index, Counter counter, uint64_t target);

  ShmTransport& transport_;
  std::vector<int> members_;  // the group's ranks, ascending
  int rank_;                  // this rank (the communicator's)
  int me_;                    // its index in members_
  int size_;
  std::chrono::microseconds spin_;
  size_t slot_bytes_;
  std::vector<char*> windows_;                 // every member's window, by index in the group
  std::vector<shm::WindowControl*> controls_;  // their control blocks
  shm::WindowControl* mine_;
  uint64_t step_ = 0;  // the current step (0 before the first)
  std::chrono::steady_clock::time_point first_completion_{};
};

}  // namespace rcoll
