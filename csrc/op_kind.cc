#include "op_kind.h"

#include "error.h"

namespace rcoll {

namespace {

using B = BufferUse;

// kind, reduces, rooted, per_rank_blocks, send, recv, on_device, host_windows, device_windows, trace_name
constexpr OpTraits kOpTraits[] = {
    {OpKind::kAllreduce, true, false, false, B::kEveryRank, B::kEveryRank, true, true, true, "all_reduce"},
    // recv: size x count, block r from rank r
    {OpKind::kAllgather, false, false, true, B::kEveryRank, B::kEveryRank, true, true, true, "all_gather"},
    // recv (every rank) gets the root's send
    {OpKind::kBroadcast, false, true, false, B::kEveryRank, B::kEveryRank, true, true, true, "broadcast"},
    // send: size x count; recv: block `rank` of the reduction
    {OpKind::kReduceScatter, true, false, true, B::kEveryRank, B::kEveryRank, true, true, true, "reduce_scatter"},
    // the windows' arrival counters alone
    {OpKind::kBarrier, false, false, false, B::kNone, B::kNone, false, true, false, "barrier"},
    // the reduction lands in the root's recv only
    {OpKind::kReduce, true, true, false, B::kEveryRank, B::kRootOnly, true, false, false, "reduce"},
    // the root's recv: size x count, block r from rank r
    {OpKind::kGather, false, true, true, B::kEveryRank, B::kRootOnly, true, false, false, "gather"},
    // the root's send: size x count; rank r's recv gets block r
    {OpKind::kScatter, false, true, true, B::kRootOnly, B::kEveryRank, true, false, false, "scatter"},
    // counts per peer: checked by checkAllToAllArgs()
    {OpKind::kAllToAll, false, false, false, B::kNone, B::kNone, true, false, false, "all_to_all"},
    // host buffers, float types, 2^k ranks (adasum.h); not a reduce op: its combination is its own.
    // torch has no Adasum: its trace name is the allreduce's, whose shape it has
    {OpKind::kAdasum, false, false, false, B::kEveryRank, B::kEveryRank, false, false, false, "all_reduce"},
};

}  // namespace

const char* opKindName(OpKind kind) {
  switch (kind) {
    case OpKind::kAllreduce:
      return "allreduce";
    case OpKind::kAllgather:
      return "allgather";
    case OpKind::kBroadcast:
      return "broadcast";
    case OpKind::kReduceScatter:
      return "reduce_scatter";
    case OpKind::kBarrier:
      return "barrier";
    case OpKind::kReduce:
      return "reduce";
    case OpKind::kGather:
      return "gather";
    case OpKind::kScatter:
      return "scatter";
    case OpKind::kAllToAll:
      return "alltoall";
    case OpKind::kPointToPoint:
      return "send/recv";
    case OpKind::kAdasum:
      return "adasum";
    case OpKind::kAbort:
      return "abort";
  }
  return "unknown-op";
}

const OpTraits* opTraitsTable(int* rows) {
  *rows = static_cast<int>(sizeof(kOpTraits) / sizeof(kOpTraits[0]));
  return kOpTraits;
}

const OpTraits* findOpTraits(OpKind kind) {
  for (const OpTraits& t : kOpTraits) {
    if (t.kind == kind) return &t;
  }
  return nullptr;
}

const OpTraits& opTraits(OpKind kind) {
  const OpTraits* t = findOpTraits(kind);
  if (t == nullptr) throwError(ErrorKind::kInvalidArgument, strFormat("%s is not a collective", opKindName(kind)));
  return *t;
}

}  // namespace rcoll
