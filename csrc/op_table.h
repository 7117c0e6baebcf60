// What every collective gets before and after its route is chosen: the checks
// made before it is queued, its local step and the algorithm that builds its
// transfers (the rows that describe each kind are op_kind.h's). Host and device
// ops both go through it (communicator.cc), so adding a collective is one row
// in op_kind.cc, one case in planOp(), a builder in algorithms.cc and one line
// per front end.
//
// Nothing here knows of threads, transports or devices: the local step runs
// through LocalMemory (host memory, or a device's through its staging executor)
// and the transfers go into a Schedule that an executor runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "algorithms.h"
#include "dtype.h"
#include "local_memory.h"
#include "op_kind.h"
#include "schedule.h"
#include "wire.h"

namespace rcoll {

// The checks every collective gets once, on the caller's thread, before it
// takes a sequence number: root in range, dtype/op supported, sizes that fit in
// memory, no null buffer where the op reads or writes. Throws
// RcollError(kInvalidArgument) naming the rank and the op. `desc.seq` is the
// number the op would take (for the message).
void checkOpArgs(const OpDesc& desc, int rank, int size, const void* send, const void* recv);

// alltoallv's arguments, checked (one entry per rank, nothing negative or
// overflowing, the block to self the same size on both sides, no overlap of
// the two buffers) and packed as the op carries them: send_counts,
// send_displs, recv_counts, recv_displs, `size` entries each, in elements.
struct AllToAllArgs {
  std::vector<uint64_t> packed;
  uint64_t send_total = 0;  // elements
};
AllToAllArgs checkAllToAllArgs(int rank, int size, DataType dtype, const void* send, void* recv,
                               const std::vector<int64_t>& send_counts, const std::vector<int64_t>& send_displs,
                               const std::vector<int64_t>& recv_counts, const std::vector<int64_t>& recv_displs);

// One op on this rank, as queued.
struct OpCall {
  const OpDesc& desc;
  const char* send;
  char* recv;
  const std::vector<uint64_t>& alltoall_counts;  // AllToAllArgs::packed; empty for other ops
};

// Algorithm choices an executor can take.
struct AlgorithmChoice {
  // Recursive doubling for allreduces up to this size, Bruck's algorithm for
  // allgathers whose gathered result is up to it; 0: always the ring.
  size_t allreduce_rd_bytes = 0;
  // Reduce-scatter and the allgathers and allreduces above allreduce_rd_bytes:
  // the hierarchical algorithms (need ctx.topology, which hierarchicalFits()),
  // else the ring.
  bool hierarchical = false;
};

// Runs the op's local step (out-of-place inputs copied where the algorithm
// expects them, a world of one's whole op) on `memory`, then builds its
// transfers into `schedule` (already reset for the op). Returns false when
// nothing is left to transfer.
bool planOp(const OpCall& op, const AlgorithmContext& ctx, const AlgorithmChoice& choice, LocalMemory& memory,
            Schedule& schedule);

}  // namespace rcoll
