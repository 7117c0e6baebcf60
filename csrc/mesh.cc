#include "mesh.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "agreed_settings.h"
#include "algorithms.h"
#include "composite_transport.h"
#include "rails_transport.h"
#include "error.h"
#include "log.h"
#include "net_interfaces.h"
#include "rdma/ib_device.h"
#include "rdma/verbs_factory.h"
#include "shm/shm_setup.h"
#include "shm/shm_transport.h"
#include "socket_util.h"
#include "tcp_transport.h"

namespace rcoll {

namespace {

// Which of a peer's published addresses to dial: a rails transport publishes
// one list per rail, separated by '|' (rails_transport.h), each chosen from alike.
std::string chooseDialAddresses(const std::string& published, const DataInterfaces& mine, int rank, int peer) {
  std::string out;
  for (const std::string& rail : splitList(published, '|')) {
    out += (out.empty() ? "" : "|") + chooseDialAddress(rail, mine, rank, peer);
  }
  return out;
}

constexpr uint64_t kPointToPointIdSalt = 0x7032707032703270ull;  // "p2p" mesh id = comm id ^ salt
// The host slots of the windows in a job of several hosts: unused (only the
// control pages serve, for the device windows), but WindowSteps::available
// asks for 64 bytes per rank of the group: up to 64 ranks on a host.
constexpr size_t kHostGroupSlotBytes = 4096;

std::vector<uint8_t> toBytes(const std::string& s) { return std::vector<uint8_t>(s.begin(), s.end()); }
std::string fromBytes(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }

// store.get() whose timeout says who is missing (`why`), not just which key.
std::string getOrSayWhy(Store& store, const std::string& key, Deadline deadline, int rank, const std::string& why) {
  try {
    return fromBytes(store.get(key, std::chrono::milliseconds(millisecondsUntil(deadline))));
  } catch (const RcollError& e) {
    if (e.kind() != ErrorKind::kTimeout) throw;
    throwError(ErrorKind::kTimeout, strFormat("rank %d: rendezvous: %s (%s)", rank, why.c_str(), e.what()));
  }
}

// A rank that refuses a table gathered through the store must not take the
// store down (rank 0 hosts it) before the others have read it: they would
// report a lost store instead of the real reason. So it lingers, bounded,
// until all have read (`read_key` counts them). A store that goes away
// meanwhile (its host refused too, and lingered first) ends the wait: this
// rank's own reason is what it reports.
[[noreturn]] void refuseAfterAllRead(Store& store, const std::string& read_key, int size, Deadline deadline,
                                     const std::string& message) {
  const Deadline linger = std::min(deadline, std::chrono::steady_clock::now() + std::chrono::seconds(10));
  try {
    while (store.add(read_key, 0) < size && std::chrono::steady_clock::now() < linger) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  } catch (const std::exception&) {
  }
  throwError(ErrorKind::kConfig, message);
}

// Builds one Mesh: the steps of the set-up share the rank, the world size and
// the settings being agreed.
class MeshBuilder {
 public:
  MeshBuilder(int rank, int size, const std::string& name, Config config) : rank_(rank), size_(size), name_(name) {
    mesh_.config = std::move(config);
    mesh_.info.rank = rank;
    mesh_.info.size = size;
  }
  void build(Store& store, const std::string& bind_hint);
  Mesh take() { return std::move(mesh_); }

 private:
  std::string freshPrefix(Store& store, const std::string& base, Deadline deadline);
  std::vector<std::string> allGather(Store& store, const std::string& key, const std::string& mine, Deadline deadline);
  std::vector<HostEntry> exchangeHosts(Store& store, const std::string& prefix, Deadline deadline,
                                       const std::vector<std::string>& subnets);
  bool agreeOnVerbs(Store& store, const std::string& prefix, Deadline deadline, const std::vector<HostEntry>& hosts,
                    std::vector<IbPortChoice>* ports);

