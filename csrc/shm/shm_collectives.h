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
// An op larger than a window slot runs in steps of at most one slot, and the
// steps, their counters and every failure check are window_steps.h's, shared
// with the device windows.
//
// CUDA buffers take the same steps through device windows (CUDA IPC) when
// every rank could map every other's: cuda_ipc/cuda_ipc_collectives.h.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "cuda_ipc/cuda_ipc_collectives.h"
#include "shm/shm_transport.h"
#include "shm/window_steps.h"
#include "socket_util.h"
#include "timeline.h"
#include "wire.h"

namespace rcoll {

class ShmCollectives {
 public:
  // True when `transport` has the window of every rank of a world of `size`.
  static bool available(const ShmTransport& transport, int size);

  // `direct_bytes`: RCOLL_SHM_COLL_DIRECT_BYTES, the allreduce step size (times
  // the world size) up to which every rank reduces the whole step.
  ShmCollectives(ShmTransport& transport, int rank, int size, std::chrono::microseconds spin, size_t direct_bytes);
  ~ShmCollectives();

  // Called for every op the communicator runs, whether it comes here or not:
  // a peer stuck in a window op sees that this rank runs something else.
  // `device`: the op's buffers are device memory.
  void announce(const OpDesc& op, bool device) { steps_.announce(op, device); }

  // Runs `op` (a kind the host windows carry: op_kind.h, routed here by
  // op_route.h) to completion on this thread. The
  // buffers are the communicator's (allgather: `recv` holds size * count
  // elements; reduce_scatter: `send` does). Throws RcollError naming this
  // rank and the op on failure, timeout, mismatch or abort.
  void run(const OpDesc& op, const char* send, char* recv, Deadline deadline, std::chrono::milliseconds timeout,
           const std::atomic<bool>& abort_flag);

  // The same for device buffers, through the CUDA IPC windows
  // (CudaIpcCollectives::run: false, having run nothing, when they are off).
  using DeviceConfig = CudaIpcCollectives::Config;
  bool runDevice(const OpDesc& op, const char* send, char* recv, const DeviceConfig& config, const DeviceEvent* ready,
                 DeviceEvent* done, Deadline deadline, std::chrono::milliseconds timeout,
                 const std::atomic<bool>& abort_flag) {
    return ipc_.run(op, send, recv, config, ready, done, deadline, timeout, abort_flag);
  }
  // Whether device ops run through the device windows ("on", "off: why", "not set up").
  std::string deviceWindowsState() const { return ipc_.state(); }

  // RCOLL_TIMELINE: reductions become "reduce" slices.
  void setTimeline(Timeline* timeline) { timeline_ = timeline; }
  // When the first step found every peer arrived (the end of "wait for peers").
  std::chrono::steady_clock::time_point firstCompletion() const { return steps_.firstCompletion(); }

 private:
  using RunContext = WindowSteps::RunContext;
  using Counter = WindowSteps::Counter;

  char* slot(int rank) const { return steps_.slot(rank); }
  // out[0, count) = every window's slot at `offset` (bytes) reduced, in rank
  // order (so that ranks that each compute it get the same bits); with `own`,
  // this rank's part comes from there instead of its slot, first (`out` may
  // alias it). avg divides once.
  void reduceWindows(const OpDesc& op, char* out, const char* own, size_t offset, size_t count);
  void allreduce(const RunContext& run, const char* send, char* recv);
  void allgather(const RunContext& run, const char* send, char* recv);
  void reduceScatter(const RunContext& run, const char* send, char* recv);
  void broadcast(const RunContext& run, const char* send, char* recv);

  WindowSteps steps_;
  int rank_;
  int size_;
  size_t slot_bytes_;
  size_t direct_bytes_;
  Timeline* timeline_ = nullptr;
  CudaIpcCollectives ipc_;  // the device windows, set up by the first device op
};

}  // namespace rcoll
