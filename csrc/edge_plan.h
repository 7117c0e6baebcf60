// Which transport carries each pair of ranks ("edge"): shared memory between
// ranks of one host, the network (verbs or TCP) between hosts.
//
// Every rank publishes its host identity and whether it will use shared
// memory, reads every other rank's, and applies the same symmetric rule, so
// both ends of an edge always choose alike without another round trip.
#pragma once

#include <string>
#include <vector>

#include "config.h"

namespace rcoll {

// What one rank publishes about its host.
struct HostEntry {
  std::string identity;              // hostIdentity(); "" when unknown (never shares memory)
  bool shm_ok = false;               // RCOLL_TRANSPORT auto or shm, and not RCOLL_SHM_DISABLE=1
  std::vector<std::string> subnets;  // of the rank's data interfaces (net_interfaces.h subnetsOf)
};

// This rank's host identity: "hostid:<RCOLL_HOSTID>" when set (like
// NCCL_HOSTID), else shm::hostKey(), the boot id and network namespace (ranks
// in different namespaces of one kernel cannot share the set-up socket).
std::string hostIdentity(const Config& config);
HostEntry thisHost(const Config& config);

std::string encodeHostEntry(const HostEntry& entry);
HostEntry decodeHostEntry(const std::string& bytes);  // garbage: an unknown host that shares nothing

// The rule, the same on both ends: shared memory iff both ranks will and
// their identities are equal and known.
bool sharesMemory(const HostEntry& a, const HostEntry& b);

// Whether `rank` has an edge that is not shared memory (then it needs a
// network transport, and takes part in choosing it).
bool needsNetwork(int rank, const std::vector<HostEntry>& hosts);

}  // namespace rcoll
