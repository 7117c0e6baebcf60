// Which path runs an op, chosen in one place.
//
// A communicator can move an op's data five ways:
//
//   host windows       every rank on one host: shared host windows (shm/shm_collectives.h)
//   pipeline           host buffers over the transport: the algorithm's schedule (pipeline_executor.h)
//   device windows     every rank on one host, device buffers: CUDA IPC windows (cuda_ipc/cuda_ipc_collectives.h)
//   device over hosts  several hosts, device buffers: device windows inside each host, rings of
//                      one rank per host between them (cuda_ipc/device_over_hosts.h)
//   staging            device buffers over the transport: the same schedules, staged through
//                      pinned host memory or GPUDirect RDMA (device_staging_executor.h)
//
// chooseRoute() reads the op's row (op_kind.h: which windows carry its kind),
// what the communicator has (RouteFacts) and the agreed settings, which are the
// same on every rank; so every rank takes the same route for the same op. The
// windows paths may still decline at run time (the device windows agree at
// their first use whether every rank could map every other's); the route then
// names the path every rank falls back to.
#pragma once

#include <cstddef>

#include "algorithms.h"
#include "op_table.h"
#include "wire.h"

namespace rcoll {

enum class OpPath { kHostWindows, kPipeline, kDeviceWindows, kDeviceOverHosts, kStaging };
const char* opPathName(OpPath path);

// What a communicator has to run ops with, and the settings that choose among
// them; the same on every rank (the agreed settings and the topology).
struct RouteFacts {
  int world = 1;
  int hosts = 1;
  bool host_windows = false;  // every rank is on this host and shares windows
  bool hierarchical = false;  // the hierarchical algorithms (several hosts, equal ranks per host)
  size_t allreduce_rd_bytes = 0;
  bool cuda_ipc = true;
  size_t cuda_ipc_slot_bytes = 0;
  size_t cuda_ipc_hosts_min_bytes = 0;
};

struct OpRoute {
  OpPath path;
  OpPath fallback;            // when `path` declines at run time; equal to `path` where it cannot
  AlgorithmChoice algorithm;  // the pipeline's and the staging's choice
};

OpRoute chooseRoute(const OpDesc& op, bool on_device, const RouteFacts& facts);

// Whether a device window step of `slot_bytes` holds one element of every
// block that `op` puts in it (reduce_scatter: the world's `world` blocks;
// allgather across `hosts` hosts: theirs; 0 hosts: one host). Past that (tiny
// slots, a huge world) every rank stages.
bool stepHoldsBlocks(const OpDesc& op, size_t slot_bytes, size_t world, size_t hosts);

}  // namespace rcoll