  const int rank_;
  const int size_;
  const std::string name_;
  Mesh mesh_;
};

void MeshBuilder::build(Store& store, const std::string& bind_hint) {
  const auto deadline = std::chrono::steady_clock::now() + mesh_.config.connect_timeout;
  // The addresses this rank listens on and dials from (net_interfaces.h),
  // before the rendezvous: settings that name no usable interface fail on
  // this rank at once, not after the others waited for it.
  const DataInterfaces data_interfaces =
      size_ > 1 ? chooseDataInterfaces(mesh_.config.socket_ifname, mesh_.config.socket_family, interfaceAddresses(),
                                       bind_hint, rank_)
                : DataInterfaces{};
  const std::string prefix = freshPrefix(store, "rcoll/" + name_ + "/", deadline);
  mesh_.prefix = prefix;

  JobInfo job{};
  if (rank_ == 0) {
    job = newJob(mesh_.config, size_);
    store.set(prefix + "job", encodeJob(job));
  } else {
    job = decodeJob(store.get(prefix + "job", mesh_.config.connect_timeout), rank_, size_);
    adoptAgreedSettings(job, mesh_.config);
  }
  std::memcpy(mesh_.info.token, job.token, sizeof(mesh_.info.token));
  mesh_.info.comm_id = job.comm_id;
  mesh_.topology = computeTopology(std::vector<HostEntry>(1));
  if (size_ == 1) return;  // nobody to talk to: no sockets at all

  RCOLL_INFO("rank %d: %s", rank_, data_interfaces.why.c_str());
  const std::string bind_host = data_interfaces.bindList();
  const std::vector<HostEntry> hosts = exchangeHosts(store, prefix, deadline, subnetsOf(data_interfaces));
  mesh_.topology = computeTopology(hosts);
  RCOLL_INFO("rank %d: %s", rank_, mesh_.topology.describe().c_str());
  const bool need_network = needsNetwork(rank_, hosts);
  std::vector<IbPortChoice> ib_ports;
  const bool use_verbs = need_network && agreeOnVerbs(store, prefix, deadline, hosts, &ib_ports);
  const char* network = use_verbs ? "ib" : "tcp";
  // Each peer's edge: the same rule on both ends (edge_plan.h).
  std::vector<int> route(static_cast<size_t>(size_));  // -1 self, 0 shared memory, 1 network
  mesh_.peer_transports.assign(static_cast<size_t>(size_), "self");
  int shm_peers = 0;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) {
      route[static_cast<size_t>(p)] = -1;
      continue;
    }
    const bool shm = sharesMemory(hosts[static_cast<size_t>(rank_)], hosts[static_cast<size_t>(p)]);
    route[static_cast<size_t>(p)] = shm ? 0 : 1;
    mesh_.peer_transports[static_cast<size_t>(p)] = shm ? "shm" : network;
    shm_peers += shm ? 1 : 0;
  }
  // Several NICs (TCP, RCOLL_SOCKET_STRIPE=1): the networks that every rank
  // with a peer on another host has an address on, the same list on every
  // rank. With two or more, each pair of ranks opens RCOLL_SOCKETS_PER_PEER
  // sockets on each, and a collective's segments take turns on them
  // (tcp_transport.h): equal shares.
  std::vector<std::string> stripes;
  if (mesh_.config.socket_stripe && !use_verbs && need_network) {
    std::vector<std::vector<std::string>> networked;
    for (int r = 0; r < size_; ++r) {
      if (needsNetwork(r, hosts)) networked.push_back(hosts[static_cast<size_t>(r)].subnets);
    }
    stripes = commonSubnets(networked);
    if (stripes.size() < 2) stripes.clear();
  }
  Config network_config = mesh_.config;
  if (!stripes.empty()) {
    network_config.sockets_per_peer *= static_cast<int>(stripes.size());
    network_config.socket_networks = static_cast<int>(stripes.size());
    std::string names;
    for (const std::string& s : stripes) names += (names.empty() ? "" : ", ") + s;
    RCOLL_INFO("rank %d: %zu networks shared by every host (%s): %d sockets per peer, in shares measured per pair",
               rank_, stripes.size(), names.c_str(), network_config.sockets_per_peer);
  }
  auto makeNetwork = [&](const ConnectInfo& connect_info, const Config& settings) -> std::unique_ptr<Transport> {
    if (use_verbs && ib_ports.size() == 1) return makeVerbsTransport(connect_info, settings, bind_host, ib_ports[0]);
    if (use_verbs) {  // several ports: a rail on each (rails_transport.h)
      std::vector<std::unique_ptr<Transport>> rails;
      for (const IbPortChoice& port : ib_ports)
        rails.push_back(makeVerbsTransport(connect_info, settings, bind_host, port));
      return std::make_unique<RailsTransport>(connect_info, std::move(rails), mesh_.config.spin);
    }
    return std::make_unique<TcpTransport>(connect_info, settings, bind_host);
  };
  // One transport when every edge is alike (its own progress loop, nothing in
  // between); a composite only when this rank has edges of both kinds.
  // `*shm`: its shared-memory transport (itself, or a composite's child), or null.
  auto makeTransport = [&](const ConnectInfo& connect_info, const Config& shm_settings, const Config& network_settings,
                           ShmTransport** shm) -> std::unique_ptr<Transport> {
    *shm = nullptr;
    if (shm_peers == 0 && need_network) return makeNetwork(connect_info, network_settings);
    auto shared = std::make_unique<ShmTransport>(connect_info, shm_settings, bind_host);
    *shm = shared.get();
    if (!need_network) return shared;
    std::vector<std::unique_ptr<Transport>> children;
    children.push_back(std::move(shared));
    children.push_back(makeNetwork(connect_info, network_settings));
    return std::make_unique<CompositeTransport>(connect_info, std::move(children), route, mesh_.config.spin);
  };
  // Shared windows only where they can serve collectives, on the collective
  // transport (point-to-point needs none): every rank on this host (host ops
  // too), or the ranks of this host in a job of several, where only the device
  // windows use them (the hierarchical collectives through CUDA IPC): their
  // control pages alone, so their host slots stay small.
  Config collective_shm_config = mesh_.config;
  if (need_network) collective_shm_config.shm_coll_slot_bytes = kHostGroupSlotBytes;
  ShmTransport* collective_shm = nullptr;
  mesh_.transport = makeTransport(mesh_.info, collective_shm_config, network_config, &collective_shm);
  RCOLL_INFO("rank %d: transport %s; %s", rank_, mesh_.transport->name(), describeEdges(mesh_.peer_transports).c_str());
  // Point-to-point traffic gets its own connections (p2p_engine.h): sockets or
  // queue pairs. Their handshakes and headers carry a different id, so a stray
  // cross-connection is refused. It keeps one socket per peer and network
  // (its messages are few and matched by tag; over several networks they
  // survive a failing link as the collectives' do) and has no windows.
  ConnectInfo p2p_info = mesh_.info;
  p2p_info.comm_id = mesh_.info.comm_id ^ kPointToPointIdSalt;
  Config p2p_network_config = mesh_.config;
  p2p_network_config.sockets_per_peer = network_config.socket_networks;
  p2p_network_config.socket_networks = network_config.socket_networks;
  Config p2p_shm_config = mesh_.config;
  p2p_shm_config.shm_coll = false;
  ShmTransport* p2p_shm = nullptr;  // unused: point-to-point has no windows
  auto p2p_transport = makeTransport(p2p_info, p2p_shm_config, p2p_network_config, &p2p_shm);
  // One string per rank: its two meshes' addresses, each "kind=host:port ...".
  const std::string mine = listenAddresses(*mesh_.transport) + "\n" + listenAddresses(*p2p_transport);
  const std::vector<std::string> addresses = allGather(store, prefix + "addr", mine, deadline);

