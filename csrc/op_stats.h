// Counters of every op this process ran, per op, algorithm and path: count,
// bytes, time, errors, and the bus bandwidth they reached (nccl-tests'
// definitions, docs/benchmarks.md). Read by rcoll.stats(), written as JSON at
// exit (RCOLL_STATS_FILE) and served in Prometheus' text format
// (RCOLL_METRICS_PORT).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "op_kind.h"
#include "wire.h"

namespace rcoll {

class OpStats {
 public:
  static OpStats& process();

  // One op that ended: `world` ranks, `algorithm` and `path` static strings.
  void add(const OpDesc& op, int world, const char* algorithm, const char* path, double seconds, bool ok);

  struct Row {
    std::string op, algorithm, path;
    uint64_t count = 0;
    uint64_t errors = 0;
    double bytes = 0;      // nccl-tests' "size" of each op, summed
    double bus_bytes = 0;  // bytes x the op's bus factor, summed
    double seconds = 0;
  };
  std::vector<Row> rows() const;

 private:
  OpStats() = default;
  mutable std::mutex mutex_;
  // Keyed by the static strings' addresses (no string built per op); rows()
  // merges rows whose names are equal.
  std::map<std::tuple<OpKind, const char*, const char*>, Row> rows_;
};

}  // namespace rcoll
