// The shared-window collectives on device (GPU) buffers of ranks on one host,
// through CUDA IPC.
//
// Each rank allocates one block of device memory (two slots, as its host
// window has) at its first device op that the windows carry, exports it with
// ipc_handle() into its host window's control page, and maps every peer's
// block with ipc_open(). The ops then take the host windows' steps and
// counters (shm/window_steps.h) with the data on the GPU: a rank copies its
// input into its device slot, and each rank reduces (with the device API's
// kernels) or copies straight out of the others' slots, device to device.
// Nothing crosses host memory; the host only orders the steps.
//
// Each phase of a step ends with the rank waiting for its own stream (an
// event, polled) before it publishes its counter: a peer may read a slot once
// the data is really there, and a slot is reused only after every peer's
// reads of it completed on the GPU.
//
// Set-up is agreed, so that every rank takes the same path: each publishes
// whether it exported its block, then whether it mapped all the others';
// unless all succeeded, every rank turns the device windows off and device
// ops take the pinned-host staging path (device_staging_executor.h).
//
// In a job of several hosts the windows span the ranks of this host (the
// WindowSteps' group) and serve the hierarchical collectives; the ranks of
// local index i, one per host, talk between the hosts through the staging
// executor (BetweenHosts), and inside a host the data never leaves the GPU:
//   allreduce       in each step, local rank i sums slice i of the step over
//                   its host from the device windows, allreduces it with the
//                   other hosts, and leaves the result in its slot, from which
//                   the host's other ranks copy it: each host link carries
//                   2(H-1)/H of the buffer.
//   allgather       first between the hosts (each rank collects the blocks of
//                   its local index), then each rank's H blocks go through its
//                   window to the host's other ranks.
//   reduce_scatter  backwards: local rank i sums, over its host, the blocks of
//                   the ranks of local index i (read from every window), then
//                   the hosts reduce-scatter those sums.
//   broadcast       the ranks of the root's local index pass the buffer down a
//                   chain between the hosts (one crossing of each host link),
//                   then each of them hands it to its host's ranks through
//                   its window.
// Every host must take this path or none (the wire protocols differ), so
// set-up ends with BetweenHosts::agree.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "config.h"
#include "device_runtime.h"
#include "shm/window_steps.h"
#include "socket_util.h"
#include "topology.h"
#include "wire.h"

namespace rcoll {

class CudaIpcCollectives {
 public:
  struct Config {
    const DeviceApi* api;
    int device;
    size_t slot_bytes;    // RCOLL_CUDA_IPC_SLOT_BYTES; 0: device windows off (RCOLL_CUDA_IPC=0)
    size_t direct_bytes;  // RCOLL_CUDA_IPC_DIRECT_BYTES
  };

  // Where the windows serve one host of several (see above).
  struct BetweenHosts {
    // At set-up, once: whether every host's windows are on, given this host's
    // answer; the same answer on every rank.
    std::function<bool(bool this_host_on)> agree;
    // Sums `count` elements at `data` (device memory) with the same slice of
    // the other hosts, in place.
    std::function<void(char* data, size_t count)> allreduce;
    // `recv` (world_size * count elements) holds this rank's block; the
    // blocks of this local index's ranks on the other hosts arrive.
    std::function<void(char* recv, size_t count)> allgather;
    // `sums` (hosts * count) holds this host's sums of the blocks of this
    // local index's ranks, host h's rank's at h * count; their sum over the
    // hosts of this rank's block ends in `recv`. The other blocks of `sums`
    // are overwritten.
    std::function<void(char* sums, char* recv, size_t count)> reduce_scatter;
    // `data` (count elements) of `root` (a rank of this local index) reaches
    // the other ranks of this local index, in place.
    std::function<void(char* data, size_t count, int root)> broadcast;
    // Device memory of at least `bytes` for reduce_scatter's sums.
    std::function<char*(size_t bytes)> scratch;
    // Where the ranks are: topology->ranks_on_host[h][i] is the rank of local
    // index i on host h. avg divides once, by the world size.
    const Topology* topology;
    size_t worldSize() const { return topology->host_of.size(); }
  };

  explicit CudaIpcCollectives(WindowSteps& steps)
      : steps_(steps), rank_(steps.globalRank()), me_(steps.rank()), size_(steps.size()) {}
  ~CudaIpcCollectives();

