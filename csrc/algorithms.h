// Collective algorithms, expressed as schedules (schedule.h).
//
// Each builder appends the segment transfers of one rank's part of a collective.
// They work on element offsets and raw pointers; world size 1 and local copies
// (out-of-place inputs) are the communicator's business, not theirs.
#pragma once

#include <cstddef>
#include <cstdint>

#include "schedule.h"

namespace rcoll {

// How a block is cut into pipeline segments. Both ends of every transfer compute
// the same cut from the same numbers, so nothing about it travels.
struct Segmenter {
  size_t max_elems;   // RCOLL_CHUNK_BYTES / element size
  size_t min_elems;   // RCOLL_MIN_CHUNK_BYTES / element size
  // Aim for at least this many segments per block so that transfer and
  // reduction of consecutive segments overlap (Gloo uses >= 2 per rank).
  static constexpr size_t kTargetSegmentsPerBlock = 4;

  size_t segmentElems(size_t block_elems) const;
};

struct RingContext {
  int rank;
  int size;
  Segmenter segmenter;
};

// Ring allreduce: a reduce-scatter then an allgather, each P-1 steps, every step
// pipelined by segments. `send` may equal `recv` (in place). For kAvg the rank
// that completes a block divides it before passing it on.
void buildRingAllreduce(Schedule& s, const RingContext& ctx, const char* send, char* recv, size_t count);

// Ring reduce-scatter: `send` holds size*count elements, rank r ends with block r
// in `recv` (count elements). Partial sums of other blocks go to `scratch`
// (size*count elements; only the blocks of other ranks are touched).
void buildRingReduceScatter(Schedule& s, const RingContext& ctx, const char* send, char* recv,
                            char* scratch, size_t count);

// Ring allgather: `recv` holds size*count elements and already contains this
// rank's block at rank*count (the communicator copies it there).
void buildRingAllgather(Schedule& s, const RingContext& ctx, char* recv, size_t count);

// Pipelined chain broadcast from `root` along the ring: segments stream through
// every rank, each forwarding a segment as soon as it has it. `buf` holds the
// data on the root and receives it elsewhere.
void buildChainBroadcast(Schedule& s, const RingContext& ctx, char* buf, size_t count, int root);

// Dissemination barrier: ceil(log2 P) rounds of zero-byte messages.
void buildDisseminationBarrier(Schedule& s, const RingContext& ctx);

}  // namespace rcoll
