#include "op_stats.h"

#include "dtype.h"
#include "op_kind.h"

namespace rcoll {

namespace {

// nccl-tests' doc/PERFORMANCE.md: "size" is the per-rank buffer for allreduce,
// broadcast and reduce, the whole output of allgather, the whole input of
// reduce_scatter; bus bandwidth is size / time x the factor below, which makes
// it comparable with the links' speed whatever the world size.
double busFactor(OpKind kind, int world) {
  const double n = world;
  switch (kind) {
    case OpKind::kAllreduce:
    case OpKind::kAdasum:
      return world > 1 ? 2.0 * (n - 1) / n : 0.0;
    case OpKind::kAllgather:
    case OpKind::kReduceScatter:
    case OpKind::kAllToAll:
      return world > 1 ? (n - 1) / n : 0.0;
    default:
      return 1.0;
  }
}

double sizeOf(const OpDesc& op, int world) {
  const double bytes = static_cast<double>(op.count) * static_cast<double>(elementSize(op.dtype));
  const OpTraits* traits = findOpTraits(op.kind);
  return traits != nullptr && traits->per_rank_blocks ? bytes * world : bytes;
}

}  // namespace

OpStats& OpStats::process() {
  static OpStats* stats = new OpStats();  // never destroyed: ops may end while the process exits
  return *stats;
}

void OpStats::add(const OpDesc& op, int world, const char* algorithm, const char* path, double seconds, bool ok) {
  const char* name = op.kind == OpKind::kPointToPoint ? "send/recv" : opKindName(op.kind);
  const double size = sizeOf(op, world);
  std::lock_guard<std::mutex> lock(mutex_);
  Row& row = rows_[{op.kind, algorithm, path}];
  if (row.count == 0 && row.errors == 0) {
    row.op = name;
    row.algorithm = algorithm;
    row.path = path;
  }
  if (!ok) {
    ++row.errors;
    return;
  }
  ++row.count;
  row.bytes += size;
  row.bus_bytes += size * busFactor(op.kind, world);
  row.seconds += seconds;
}

std::vector<OpStats::Row> OpStats::rows() const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::map<std::tuple<std::string, std::string, std::string>, Row> merged;
  for (const auto& [key, row] : rows_) {
    Row& m = merged[{row.op, row.algorithm, row.path}];
    m.op = row.op;
    m.algorithm = row.algorithm;
    m.path = row.path;
    m.count += row.count;
    m.errors += row.errors;
    m.bytes += row.bytes;
    m.bus_bytes += row.bus_bytes;
    m.seconds += row.seconds;
  }
  std::vector<Row> out;
  for (auto& [key, row] : merged) out.push_back(row);
  return out;
}

}  // namespace rcoll
