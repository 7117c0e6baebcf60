// Device ops of a job of several hosts through the device windows of each
// host (cuda_ipc_collectives.h explains the algorithms): inside a host the
// data stays on the GPUs; between the hosts the ranks of one local index, one
// per host, run rings on device memory through the staging executor.
//
// This owns the windows of this host's ranks (and their device windows) and
// the ring of this rank's local index; the communicator hands it the
// executors to run the phases between the hosts with, per op.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "algorithms.h"
#include "config.h"
#include "cuda_ipc/cuda_ipc_collectives.h"
#include "schedule.h"
#include "socket_util.h"
#include "topology.h"
#include "wire.h"

namespace rcoll {

class DeviceStagingExecutor;
class PipelineExecutor;
class WindowSteps;

class DeviceOverHosts {
 public:
  // `windows`: the windows of this host's ranks, or null where this host has
  // none (a rank here refused shared memory): it then answers the other hosts
  // "off" once, and every device op stages. `topology` must fit the
  // hierarchical algorithms (hierarchicalFits) and outlive this.
  DeviceOverHosts(std::unique_ptr<WindowSteps> windows, const Topology& topology, int rank, const Config& config);
  ~DeviceOverHosts();

  // Called for every op the communicator runs, whether it comes here or not.
  void announce(const OpDesc& op, bool device);

  // Runs `op` (a kind the device windows carry, routed here by op_route.h) on
  // buffers of `device`. `host` runs the one-byte agreement at set-up, on host
  // memory; `staging` the phases between the hosts. Returns false, having run
  // nothing, when the windows are off on some host: every rank then stages.
  bool run(const OpDesc& op, const char* send, char* recv, int device, const DeviceEvent* ready, DeviceEvent* done,
           PipelineExecutor& host, DeviceStagingExecutor& staging, Deadline deadline, std::chrono::milliseconds timeout,
           const std::atomic<bool>& abort_flag, const std::string& context);

 private:
  // The ring of this rank's local index, one rank per host, for elements of `element_size`.
  AlgorithmContext ringContext(size_t element_size) const;

  std::unique_ptr<WindowSteps> windows_;
  std::unique_ptr<CudaIpcCollectives> ipc_;  // on `windows_`
  const Topology& topology_;
  const int rank_;
  const Config config_;
  bool question_answered_ = false;  // without windows: the other hosts were told "off"
  std::vector<int> ring_order_;     // the ranks of this local index, host by host
  std::vector<int> ring_position_;  // per rank: its position in ring_order_, or -1
  Schedule schedule_;
};

}  // namespace rcoll