  // Every rank checks now that it reaches each peer it talks to over the
  // network, so that a job without a common network fails at once on every
  // rank, the accepting ones too, naming both ranks' addresses.
  const std::string addresses_read = prefix + "addr_read";
  store.add(addresses_read, 1);
  for (int peer = 0; peer < size_; ++peer) {
    if (route[static_cast<size_t>(peer)] != 1) continue;
    const std::string& both = addresses[static_cast<size_t>(peer)];
    try {
      chooseDialAddresses(
          pickAddress(both.substr(0, both.find('\n')), mesh_.peer_transports[static_cast<size_t>(peer)], rank_, peer),
          data_interfaces, rank_, peer);
    } catch (const RcollError& e) {
      refuseAfterAllRead(store, addresses_read, size_, deadline, e.what());
    }
  }

  // Connect to every lower rank, accept every higher one: lower ranks never wait
  // on higher ones, so the set-up cannot deadlock (composite_transport.h: nor
  // with one listener per transport). With RCOLL_RUNTIME_CONNECT, TCP edges
  // connect on first use (transport.h) but for the peers the collectives'
  // algorithms always use (collectivePeers): a rank keeps sockets to
  // O(log P + local ranks) peers, not to all P - 1, twice.
  auto connectMesh = [&](Transport& transport, bool p2p) {
    auto addressOf = [&](int peer) {
      const std::string& both = addresses[static_cast<size_t>(peer)];
      const size_t newline = both.find('\n');
      const std::string published = p2p ? both.substr(newline + 1) : both.substr(0, newline);
      const std::string theirs = pickAddress(published, mesh_.peer_transports[static_cast<size_t>(peer)], rank_, peer);
      if (!stripes.empty() && route[static_cast<size_t>(peer)] == 1)
        return dialAddressesOn(stripes, theirs, rank_, peer);
      return chooseDialAddresses(theirs, data_interfaces, rank_, peer);
    };
    const std::vector<bool> needed =
        p2p ? std::vector<bool>(static_cast<size_t>(size_), false) : collectivePeers(rank_, mesh_.topology);
    std::vector<std::string> on_demand(static_cast<size_t>(size_));
    for (int peer = 0; peer < size_; ++peer) {
      if (peer != rank_ && !needed[static_cast<size_t>(peer)] && mesh_.config.runtime_connect &&
          transport.canConnectOnDemand(peer)) {
        on_demand[static_cast<size_t>(peer)] = addressOf(peer);
      }
    }
    transport.connectOnDemand(on_demand);
    int to_accept = 0;
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_ || !on_demand[static_cast<size_t>(peer)].empty()) continue;
      if (peer < rank_) {
        transport.connect(peer, addressOf(peer), deadline);
      } else {
        ++to_accept;
      }
    }
    for (int accepted = 0; accepted < to_accept; ++accepted) transport.accept(deadline);
    transport.closeListener();
  };
  connectMesh(*mesh_.transport, false);
  connectMesh(*p2p_transport, true);
  if (collective_shm != nullptr) {
    const Topology& t = mesh_.topology;
    const std::vector<int>& local = t.ranks_on_host[static_cast<size_t>(t.host_of[static_cast<size_t>(rank_)])];
    bool all_shm = true;
    for (int p : local) all_shm = all_shm && (p == rank_ || route[static_cast<size_t>(p)] == 0);
    if (all_shm) {
      mesh_.windows_transport = collective_shm;
      mesh_.window_members = local;
    }
  }
  mesh_.p2p_info = p2p_info;
  mesh_.p2p_transport = std::move(p2p_transport);
}

