#include "edge_plan.h"

#include "shm/shm_setup.h"
#include "socket_util.h"

namespace rcoll {

std::string hostIdentity(const Config& config) {
  if (!config.host_id.empty()) return "hostid:" + config.host_id;
  return shm::hostKey();
}

HostEntry thisHost(const Config& config) {
  HostEntry entry;
  entry.identity = hostIdentity(config);
  entry.shm_ok = !config.shm_disable && (config.transport == "auto" || config.transport == "shm");
  return entry;
}

// "<0|1> <subnets> <identity>": the flag first, then the subnets
// comma-separated ("-": none), since an identity may hold any byte.
std::string encodeHostEntry(const HostEntry& entry) {
  std::string subnets;
  for (const std::string& s : entry.subnets) subnets += (subnets.empty() ? "" : ",") + s;
  return std::string(entry.shm_ok ? "1 " : "0 ") + (subnets.empty() ? "-" : subnets) + " " + entry.identity;
}

HostEntry decodeHostEntry(const std::string& bytes) {
  HostEntry entry;
  if (bytes.size() < 2 || (bytes[0] != '0' && bytes[0] != '1') || bytes[1] != ' ') return entry;
  const size_t space = bytes.find(' ', 2);
  if (space == std::string::npos) return entry;
  entry.shm_ok = bytes[0] == '1';
  const std::string subnets = bytes.substr(2, space - 2);
  if (subnets != "-") entry.subnets = splitCommas(subnets);
  entry.identity = bytes.substr(space + 1);
  return entry;
}

bool sharesMemory(const HostEntry& a, const HostEntry& b) {
  return a.shm_ok && b.shm_ok && !a.identity.empty() && a.identity == b.identity;
}

bool needsNetwork(int rank, const std::vector<HostEntry>& hosts) {
  for (size_t p = 0; p < hosts.size(); ++p) {
    if (static_cast<int>(p) != rank && !sharesMemory(hosts[static_cast<size_t>(rank)], hosts[p])) return true;
  }
  return false;
}

}  // namespace rcoll
