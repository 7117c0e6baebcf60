#include "op_route.h"

namespace rcoll {

const char* opPathName(OpPath path) {
  switch (path) {
    case OpPath::kHostWindows:
      return "host windows";
    case OpPath::kPipeline:
      return "pipeline";
    case OpPath::kDeviceWindows:
      return "device windows";
    case OpPath::kDeviceOverHosts:
      return "device over hosts";
    case OpPath::kStaging:
      return "staging";
  }
  return "unknown";
}

bool stepHoldsBlocks(const OpDesc& op, size_t slot_bytes, size_t world, size_t hosts) {
  const size_t blocks = op.kind == OpKind::kReduceScatter            ? world
                        : op.kind == OpKind::kAllgather && hosts > 0 ? hosts
                                                                     : 1;
  return blocks * elementSize(op.dtype) <= slot_bytes;
}

namespace {

OpRoute only(OpPath path, const AlgorithmChoice& algorithm) { return {path, path, algorithm}; }

// Device windows inside each host pay off where the phases between the hosts
// carry enough: allreduce always (its phases overlap), the others from
// RCOLL_CUDA_IPC_HOSTS_MIN_BYTES of the whole buffer (their phases run one
// after the other, so a small buffer pays the windows' hand-offs and saves little).
bool deviceOverHostsFits(const OpDesc& op, const RouteFacts& facts) {
  if (!facts.cuda_ipc) return false;
  const OpTraits& traits = opTraits(op.kind);
  if (op.kind != OpKind::kAllreduce) {
    const size_t blocks = traits.per_rank_blocks ? static_cast<size_t>(facts.world) : 1;
    if (op.count * elementSize(op.dtype) * blocks < facts.cuda_ipc_hosts_min_bytes) return false;
  }
  return stepHoldsBlocks(op, facts.cuda_ipc_slot_bytes, static_cast<size_t>(facts.world),
                         static_cast<size_t>(facts.hosts));
}

}  // namespace

OpRoute chooseRoute(const OpDesc& op, bool on_device, const RouteFacts& facts) {
  const OpTraits& traits = opTraits(op.kind);
  if (!on_device) {
    if (facts.host_windows && traits.host_windows) return only(OpPath::kHostWindows, {});
    return only(OpPath::kPipeline, {facts.allreduce_rd_bytes, facts.hierarchical});
  }
  // The staging executor has no recursive doubling (it would hold slots
  // across sends): the ring or the hierarchical algorithm for every size.
  const AlgorithmChoice staging{0, facts.hierarchical};
  if (traits.device_windows && facts.host_windows) {
    // With RCOLL_CUDA_IPC=0 the windows still run their set-up, which agrees
    // "off" with every rank (cuda_ipc_collectives.h).
    const bool fits =
        !facts.cuda_ipc || stepHoldsBlocks(op, facts.cuda_ipc_slot_bytes, static_cast<size_t>(facts.world), 0);
    if (fits) return {OpPath::kDeviceWindows, OpPath::kStaging, staging};
  }
  if (traits.device_windows && facts.hierarchical && deviceOverHostsFits(op, facts)) {
    return {OpPath::kDeviceOverHosts, OpPath::kStaging, staging};
  }
  return only(OpPath::kStaging, staging);
}

}  // namespace rcoll
