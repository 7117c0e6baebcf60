#include "cuda_ipc/device_over_hosts.h"

#include <algorithm>

#include "device_staging_executor.h"
#include "pipeline_executor.h"
#include "shm/window_steps.h"

namespace rcoll {

DeviceOverHosts::DeviceOverHosts(std::unique_ptr<WindowSteps> windows, const Topology& topology, int rank,
                                 const Config& config)
    : windows_(std::move(windows)), topology_(topology), rank_(rank), config_(config) {
  if (windows_) ipc_ = std::make_unique<CudaIpcCollectives>(*windows_);
  const int local = topology_.local_rank[static_cast<size_t>(rank_)];
  ring_position_.assign(topology_.host_of.size(), -1);
  for (const std::vector<int>& ranks : topology_.ranks_on_host) {
    const int r = ranks[static_cast<size_t>(local)];
    ring_position_[static_cast<size_t>(r)] = static_cast<int>(ring_order_.size());
    ring_order_.push_back(r);
  }
}

DeviceOverHosts::~DeviceOverHosts() = default;

void DeviceOverHosts::announce(const OpDesc& op, bool device) {
  if (ipc_) windows_->announce(op, device);
}

AlgorithmContext DeviceOverHosts::ringContext(size_t element_size) const {
  AlgorithmContext ctx{rank_, static_cast<int>(ring_order_.size()),
                       Segmenter{std::max<size_t>(1, config_.chunk_bytes / element_size),
                                 std::max<size_t>(1, config_.min_chunk_bytes / element_size)}};
  ctx.ring_order = ring_order_.data();
  ctx.ring_position = ring_position_.data();
  return ctx;
}

bool DeviceOverHosts::run(const OpDesc& op, const char* send, char* recv, int device, const DeviceEvent* ready,
                          DeviceEvent* done, PipelineExecutor& host, DeviceStagingExecutor& staging, Deadline deadline,
                          std::chrono::milliseconds timeout, const std::atomic<bool>& abort_flag,
                          const std::string& context) {
  const size_t es = elementSize(op.dtype);
  // The windows' set-up ends with every host's answer: the ring of this local
  // index (one rank per host, each knowing its host's answer) takes the
  // minimum of one byte, on host memory.
  auto agree = [&](bool this_host_on) {
    OpDesc question = op;
    question.dtype = DataType::kUInt8;
    question.reduce_op = ReduceOp::kMin;
    question.count = 1;
    uint8_t on = this_host_on ? 1 : 0;
    Schedule s;
    s.reset(question, 1);
    buildRingAllreduce(s, ringContext(1), reinterpret_cast<const char*>(&on), reinterpret_cast<char*>(&on), 1);
    host.run(s, deadline, timeout, abort_flag);
    return on == 1;
  };
  if (!ipc_) {
    // Every rank reaches this at the same op (the route is the same on every
    // rank): a host without windows answers once, and stages from then on.
    if (!question_answered_) {
      question_answered_ = true;
      agree(false);
    }
    return false;
  }
  // The phases between the hosts: rings of the ranks of this local index, on
  // device memory through the staging executor. The op's own descriptor goes
  // on the wire (hosts that disagree on it meet a header naming the other
  // call); avg reduces as a sum and divides once, by the world, when every
  // host's share is in (cuda_ipc_collectives.cc), not in the ring.
  auto between = [&](auto&& build) {
    schedule_.reset(op, es);
    build(schedule_, ringContext(es));
    for (RecvStep& r : schedule_.recvs) r.divide_after = false;
    try {
      staging.begin(nullptr, context);  // the windows' stream finished its part already
      staging.run(schedule_, deadline, timeout, abort_flag);
      staging.finish(nullptr, deadline, timeout, abort_flag);
    } catch (...) {
      staging.abandon();
      throw;
    }
  };
  CudaIpcCollectives::BetweenHosts hosts;
  hosts.agree = agree;
  hosts.allreduce = [&](char* data, size_t count) {
    between([&](Schedule& s, const AlgorithmContext& ring) { buildRingAllreduce(s, ring, data, data, count); });
  };
  hosts.allgather = [&](char* out, size_t count) {
    between([&](Schedule& s, const AlgorithmContext& ring) { buildRingAllgather(s, ring, out, count); });
  };
  hosts.reduce_scatter = [&](char* sums, char* out, size_t count) {
    // In place in `sums`, one block per host (blocks_by_position: host h's at
    // h * count): a block is reduced there only after it was sent (algorithms.cc).
    between([&](Schedule& s, const AlgorithmContext& ring) {
      AlgorithmContext by_host = ring;
      by_host.blocks_by_position = true;
      buildRingReduceScatter(s, by_host, sums, out, sums, count);
    });
  };
  hosts.broadcast = [&](char* data, size_t count, int root) {
    between([&](Schedule& s, const AlgorithmContext& ring) { buildChainBroadcast(s, ring, data, count, root); });
  };
  hosts.scratch = [&](size_t bytes) { return staging.scratch(bytes); };
  hosts.topology = &topology_;
  return ipc_->run(op, send, recv, deviceWindowsConfig(config_, device), ready, done, deadline, timeout, abort_flag,
                   &hosts);
}

}  // namespace rcoll
