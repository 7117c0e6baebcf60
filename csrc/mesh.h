// Rendezvous and connection set-up of one communicator. Through the store, the
// ranks agree on the job (rank 0's secret, id and wire settings:
// agreed_settings.h), learn where every rank is (topology.h), choose a
// transport for each pair (edge_plan.h: shared memory within a host, verbs or
// TCP between hosts) and connect: one mesh for collectives, one for
// point-to-point, and shared windows among the ranks of this host.
//
// The communicator runs ops over what this builds and knows nothing of how
// it was built.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "config.h"
#include "store.h"
#include "topology.h"
#include "transport.h"

namespace rcoll {

class ShmTransport;

struct Mesh {
  Config config;       // this rank's settings, with the agreed ones taken from rank 0
  ConnectInfo info;    // the job's token and this communicator's id
  std::string prefix;  // this communicator's keys in the store, new for every one (freshPrefix in mesh.cc)
  Topology topology;
  std::vector<std::string> peer_transports;  // per rank: "self", "shm", "tcp" or "ib"; empty in a world of 1
  std::unique_ptr<Transport> transport;      // collectives' connections; null in a world of 1
  // The shared-memory transport inside `transport` (itself, or a composite's
  // child) where every other rank of this host shares memory with this one,
  // else null; and the ranks whose windows it holds: every rank (a job on one
  // host), or this host's ranks (a job of several, where its slots are small:
  // only the device windows use them). The communicator decides what runs on them.
  ShmTransport* windows_transport = nullptr;
  std::vector<int> window_members;
  ConnectInfo p2p_info;                      // point-to-point's id differs: a crossed connection is refused
  std::unique_ptr<Transport> p2p_transport;  // null in a world of 1

  Mesh();
  Mesh(Mesh&&) noexcept;
  ~Mesh();
};

// Blocks until every rank has joined and connected, or config.connect_timeout
// passes. Communicators of one name on one store take successive generations
// of keys, so a re-created one never reads stale keys.
Mesh buildMesh(Store& store, int rank, int size, const std::string& name, Config config, const std::string& bind_hint);

// "per rank: 0 self, 1 shm, 2 tcp", for logs and the timeline.
std::string describeEdges(const std::vector<std::string>& peer_transports);

}  // namespace rcoll