// Each set of ranks that creates a communicator of this name on this store
// gets keys of its own, so that it never reads another's. Keys cannot be
// deleted, and a launcher that restarts a job (torchrun) hands the new workers
// the same store with the keys of the earlier attempts in it, which may have
// been cut short anywhere (a worker killed before it joined): counting joins
// cannot tell the attempts apart. So rank 0 takes a new epoch from a counter;
// every other rank reads the counter and proves the epoch current with a ping
// that this epoch's rank 0 answers. The rank 0 of an earlier epoch is gone and
// stays silent: the rank then reads the counter again, until the new rank 0
// has taken its epoch. The polls are add(key, 0), which never block: a
// caller's store (torch's TCPStore) logs every get that times out. This
// assumes the earlier attempt's processes are gone (launchers stop every
// worker before they start the next attempt); ranks of an attempt still
// rendezvousing beside the next one could answer or take its pings.
std::string MeshBuilder::freshPrefix(Store& store, const std::string& base, Deadline deadline) {
  const std::string epochs = base + "epochs";
  if (rank_ == 0) {
    const std::string prefix = base + std::to_string(store.add(epochs, 1)) + "/";
    for (int r = 1; r < size_; ++r) {
      const std::string ping = getOrSayWhy(store, prefix + strFormat("ping/%d", r), deadline, rank_,
                                           strFormat("rank %d did not join communicator '%s'", r, name_.c_str()));
      store.add(prefix + strFormat("pong/%d", r), std::strtoll(ping.c_str(), nullptr, 10));
    }
    return prefix;
  }
  std::random_device random;
  const int64_t nonce = static_cast<int64_t>((uint64_t{random()} << 31 ^ random()) | 1);  // never 0: "no pong yet"
  int64_t pinged = 0;
  auto poll = std::chrono::milliseconds(1);
  for (;;) {
    const int64_t epoch = store.add(epochs, 0);  // 0: no rank 0 has come yet
    const std::string prefix = base + std::to_string(epoch) + "/";
    if (epoch != 0 && epoch != pinged) {
      store.set(prefix + strFormat("ping/%d", rank_), toBytes(std::to_string(nonce)));
      pinged = epoch;
    }
    if (epoch != 0 && store.add(prefix + strFormat("pong/%d", rank_), 0) == nonce) return prefix;
    if (std::chrono::steady_clock::now() >= deadline) {
      throwError(ErrorKind::kTimeout,
                 strFormat("rank %d: rendezvous: rank 0 of communicator '%s' did not answer: %s", rank_, name_.c_str(),
                           timedOut(std::chrono::duration<double>(mesh_.config.connect_timeout).count()).c_str()));
    }
    std::this_thread::sleep_for(poll);
    poll = std::min(poll * 2, std::chrono::milliseconds(100));
  }
}

