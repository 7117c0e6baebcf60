// Collective algorithms, expressed as schedules (schedule.h).
//
// Each builder appends the segment transfers of one rank's part of a collective.
// They work on element offsets and raw pointers; world size 1 and local copies
// (out-of-place inputs) are the op table's business (op_table.h), not theirs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "schedule.h"
#include "topology.h"

namespace rcoll {

// How a block is cut into pipeline segments. Both ends of every transfer compute
// the same cut from the same numbers, so nothing about it travels.
struct Segmenter {
  size_t max_elems;  // RCOLL_CHUNK_BYTES / element size
  size_t min_elems;  // RCOLL_MIN_CHUNK_BYTES / element size
  // Aim for at least this many segments per block so that transfer and
  // reduction of consecutive segments overlap (Gloo uses >= 2 per rank).
  static constexpr size_t kTargetSegmentsPerBlock = 4;

  size_t segmentElems(size_t block_elems) const;
};

// Who runs a builder and how it cuts blocks: every algorithm takes one (ring or not).
struct AlgorithmContext {
  int rank;
  int size;
  Segmenter segmenter;
  // The ring's order: ring_order[i] is the rank at position i, ring_position[r]
  // the position of rank r (Topology::host_order: host by host, so that the
  // ring crosses each host's link once per direction however the launcher
  // numbered the ranks). Null: rank order. Rings, chains and the blocks they
  // pass around follow positions; a block's place in the buffers stays its rank's.
  const int* ring_order = nullptr;
  const int* ring_position = nullptr;
  // Where the ranks are (hosts, local ranks), for the hierarchical algorithms. Null: unknown.
  const Topology* topology = nullptr;
  // The ring reduce-scatter's buffers hold `size` blocks, the block of ring
  // position b at b * count, instead of world-sized buffers with each block at
  // its rank's place: a ring of a few ranks of a large world (one per host)
  // then needs no world-sized scratch.
  bool blocks_by_position = false;

