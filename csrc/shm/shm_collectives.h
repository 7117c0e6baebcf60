// Collectives through shared windows, for a communicator whose ranks are all on one host.
//
// The ring over shared memory copies every byte into a pair ring and out again
// at every hop: 2(P-1) copies and as many hand-offs per block. Here each rank
// copies its input once into its own window (shm_window.h) and every rank
// reads the others' windows in place:
//
//   allreduce, small steps    every rank reduces the whole step from all P
//                             windows, in rank order (so every rank gets the
//                             same bits): one synchronisation per step.
//   allreduce, large steps    rank r reduces slice r of the step from all P
//                             windows (reduce-scatter in place), publishes it
//                             in its window, then every rank copies the other
//                             slices out (allgather in place): each byte is
//                             read P times instead of moved 2(P-1) times.
//   allgather, broadcast      everyone copies straight out of the owners' windows.
//   reduce_scatter            rank r reduces block r from all P windows.
//   barrier                   the arrival counters alone.
//
// An op larger than a window slot runs in steps of at most one slot; step t
// uses slot t % 2, so rank r fills slot t+1 while its peers still read slot t,
// and it reuses a slot only once every peer has finished with it.
//
// Failure behaviour is the transport's (same wording as pipeline_executor):
// a peer's descriptor that differs from this rank's op is a MismatchError
// naming both; a peer that runs another op, or sends a ring message where
// none is due, is one too; a dead or aborting peer (side channel) is a
// PeerError; the deadline a TimeoutError naming the ranks that did not
// arrive; the abort flag (with ShmTransport::interrupt) an AbortedError.
//
// Waiting spins RCOLL_SPIN_US (yielding the core), then sleeps on this rank's
// doorbell; see shm_window.h for the wake-up protocol.
//
// CUDA buffers take the same steps through device windows (CUDA IPC) when
// every rank could map every other's: shm_device_windows.h,
// shm_collectives_device.cc.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "device_runtime.h"
#include "shm/shm_device_windows.h"
#include "shm/shm_transport.h"
#include "shm/shm_window.h"
#include "socket_util.h"
#include "timeline.h"
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

class ShmCollectives {
 public:
  // True when `transport` has the window of every rank of a world of `size`.
  static bool available(const ShmTransport& transport, int size);

  // `direct_bytes`: RCOLL_SHM_COLL_DIRECT_BYTES, the allreduce step size (times
  // the world size) up to which every rank reduces the whole step.
  ShmCollectives(ShmTransport& transport, int rank, int size, std::chrono::microseconds spin, size_t direct_bytes);
  ~ShmCollectives();

  // What the windows carry; the communicator routes these kinds here.
  static bool handles(OpKind kind);

  // Called for every op the communicator runs, whether it comes here or not:
  // a peer stuck in a window op sees that this rank runs something else.
  // `device`: the op's buffers are device memory.
  void announce(const OpDesc& op, bool device);

  // Runs `op` (a kind handles() accepts) to completion on this thread. The
  // buffers are the communicator's (allgather: `recv` holds size * count
  // elements; reduce_scatter: `send` does). Throws RcollError naming this
  // rank and the op on failure, timeout, mismatch or abort.
  void run(const OpDesc& op, const char* send, char* recv, Deadline deadline, std::chrono::milliseconds timeout,
           const std::atomic<bool>& abort_flag);

  // The same for device buffers of `config.device`, through the device
  // windows (a kind handles() accepts, barrier excepted). The op's copies
  // wait for `ready` (the caller's stream; may be null); `done` (may be null)
  // is recorded once its results are in place. The first call sets the device
  // windows up with every peer; returns false, having run nothing, when they
  // are off (RCOLL_CUDA_IPC=0 on rank 0, or some rank could not export or map
  // one): the caller then takes the staging path, as every rank does.
  struct DeviceConfig {
    const DeviceApi* api;
    int device;
    size_t slot_bytes;  // 0: device windows off
    size_t direct_bytes;
  };
  bool runDevice(const OpDesc& op, const char* send, char* recv, const DeviceConfig& config, const DeviceEvent* ready,
                 DeviceEvent* done, Deadline deadline, std::chrono::milliseconds timeout,
                 const std::atomic<bool>& abort_flag);
  // Whether device ops run through the device windows ("on", "off: why", "not set up").
  std::string deviceWindowsState() const;