// Every rank's `mine`, indexed by rank, the same on every rank. Rank 0 reads
// each rank's key and publishes the whole table under one key, which every
// other rank reads once: 2P store requests in all, not P^2 (docs/scale.md).
// Entries are length-prefixed, so any bytes may be in them.
std::vector<std::string> MeshBuilder::allGather(Store& store, const std::string& key, const std::string& mine,
                                                Deadline deadline) {
  std::vector<std::string> all(static_cast<size_t>(size_));
  if (rank_ != 0) {
    store.set(key + "/" + std::to_string(rank_), toBytes(mine));
    const std::string table =
        getOrSayWhy(store, key, deadline, rank_, "rank 0 published no table; it waits for every rank's entry");
    size_t at = 0;
    for (auto& entry : all) {
      const size_t colon = table.find(':', at);
      char* end = nullptr;
      const unsigned long long length = colon == std::string::npos ? 0 : std::strtoull(table.c_str() + at, &end, 10);
      if (colon == std::string::npos || end != table.c_str() + colon || length > table.size() - colon - 1) {
        throwError(ErrorKind::kPeer,
                   strFormat("rank %d: rendezvous: a malformed table under '%s'", rank_, key.c_str()));
      }
      entry = table.substr(colon + 1, static_cast<size_t>(length));
      at = colon + 1 + static_cast<size_t>(length);
    }
    return all;
  }
  std::string table;
  for (int r = 0; r < size_; ++r) {
    all[static_cast<size_t>(r)] = r == 0 ? mine
                                         : getOrSayWhy(store, key + "/" + std::to_string(r), deadline, 0,
                                                       strFormat("rank %d did not publish its entry", r));
    table += std::to_string(all[static_cast<size_t>(r)].size()) + ":" + all[static_cast<size_t>(r)];
  }
  store.set(key, toBytes(table));
  return all;
}

// Every rank publishes its host identity and whether it will use shared
// memory (edge_plan.h), then reads every rank's: all ranks see the same table
// and so choose alike for every edge. RCOLL_TRANSPORT=shm asks for shared
// memory on every edge: a rank elsewhere (or one that will not) is a
// ConfigError naming it, never a silent fallback.
std::vector<HostEntry> MeshBuilder::exchangeHosts(Store& store, const std::string& prefix, Deadline deadline,
                                                  const std::vector<std::string>& subnets) {
  HostEntry mine = thisHost(mesh_.config);
  mine.subnets = subnets;
  std::vector<HostEntry> hosts;
  for (const std::string& entry : allGather(store, prefix + "host", encodeHostEntry(mine), deadline)) {
    hosts.push_back(decodeHostEntry(entry));
  }
  const std::string read_key = prefix + "hosts_read";
  store.add(read_key, 1);
  if (mesh_.config.transport != "shm") return hosts;
  auto refuse = [&](const std::string& message) { refuseAfterAllRead(store, read_key, size_, deadline, message); };
  if (mine.identity.empty()) {
    refuse(
        strFormat("rank %d: RCOLL_TRANSPORT=shm but this rank cannot tell which host it is on (no boot id); set "
                  "RCOLL_HOSTID or use auto",
                  rank_));
  }
  for (int r = 0; r < size_; ++r) {
    const HostEntry& theirs = hosts[static_cast<size_t>(r)];
    if (theirs.identity != mine.identity) {
      refuse(
          strFormat("rank %d: RCOLL_TRANSPORT=shm but rank %d runs on another host (or network namespace): "
                    "shared memory needs every rank on one host; use auto, which takes shared memory between "
                    "the ranks of each host and the network between hosts",
                    rank_, r));
    }
    if (!sharesMemory(mine, theirs)) {
      refuse(
          strFormat("rank %d: RCOLL_TRANSPORT=shm but rank %d will not use shared memory (RCOLL_TRANSPORT "
                    "or RCOLL_SHM_DISABLE=1 there)",
                    rank_, r));
    }
  }
  return hosts;
}