  int position() const { return ring_position ? ring_position[rank] : rank; }
  int positionOf(int r) const { return ring_position ? ring_position[r] : r; }
  // The rank `steps` places after this one along the ring (negative: before).
  int rankAt(int position) const {
    const int p = ((position % size) + size) % size;
    return ring_order ? ring_order[p] : p;
  }
};

// Ring allreduce: a reduce-scatter then an allgather, each P-1 steps, every step
// pipelined by segments, around the ring's order (the blocks are cut by position). `send` may equal `recv` (in place).
// For kAvg the rank that completes a block divides it before passing it on.
void buildRingAllreduce(Schedule& s, const AlgorithmContext& ctx, const char* send, char* recv, size_t count);

// Recursive-doubling allreduce for small buffers: log2(P) exchanges of the
// whole buffer instead of the ring's 2(P-1) steps, so latency, not bandwidth,
// sets its cost. With P not a power of two, the first 2*(P - 2^k) ranks pair
// up: the even one folds its input into the odd one, sits the exchanges out
// and receives the result at the end (MPICH's scheme). Messages are segmented
// like the ring's. Partial results are always combined lower ranks first, so
// every rank ends with the same bits. `send` may equal `recv`.
void buildRecursiveDoublingAllreduce(Schedule& s, const AlgorithmContext& ctx, const char* send, char* recv,
                                     size_t count);

// Hierarchical allreduce, for several hosts of k ranks each (hierarchicalFits; csrc/hierarchical.cc):
// a ring reduce-scatter inside each host leaves local rank i with shard i of
// the host's sum; the k ranks of local index i, one per host, allreduce shard i
// between the hosts with a ring (the k rings run side by side, so each host link
// carries 2(H-1)/H of the buffer instead of the flat ring's 2(P-1)/P); a ring
// allgather inside each host hands every rank every shard. One schedule: the
// buffer is cut once into segments that every phase moves whole, and a segment
// goes on to the next phase as soon as the last one finished it, so the
// phases of different segments overlap. Bit-identical on every rank (each
// segment is reduced on one rank and copied). `send` may equal `recv`.
void buildHierarchicalAllreduce(Schedule& s, const AlgorithmContext& ctx, const char* send, char* recv, size_t count);

// Hierarchical allgather and reduce-scatter (same conditions, same single
// schedule): each host link carries (H-1)/H of the gathered buffer per
// direction where the ring carries (P-1)/P. Allgather: the ranks of local
// index i collect their blocks between the hosts, then each host passes those
// groups around; reduce-scatter runs it backwards (each rank sums its local
// index's group over its host, then the hosts reduce it). Arguments as
// buildRingAllgather and buildRingReduceScatter.
void buildHierarchicalAllgather(Schedule& s, const AlgorithmContext& ctx, char* recv, size_t count);
void buildHierarchicalReduceScatter(Schedule& s, const AlgorithmContext& ctx, const char* send, char* recv,
                                    char* scratch, size_t count);

// Whether the hierarchical algorithms apply: at least two hosts, each with the
// same number (at least two) of ranks. If not, `why` says why (for the INFO log).
bool hierarchicalFits(const Topology& topology, std::string* why);

// Ring reduce-scatter: `send` holds size*count elements, rank r ends with block r
// in `recv` (count elements). Partial sums of other blocks go to `scratch`
// (size*count elements; only the blocks of other ranks are touched).
void buildRingReduceScatter(Schedule& s, const AlgorithmContext& ctx, const char* send, char* recv, char* scratch,
                            size_t count);

// Ring allgather: `recv` holds size*count elements and already contains this
// rank's block at rank*count (the communicator copies it there).
void buildRingAllgather(Schedule& s, const AlgorithmContext& ctx, char* recv, size_t count);

// Bruck's allgather for small buffers: ceil(log2 P) steps instead of the
// ring's P - 1, so latency, not bandwidth, sets its cost (the allreduce's
// recursive doubling, for any P). At the step of distance d = 1, 2, 4, ...
// rank r holds the blocks of ranks r .. r+d-1 (mod P); it sends them to rank
// r-d and receives those of ranks r+d .. r+2d-1 from rank r+d (at the last
// step only what is still missing). Each block is one message that lands
// straight in its place in `recv`, so nothing is rotated at the end, and a
// block forwarded waits for the receive that brought it. Same buffer contract
// as the ring's.
void buildBruckAllgather(Schedule& s, const AlgorithmContext& ctx, char* recv, size_t count);

// Pipelined chain broadcast from `root` along the ring (in the ring's order, from
// the root's position on): segments stream through
// every rank, each forwarding a segment as soon as it has it. `buf` holds the
// data on the root and receives it elsewhere.
void buildChainBroadcast(Schedule& s, const AlgorithmContext& ctx, char* buf, size_t count, int root);

// Dissemination barrier: ceil(log2 P) rounds of zero-byte messages.
void buildDisseminationBarrier(Schedule& s, const AlgorithmContext& ctx);

// The rooted ops below also carry one zero-byte message per pair that would
// otherwise only ever talk in one direction (the root's "go" to the chain's
// start or to every rank for reduce and gather, every rank's "ready" to the
// root for scatter). It costs no latency on the data path, and it makes ranks
// that disagree on the root meet a header that names the other root instead of
// waiting for each other until the timeout.

// Pipelined chain reduce towards `root`: the chain broadcast run backwards.
// Rank root-1 (the far end) sends its input; every other rank r receives the
// partial result from r+1 segment by segment, reduces it with its own input and
// forwards it to r-1 at once, so the segments pipeline along the chain. Partial
// sums land in `partial` (count elements; used on ranks other than the root and
// root-1), the final result in the root's `recv` (which may equal `send`). For
// kAvg the root divides once.
void buildChainReduce(Schedule& s, const AlgorithmContext& ctx, const char* send, char* recv, char* partial,
                      size_t count, int root);

// Direct gather: every rank sends its `count` elements, segmented, straight to
// the root, which receives block r at recv + r*count (interleaving the peers'
// segments). The root's own block is the communicator's business.
void buildDirectGather(Schedule& s, const AlgorithmContext& ctx, const char* send, char* recv, size_t count, int root);

// Direct scatter: the root sends block r of `send` (size*count elements) to
// rank r, segmented; rank r receives it into `recv`. The root's own block is
// the communicator's business.
void buildDirectScatter(Schedule& s, const AlgorithmContext& ctx, const char* send, char* recv, size_t count, int root);

// Pairwise alltoallv: in step j = 1..P-1 rank r sends its block for (r+j) % P
// and receives the block of (r-j) % P, segmented; a pair with nothing to move
// still exchanges one zero-byte message so that a disagreement on its count is
// caught (wire.h). Counts and displacements are in elements, one per rank; the
// block to self is the communicator's business. Fills the schedule's pair counts.
void buildPairwiseAllToAll(Schedule& s, const AlgorithmContext& ctx, const char* send, char* recv,
                           const uint64_t* send_counts, const uint64_t* send_displs, const uint64_t* recv_counts,
                           const uint64_t* recv_displs);

// The peers this rank's collectives exchange with whatever the sizes: its
// neighbours in the host-ordered ring, its recursive-doubling and barrier
// partners, the ranks of its host, and, where the hierarchical algorithms
// apply, the ranks of its local index on the neighbouring hosts. The relation
// is symmetric (each end of a pair finds the other), so both connect the pair
// at start-up; a rooted op's other ranks and alltoall's connect on first use
// (mesh.cc). O(log P + local ranks) per rank.
std::vector<bool> collectivePeers(int rank, const Topology& topology);

}  // namespace rcoll