  // RCOLL_TIMELINE: reductions become "reduce" slices.
  void setTimeline(Timeline* timeline) { timeline_ = timeline; }
  // When the first step found every peer arrived (the end of "wait for peers").
  std::chrono::steady_clock::time_point firstCompletion() const { return first_completion_; }

 private:
  enum class Counter { kArrived, kReduced, kFinished, kDevicePublished, kDeviceOpened };
  struct RunContext {
    const OpDesc& op;
    Deadline deadline;
    std::chrono::milliseconds timeout;
    const std::atomic<bool>& abort_flag;
    bool device = false;  // the op's buffers are device memory
  };

  // Claims the next step's slot (every peer finished the step that used it),
  // returns it.
  char* beginStep(const RunContext& run);
  // Publishes this rank's counter for the current step and wakes sleeping peers.
  void publish(Counter counter);
  // Rings the doorbell of every peer that sleeps waiting on a counter (after a store it must see).
  void wakeSleepingPeers();
  // Until every peer's counter reaches `target` (checking failures between looks).
  void waitAll(const RunContext& run, Counter counter, uint64_t target);
  // The slot of `rank` for the current step.
  char* slot(int rank) const { return shm::windowSlot(windows_[static_cast<size_t>(rank)], step_, slot_bytes_); }
  void checkDescriptors(const RunContext& run);
  // Throws if a peer failed, runs another op, sent a message, or the deadline/abort came.
  void checkPeer(const RunContext& run, int peer, Counter counter, uint64_t target);

  // out[0, count) = every window's slot at `offset` (bytes) reduced, in rank
  // order (so that ranks that each compute it get the same bits); with `own`,
  // this rank's part comes from there instead of its slot, first (`out` may
  // alias it). avg divides once.
  void reduceWindows(const OpDesc& op, char* out, const char* own, size_t offset, size_t count);
  void allreduce(const RunContext& run, const char* send, char* recv);
  void allgather(const RunContext& run, const char* send, char* recv);
  void reduceScatter(const RunContext& run, const char* send, char* recv);
  void broadcast(const RunContext& run, const char* send, char* recv);
  void barrier(const RunContext& run);

  // Device windows (shm_collectives_device.cc).
  bool setUpDevice(const RunContext& run, const DeviceConfig& config);
  // Publishes this rank's export (`mine_failed`: why it failed, else empty),
  // maps the peers', and decides with them whether the windows are on.
  bool agreeOnDevice(const RunContext& run, const std::string& mine_failed);
  std::string deviceContext(const OpDesc& op) const;
  char* deviceSlot(int rank) const;
  void deviceCheck(int rc, const OpDesc& op, const char* what) const;
  void deviceCopy(const OpDesc& op, void* dst, const void* src, size_t bytes);
  // out = every device slot at `offset` (bytes) reduced in rank order; avg divides.
  void deviceReduceSlots(const OpDesc& op, char* out, size_t offset, size_t count);
  // Until the device window stream finished what was queued (the end of a phase).
  void deviceWait(const RunContext& run);
  void deviceAllreduce(const RunContext& run, const char* send, char* recv);
  void deviceAllgather(const RunContext& run, const char* send, char* recv);
  void deviceReduceScatter(const RunContext& run, const char* send, char* recv);
  void deviceBroadcast(const RunContext& run, const char* send, char* recv);

  ShmTransport& transport_;
  int rank_;
  int size_;
  std::chrono::microseconds spin_;
  size_t slot_bytes_;
  size_t direct_bytes_;
  std::vector<char*> windows_;                 // every rank's window, indexed by rank
  std::vector<shm::WindowControl*> controls_;  // their control blocks
  shm::WindowControl* mine_;
  uint64_t step_ = 0;  // the current step (0 before the first)
  Timeline* timeline_ = nullptr;
  std::chrono::steady_clock::time_point first_completion_{};
  std::unique_ptr<ShmDeviceWindows> device_;  // created by the first device op
};

}  // namespace rcoll