// The ranks that have an edge to another host publish whether they can use
// RDMA (and why not) and on how many ports, then read each other's, so that
// all reach the same decision: verbs between hosts only when every one of
// them has a usable port, otherwise TCP; and as many ports each (rails) as
// the rank with the fewest has. Ranks set to RCOLL_TRANSPORT=tcp publish that
// too, so a mixed setting cannot hang. Ranks whose edges are all shared
// memory take no part.
bool MeshBuilder::agreeOnVerbs(Store& store, const std::string& prefix, Deadline deadline,
                               const std::vector<HostEntry>& hosts, std::vector<IbPortChoice>* ports) {
  std::string mine = "RCOLL_TRANSPORT=tcp on that rank";
  if (mesh_.config.transport != "tcp") {
    *ports = chooseIbPorts(mesh_.config);
    mine = ports->front().ok ? strFormat("ok %zu", ports->size()) : ports->front().why_not;
  }
  const bool usable = !ports->empty() && ports->front().ok;
  // Every rank of a job across hosts has an edge to another host: all take part.
  const std::vector<std::string> all = allGather(store, prefix + "ib", mine, deadline);
  if (mesh_.config.transport == "ib" && !usable) {
    throwError(ErrorKind::kConfig,
               strFormat("rank %d: RCOLL_TRANSPORT=ib but this rank cannot use RDMA: %s", rank_, mine.c_str()));
  }
  size_t rails = usable ? ports->size() : 0;
  for (int r = 0; r < size_; ++r) {
    if (!needsNetwork(r, hosts)) continue;
    const std::string& theirs = all[static_cast<size_t>(r)];
    if (theirs.rfind("ok ", 0) == 0) {
      rails = std::min<size_t>(rails, std::strtoul(theirs.c_str() + 3, nullptr, 10));
      continue;
    }
    if (mesh_.config.transport == "ib") {
      throwError(ErrorKind::kConfig,
                 strFormat("rank %d: RCOLL_TRANSPORT=ib but rank %d cannot use RDMA: %s", rank_, r, theirs.c_str()));
    }
    if (mesh_.config.transport == "auto") {
      RCOLL_INFO("rank %d: using TCP between hosts: %s%s", rank_, r == rank_ ? "" : strFormat("rank %d: ", r).c_str(),
                 theirs.c_str());
    }
    return false;
  }
  if (rails < ports->size()) {
    RCOLL_INFO("rank %d: %zu of its %zu RDMA ports in use: another rank has no more", rank_, rails, ports->size());
    ports->resize(rails);
  }
  std::string names;
  for (const IbPortChoice& p : *ports)
    names += strFormat("%s%s:%d", names.empty() ? "" : ", ", p.device.c_str(), p.port);
  RCOLL_INFO(
      "rank %d: RDMA between hosts over %s%s", rank_, names.c_str(),
      ports->size() > 1 ? " (a pair connected at set-up spreads its messages over them in shares it measures)" : "");
  return true;
}

}  // namespace

std::string describeEdges(const std::vector<std::string>& peer_transports) {
  std::string out = "per rank:";
  for (size_t p = 0; p < peer_transports.size(); ++p) {
    out += strFormat("%s %zu %s", p == 0 ? "" : ",", p, peer_transports[p].c_str());
  }
  return out;
}

Mesh::Mesh() = default;
Mesh::Mesh(Mesh&&) noexcept = default;
Mesh::~Mesh() = default;

Mesh buildMesh(Store& store, int rank, int size, const std::string& name, Config config, const std::string& bind_hint) {
  MeshBuilder builder(rank, size, name, std::move(config));
  builder.build(store, bind_hint);
  return builder.take();
}

}  // namespace rcoll
