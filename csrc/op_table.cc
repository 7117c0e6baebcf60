#include "op_table.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "adasum.h"
#include "error.h"
#include "reduce_kernels.h"

namespace rcoll {

namespace {

// AllToAllArgs::packed, read back: four runs of one entry per rank, in elements.
struct AllToAllLayout {
  const uint64_t* send_counts;
  const uint64_t* send_displs;
  const uint64_t* recv_counts;
  const uint64_t* recv_displs;
};
AllToAllLayout allToAllLayout(const std::vector<uint64_t>& packed, int size) {
  const size_t P = static_cast<size_t>(size);
  return {packed.data(), packed.data() + P, packed.data() + 2 * P, packed.data() + 3 * P};
}

bool needs(BufferUse use, bool is_root) {
  return use == BufferUse::kEveryRank || (use == BufferUse::kRootOnly && is_root);
}

}  // namespace

void checkOpArgs(const OpDesc& desc, int rank, int size, const void* send, const void* recv) {
  const OpTraits& t = opTraits(desc.kind);
  const int root = static_cast<int>(static_cast<int32_t>(desc.root));
  if (root < 0 || root >= size) {  // named without describeOp(), which cannot show a negative root
    throwError(ErrorKind::kInvalidArgument,
               strFormat("rank %d: %s: root %d is not a rank of this communicator (size %d)", rank,
                         opKindName(desc.kind), root, size));
  }
  std::string bad;
  if (t.reduces) bad = reduceUnsupportedReason(desc.dtype, desc.reduce_op);
  if (desc.kind == OpKind::kAdasum) bad = adasumUnsupportedReason(desc.dtype, size);
  const size_t es = elementSize(desc.dtype);
  if (bad.empty() &&
      desc.count > std::numeric_limits<size_t>::max() / es / (t.per_rank_blocks ? static_cast<size_t>(size) : 1)) {
    bad = strFormat("count %zu is too large: the buffers would not fit in memory", static_cast<size_t>(desc.count));
  }
  const bool is_root = rank == root;
  if (bad.empty() && desc.count > 0 &&
      ((needs(t.send, is_root) && send == nullptr) || (needs(t.recv, is_root) && recv == nullptr))) {
    bad = "null buffer";
  }
  if (!bad.empty()) {
    throwError(ErrorKind::kInvalidArgument, strFormat("rank %d: %s: %s", rank, describeOp(desc).c_str(), bad.c_str()));
  }
}

AllToAllArgs checkAllToAllArgs(int rank, int size, DataType dtype, const void* send, void* recv,
                               const std::vector<int64_t>& send_counts, const std::vector<int64_t>& send_displs,
                               const std::vector<int64_t>& recv_counts, const std::vector<int64_t>& recv_displs) {
  const size_t P = static_cast<size_t>(size);
  const uint64_t es = elementSize(dtype);
  auto invalid = [&](const std::string& why) {
    throwError(ErrorKind::kInvalidArgument,
               strFormat("rank %d: alltoall(%s): %s", rank, dataTypeName(dtype), why.c_str()));
  };
  const std::vector<int64_t>* vectors[4] = {&send_counts, &send_displs, &recv_counts, &recv_displs};
  static const char* const kNames[4] = {"send_counts", "send_displs", "recv_counts", "recv_displs"};
  for (int i = 0; i < 4; ++i) {
    if (vectors[i]->size() != P) {
      invalid(strFormat("%s has %zu entries, expected one per rank (%zu)", kNames[i], vectors[i]->size(), P));
    }
  }
  // Every byte offset must fit in a signed 64-bit integer (and so in size_t and ptrdiff_t).
  const uint64_t max_elems = static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / es;
  AllToAllArgs args;
  args.packed.resize(4 * P);
  uint64_t totals[2] = {0, 0};
  uint64_t lo[2] = {max_elems, max_elems}, hi[2] = {0, 0};  // elements touched: [lo, hi)
  for (int side = 0; side < 2; ++side) {
    const std::vector<int64_t>& counts = *vectors[2 * side];
    const std::vector<int64_t>& displs = *vectors[2 * side + 1];
    const char* cname = kNames[2 * side];
    const char* dname = kNames[2 * side + 1];
    for (size_t p = 0; p < P; ++p) {
      if (counts[p] < 0) invalid(strFormat("%s[%zu] = %lld is negative", cname, p, static_cast<long long>(counts[p])));
      if (displs[p] < 0) invalid(strFormat("%s[%zu] = %lld is negative", dname, p, static_cast<long long>(displs[p])));
      uint64_t c = static_cast<uint64_t>(counts[p]), d = static_cast<uint64_t>(displs[p]);
      if (c > max_elems || d > max_elems - c) {
        invalid(strFormat("%s[%zu] + %s[%zu] = %lld + %lld elements overflows the address space", dname, p, cname, p,
                          static_cast<long long>(displs[p]), static_cast<long long>(counts[p])));
      }
      if (totals[side] > max_elems - c) {
        invalid(
            strFormat("the %s add up to more than %llu elements", cname, static_cast<unsigned long long>(max_elems)));
      }
      totals[side] += c;
      if (c > 0) {
        lo[side] = std::min(lo[side], d);
        hi[side] = std::max(hi[side], d + c);
      }
      args.packed[2 * side * P + p] = c;
      args.packed[(2 * side + 1) * P + p] = d;
    }
  }
  if (totals[0] > 0 && send == nullptr) invalid("null send buffer with elements to send");
  if (totals[1] > 0 && recv == nullptr) invalid("null receive buffer with elements to receive");
  const size_t me = static_cast<size_t>(rank);
  if (send_counts[me] != recv_counts[me]) {
    invalid(
        strFormat("send_counts[%d] = %lld but recv_counts[%d] = %lld: the block a rank sends itself must have "
                  "the same size on both sides",
                  rank, static_cast<long long>(send_counts[me]), rank, static_cast<long long>(recv_counts[me])));
  }
  if (totals[0] > 0 && totals[1] > 0) {
    uintptr_t s0 = reinterpret_cast<uintptr_t>(send) + lo[0] * es, s1 = reinterpret_cast<uintptr_t>(send) + hi[0] * es;
    uintptr_t r0 = reinterpret_cast<uintptr_t>(recv) + lo[1] * es, r1 = reinterpret_cast<uintptr_t>(recv) + hi[1] * es;
    if (s0 < r1 && r0 < s1) invalid("the send and receive buffers overlap: alltoall cannot run in place");
  }
  args.send_total = totals[0];
  return args;
}

bool planOp(const OpCall& op, const AlgorithmContext& ctx, const AlgorithmChoice& choice, LocalMemory& memory,
            Schedule& schedule) {
  const OpDesc& d = op.desc;
  const int rank = ctx.rank, size = ctx.size;
  const size_t es = elementSize(d.dtype);
  const size_t bytes = d.count * es;
  const int root = static_cast<int>(d.root);
  const bool alone = size == 1;
  // A world of one reduces nothing: its result is its input (avg divides by one).
  auto reduce_alone = [&] {
    memory.copy(op.recv, op.send, bytes);
    if (d.reduce_op == ReduceOp::kAvg) memory.scaleDivide(op.recv, d.count, d.dtype, 1);
    return false;
  };
  switch (d.kind) {
    case OpKind::kAllreduce:
      if (alone) return reduce_alone();
      // Below the switch-over (measured: bench/sweep.py) latency dominates,
      // and recursive doubling needs log2(P) message latencies to the ring's 2(P-1).
      if (d.count > 0 && bytes <= choice.allreduce_rd_bytes) {
        schedule.algorithm = "recursive doubling";
        buildRecursiveDoublingAllreduce(schedule, ctx, op.send, op.recv, d.count);
      } else if (choice.hierarchical && ctx.topology != nullptr) {
        schedule.algorithm = "hierarchical";
        buildHierarchicalAllreduce(schedule, ctx, op.send, op.recv, d.count);
      } else {
        schedule.algorithm = "ring";
        buildRingAllreduce(schedule, ctx, op.send, op.recv, d.count);
      }
      return true;
    case OpKind::kAllgather:
      memory.copy(op.recv + static_cast<size_t>(rank) * bytes, op.send, bytes);
      if (alone) return false;
      // The same switch-over as the allreduce's, on the gathered size: what
      // each rank receives, in log2(P) steps instead of the ring's P-1.
      if (d.count > 0 && bytes * static_cast<size_t>(size) <= choice.allreduce_rd_bytes) {
        schedule.algorithm = "bruck";
        buildBruckAllgather(schedule, ctx, op.recv, d.count);
        return true;
      }
      if (choice.hierarchical && ctx.topology != nullptr) {
        schedule.algorithm = "hierarchical";
        buildHierarchicalAllgather(schedule, ctx, op.recv, d.count);
        return true;
      }
      schedule.algorithm = "ring";
      buildRingAllgather(schedule, ctx, op.recv, d.count);
      return true;
    case OpKind::kReduceScatter:
      if (alone) return reduce_alone();
      if (choice.hierarchical && ctx.topology != nullptr) {
        schedule.algorithm = "hierarchical";
        buildHierarchicalReduceScatter(schedule, ctx, op.send, op.recv,
                                       memory.scratch(bytes * static_cast<size_t>(size)), d.count);
        return true;
      }
      schedule.algorithm = "ring";
      buildRingReduceScatter(schedule, ctx, op.send, op.recv, memory.scratch(bytes * static_cast<size_t>(size)),
                             d.count);
      return true;
    case OpKind::kBroadcast:
      if (rank == root) memory.copy(op.recv, op.send, bytes);
      if (alone) return false;
      schedule.algorithm = "chain";
      buildChainBroadcast(schedule, ctx, op.recv, d.count, root);
      return true;
    case OpKind::kBarrier:
      if (alone) return false;
      schedule.algorithm = "dissemination";
      buildDisseminationBarrier(schedule, ctx);
      return true;
    case OpKind::kReduce: {
      if (alone) return reduce_alone();
      // Partial sums on the ranks between the far end and the root (algorithms.h).
      char* partial = rank != root && bytes > 0 ? memory.scratch(bytes) : nullptr;
      schedule.algorithm = "chain";
      buildChainReduce(schedule, ctx, op.send, op.recv, partial, d.count, root);
      return true;
    }
    case OpKind::kGather:
      if (rank == root) memory.copy(op.recv + static_cast<size_t>(root) * bytes, op.send, bytes);
      if (alone) return false;
      schedule.algorithm = "direct";
      buildDirectGather(schedule, ctx, op.send, op.recv, d.count, root);
      return true;
    case OpKind::kScatter:
      if (rank == root) memory.copy(op.recv, op.send + static_cast<size_t>(root) * bytes, bytes);
      if (alone) return false;
      schedule.algorithm = "direct";
      buildDirectScatter(schedule, ctx, op.send, op.recv, d.count, root);
      return true;
    case OpKind::kAllToAll: {
      const AllToAllLayout a = allToAllLayout(op.alltoall_counts, size);
      const size_t me = static_cast<size_t>(rank);
      memory.copy(op.recv + a.recv_displs[me] * es, op.send + a.send_displs[me] * es, a.send_counts[me] * es);
      if (alone) return false;
      schedule.algorithm = "pairwise";
      buildPairwiseAllToAll(schedule, ctx, op.send, op.recv, a.send_counts, a.send_displs, a.recv_counts,
                            a.recv_displs);
      return true;
    }
    case OpKind::kAdasum:  // several schedules with local steps between them: runAdasum() (adasum.h)
      throwError(ErrorKind::kInvalidArgument, "adasum runs as several schedules (runAdasum), not one plan");
    case OpKind::kPointToPoint:  // never planned: the p2p engine runs them
    case OpKind::kAbort:
      break;
  }
  throwError(ErrorKind::kInvalidArgument, strFormat("%s is not a collective", opKindName(d.kind)));
}

}  // namespace rcoll
