#include "topology.h"

#include <map>

namespace rcoll {

Topology computeTopology(const std::vector<HostEntry>& hosts) {
  Topology t;
  const int size = static_cast<int>(hosts.size());
  t.host_of.assign(static_cast<size_t>(size), -1);
  t.local_rank.assign(static_cast<size_t>(size), 0);
  std::map<std::string, int> host_by_identity;
  for (int r = 0; r < size; ++r) {
    const std::string& identity = hosts[static_cast<size_t>(r)].identity;
    int host;
    auto it = identity.empty() ? host_by_identity.end() : host_by_identity.find(identity);
    if (it != host_by_identity.end()) {
      host = it->second;
    } else {
      host = t.hosts();
      t.ranks_on_host.emplace_back();
      if (!identity.empty()) host_by_identity.emplace(identity, host);
    }
    std::vector<int>& ranks = t.ranks_on_host[static_cast<size_t>(host)];
    t.host_of[static_cast<size_t>(r)] = host;
    t.local_rank[static_cast<size_t>(r)] = static_cast<int>(ranks.size());
    ranks.push_back(r);
  }
  for (const std::vector<int>& ranks : t.ranks_on_host)
    t.host_order.insert(t.host_order.end(), ranks.begin(), ranks.end());
  t.position.assign(static_cast<size_t>(size), 0);
  for (int i = 0; i < size; ++i) t.position[static_cast<size_t>(t.host_order[static_cast<size_t>(i)])] = i;
  return t;
}

std::string Topology::describe() const {
  std::string out = std::to_string(hosts()) + (hosts() == 1 ? " host:" : " hosts:");
  for (const std::vector<int>& ranks : ranks_on_host) {
    out += " [";
    for (size_t i = 0; i < ranks.size(); ++i) out += (i ? " " : "") + std::to_string(ranks[i]);
    out += "]";
  }
  return out;
}

}  // namespace rcoll