  // Runs `op` (a kind the device windows carry, whose blocks fit a step:
  // op_route.h chose this path) on device buffers of `config.device` through
  // the device windows. Its copies wait for `ready` (the caller's stream; may be null);
  // `done` (may be null) is recorded once its results are in place. The first
  // call sets the windows up with every peer; returns false, having run
  // nothing, when they are off (RCOLL_CUDA_IPC=0 on rank 0, or some rank could
  // not export or map one): the caller then takes the staging path, as every
  // rank does. Throws RcollError naming this rank and the op on failure.
  // `hosts`: the windows serve one host of several, else null.
  bool run(const OpDesc& op, const char* send, char* recv, const Config& config, const DeviceEvent* ready,
           DeviceEvent* done, Deadline deadline, std::chrono::milliseconds timeout, const std::atomic<bool>& abort_flag,
           const BetweenHosts* hosts = nullptr);
  // "on (...)", "off: why", or "not set up (no device op yet)".
  std::string state() const;

 private:
  using RunContext = WindowSteps::RunContext;
  using Counter = WindowSteps::Counter;

  struct Windows {
    enum class State { kUnset, kOn, kOff };

    Windows(const DeviceApi& api, int device, size_t slot_bytes, size_t direct_bytes)
        : api(api), device(device), slot_bytes(slot_bytes), direct_bytes(direct_bytes) {}
    ~Windows();
    Windows(const Windows&) = delete;
    Windows& operator=(const Windows&) = delete;

    // Unmaps the peers' blocks and frees this rank's (after its stream is idle).
    void release();

    const DeviceApi& api;
    const int device;
    const size_t slot_bytes;
    const size_t direct_bytes;
    State state = State::kUnset;
    std::string why_off;                 // when kOff: the reason, for the log
    char* own = nullptr;                 // this rank's block (device_alloc)
    std::vector<char*> blocks;           // every rank's block, mapped here (own at this rank)
    void* stream = nullptr;              // every copy and kernel of the device windows
    std::unique_ptr<DeviceEvent> event;  // polled at the end of each phase
  };

  bool setUp(const RunContext& run, const Config& config, const BetweenHosts* hosts);
  // Publishes this rank's export (`mine_failed`: why it failed, else empty),
  // maps the peers', and decides with them whether the windows are on.
  bool agree(const RunContext& run, const std::string& mine_failed);
  void turnOff(const std::string& why);
  std::string context(const OpDesc& op) const;
  // The device slot of the group's rank at `index` for the current step.
  char* slot(int index) const;
  void check(int rc, const OpDesc& op, const char* what) const;
  void copy(const OpDesc& op, void* dst, const void* src, size_t bytes);
  // out = every device slot at `offset` (bytes) reduced in rank order with
  // `reduce_op`; then divided by `divisor` unless it is 0.
  void reduceSlots(const OpDesc& op, ReduceOp reduce_op, size_t divisor, char* out, size_t offset, size_t count);
  // Until the device window stream finished what was queued (the end of a phase).
  void wait(const RunContext& run);
  void allreduce(const RunContext& run, const char* send, char* recv, const BetweenHosts* hosts);
  void allgather(const RunContext& run, const char* send, char* recv);
  void reduceScatter(const RunContext& run, const char* send, char* recv);
  // Both reduce-scatters' steps in the host: each window holds the step of
  // all `blocks` blocks of `send` (op.count elements each); this rank reduces
  // blocks `mine` over the group into out(block), with `how`, then divides by
  // `divisor` unless it is 0.
  void reduceBlocks(const RunContext& run, const char* send, size_t blocks, const std::vector<size_t>& mine,
                    ReduceOp how, size_t divisor, const std::function<char*(size_t block)>& out);
  void allgatherOverHosts(const RunContext& run, const char* send, char* recv, const BetweenHosts& hosts);
  void reduceScatterOverHosts(const RunContext& run, const char* send, char* recv, const BetweenHosts& hosts);
  void broadcastOverHosts(const RunContext& run, const char* send, char* recv, const BetweenHosts& hosts);
  // `source` (group index) hands `from` (its buffer) to every rank's `recv`
  // through its window.
  void broadcastFrom(const RunContext& run, int source, const char* from, char* recv);

  WindowSteps& steps_;
  const int rank_;                   // the communicator's rank (for messages)
  const int me_;                     // its index in the group (slots)
  const int size_;                   // the group's size
  std::unique_ptr<Windows> device_;  // created by the first device op
};

// The device windows' settings (RCOLL_CUDA_IPC*, agreed) for buffers on `device`.
CudaIpcCollectives::Config deviceWindowsConfig(const Config& settings, int device);

}  // namespace rcoll
