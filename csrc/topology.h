// Where the ranks are: which host each one is on, computed alike by every rank
// from the host identities all of them published at start-up (edge_plan.h),
// so every rank derives the same hosts, local ranks and host-grouped order
// without another round trip. Algorithms that care about placement (rings in
// host order, hierarchical collectives) read it here.
#pragma once

#include <string>
#include <vector>

#include "edge_plan.h"

namespace rcoll {

struct Topology {
  std::vector<int> host_of;                     // per rank: its host (hosts numbered by their lowest rank)
  std::vector<int> local_rank;                  // per rank: its index among its host's ranks
  std::vector<std::vector<int>> ranks_on_host;  // per host: its ranks, ascending
  // Every rank, host by host (hosts in order, ranks ascending within each): a
  // ring in this order crosses each host's link once per direction, however
  // the launcher numbered the ranks.
  std::vector<int> host_order;
  std::vector<int> position;  // per rank: its index in host_order

  int hosts() const { return static_cast<int>(ranks_on_host.size()); }
  // "2 hosts: [0 1] [2 3]", for logs and `python -m rcoll info`.
  std::string describe() const;
};

// Ranks with equal known identities share a host; a rank whose identity is
// unknown ("") is a host of its own.
Topology computeTopology(const std::vector<HostEntry>& hosts);

}  // namespace rcoll
