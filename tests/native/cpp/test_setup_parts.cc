// Standalone tests for the parts of a communicator's set-up, most of which
// need no peers: the topology every rank computes from the published hosts
// (csrc/topology.cc), the rings the algorithms build in its host order
// (csrc/algorithms.cc), the agreed settings (csrc/agreed_settings.cc), the op
// table's checks (csrc/op_table.cc), the route chooser (csrc/op_route.cc) and
// the network choices: interfaces, dial addresses, subnets shared by all, the
// lane schedule (csrc/net_interfaces.cc, name_filter.cc, lane_schedule.cc),
// and the measurement of a pair's sockets over several networks
// (csrc/lane_probe.cc, both ends over loopback sockets); a registration over
// several RDMA ports that one port refuses, and the shares of a pair's
// messages measured over rails of different speeds (csrc/rails_transport.cc,
// rails_probe.cc).
// Built and run by tests/native/test_cpp.py under ASan + UBSan. Exit status is
// nonzero on any failure.

#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agreed_settings.h"
#include "algorithms.h"
#include "edge_plan.h"
#include "error.h"
#include "lane_probe.h"
#include "lane_schedule.h"
#include "name_filter.h"
#include "socket_util.h"
#include "net_interfaces.h"
#include "op_route.h"
#include "rdma/ib_device.h"
#include "op_table.h"
#include "rails_transport.h"
#include "topology.h"
#include "unit_check.h"

using namespace rcoll;

namespace {

using unit::check;

std::vector<HostEntry> hostsOf(const std::vector<std::string>& identities) {
  std::vector<HostEntry> hosts;
  for (const std::string& id : identities) hosts.push_back(HostEntry{id, true, {}});
  return hosts;
}

void testTopology() {
  // Interleaved placement (ABAB): hosts numbered by their lowest rank, the
  // host order groups them whatever the numbering.
  Topology t = computeTopology(hostsOf({"a", "b", "a", "b"}));
  check(t.hosts() == 2, "ABAB: two hosts");
  check(t.host_of == std::vector<int>({0, 1, 0, 1}), "ABAB: host_of");
  check(t.local_rank == std::vector<int>({0, 0, 1, 1}), "ABAB: local_rank");
  check(t.host_order == std::vector<int>({0, 2, 1, 3}), "ABAB: host order");
  check(t.describe() == "2 hosts: [0 2] [1 3]", "ABAB: describe() gave " + t.describe());

  // Uneven hosts (3 + 2), the second host first in rank order.
  t = computeTopology(hostsOf({"y", "x", "x", "y", "x"}));
  check(t.ranks_on_host == std::vector<std::vector<int>>({{0, 3}, {1, 2, 4}}), "3+2: ranks_on_host");
  check(t.host_order == std::vector<int>({0, 3, 1, 2, 4}), "3+2: host order");
  check(t.local_rank == std::vector<int>({0, 0, 1, 1, 2}), "3+2: local_rank");

  // A rank that cannot tell its host shares it with nobody, not with other unknowns.
  t = computeTopology(hostsOf({"a", "", "", "a"}));
  check(t.hosts() == 3 && t.host_of == std::vector<int>({0, 1, 2, 0}), "unknown identities are hosts of their own");

  t = computeTopology(hostsOf({"solo"}));
  check(t.hosts() == 1 && t.host_order == std::vector<int>({0}) && t.describe() == "1 host: [0]", "world of one");
}

// Interleaved ranks (ABAB): every ring and chain follows the host order 0 2 1 3,
// so each host sends across once (the rank at its end of the host), where a
// ring in rank order would cross with every edge; and reduce-scatter still
// leaves block r on rank r.
void testHostOrderedRings() {
  const Topology t = computeTopology(hostsOf({"a", "b", "a", "b"}));
  const int P = 4;
  const size_t count = 64;  // per rank (reduce-scatter, allgather) or in all
  std::vector<char> send(P * count * 4), recv(P * count * 4), scratch(P * count * 4);
  auto contextOf = [&](int rank) {
    AlgorithmContext ctx{rank, P, Segmenter{16, 1}};
    ctx.ring_order = t.host_order.data();
    ctx.ring_position = t.position.data();
    return ctx;
  };
  auto nextOf = [&](int rank) { return t.host_order[(t.position[rank] + 1) % P]; };
  auto prevOf = [&](int rank) { return t.host_order[(t.position[rank] + P - 1) % P]; };
  using Build = void (*)(Schedule&, const AlgorithmContext&, char*, char*, char*, size_t);
  const std::vector<std::pair<const char*, Build>> rings = {
      {"allreduce", [](Schedule& s, const AlgorithmContext& c, char* in, char* out, char*,
                       size_t n) { buildRingAllreduce(s, c, in, out, n * 4); }},
      {"reduce_scatter", [](Schedule& s, const AlgorithmContext& c, char* in, char* out, char* tmp,
                            size_t n) { buildRingReduceScatter(s, c, in, out, tmp, n); }},
      {"allgather", [](Schedule& s, const AlgorithmContext& c, char*, char* out, char*,
                       size_t n) { buildRingAllgather(s, c, out, n); }},
  };
  for (const auto& [name, build] : rings) {
    int crossing = 0;
    for (int r = 0; r < P; ++r) {
      Schedule s;
      s.elem_size = 4;
      build(s, contextOf(r), send.data(), recv.data(), scratch.data(), count);
      bool ok = !s.sends.empty() && !s.recvs.empty();
      for (const SendStep& step : s.sends) ok = ok && step.peer == nextOf(r);
      for (const RecvStep& step : s.recvs) ok = ok && step.peer == prevOf(r);
      check(ok, std::string(name) + ": rank " + std::to_string(r) + " talks to its host-order neighbours only");
      crossing += t.host_of[r] != t.host_of[nextOf(r)];
      if (std::string(name) == "reduce_scatter") {  // the result lands in recv: block r of the input
        bool own = true;
        for (const RecvStep& step : s.recvs) {
          if (step.reduce_out >= recv.data() && step.reduce_out < recv.data() + recv.size()) {
            own = own && step.offset / count == static_cast<uint64_t>(r);
          }
        }
        check(own, "reduce_scatter: rank " + std::to_string(r) + " ends with its own block");
      }
    }
    check(crossing == 2, std::string(name) + ": the ring crosses between the hosts once each way");
  }
  // The chain from root 1 runs 1 -> 3 -> 0 -> 2 (the host order from the root's place).
  const std::vector<int> chain = {1, 3, 0, 2};
  for (int i = 0; i < P; ++i) {
    Schedule b, rd;
    b.elem_size = rd.elem_size = 4;
    buildChainBroadcast(b, contextOf(chain[i]), recv.data(), count, 1);
    buildChainReduce(rd, contextOf(chain[i]), send.data(), recv.data(), scratch.data(), count, 1);
    bool ok = true;
    for (const SendStep& step : b.sends) ok = ok && i + 1 < P && step.peer == chain[i + 1];
    for (const RecvStep& step : b.recvs) ok = ok && i > 0 && step.peer == chain[i - 1];
    check(ok && (i == 0 || !b.recvs.empty()) && (i == P - 1 || !b.sends.empty()),
          "broadcast: rank " + std::to_string(chain[i]) + " is in place " + std::to_string(i) + " of the chain");
    ok = true;  // reduce: data flows back along the chain (plus the root's zero-byte "go" to the far end)
    for (const SendStep& step : rd.sends) ok = ok && (step.count == 0 || (i > 0 && step.peer == chain[i - 1]));
    for (const RecvStep& step : rd.recvs) ok = ok && (step.count == 0 || (i + 1 < P && step.peer == chain[i + 1]));
    check(ok, "reduce: rank " + std::to_string(chain[i]) + " passes partial results towards the root");
  }
}

void testAgreedSettings() {
  Config rank0;
  rank0.chunk_bytes = 512 << 10;
  rank0.shm_coll = false;
  rank0.sockets_per_peer = 4;
  const JobInfo job = newJob(rank0, 3);
  const JobInfo other = newJob(rank0, 3);
  check(std::memcmp(job.token, other.token, sizeof(job.token)) != 0 || job.comm_id != other.comm_id,
        "every job gets its own secret and id");

  const JobInfo read = decodeJob(encodeJob(job), 1, 3);
  check(std::memcmp(&read, &job, sizeof(job)) == 0, "a job survives the store");

  Config mine;  // defaults: every agreed setting differs from rank 0's above or equals it
  mine.cuda_ipc_slot_bytes = 8 << 20;
  adoptAgreedSettings(read, mine);
  check(mine.chunk_bytes == rank0.chunk_bytes, "chunk bytes adopted");
  check(!mine.shm_coll, "RCOLL_SHM_COLL=0 adopted");
  check(mine.sockets_per_peer == 4, "sockets per peer adopted");
  check(mine.cuda_ipc && mine.cuda_ipc_slot_bytes == rank0.cuda_ipc_slot_bytes, "IPC slot size adopted");
  check(std::memcmp(newJob(mine, 3).settings, job.settings, sizeof(job.settings)) == 0,
        "after adopting, this rank would publish rank 0's settings");

  auto configError = [](auto&& fn) {
    try {
      fn();
    } catch (const RcollError& e) {
      return e.kind() == ErrorKind::kConfig;
    }
    return false;
  };
  check(configError([&] { decodeJob(encodeJob(job), 1, 4); }), "another world size is a ConfigError");
  std::vector<uint8_t> short_job = encodeJob(job);
  short_job.pop_back();
  check(configError([&] { decodeJob(short_job, 1, 3); }), "another layout (rcoll version) is a ConfigError");
}

void testOpChecks() {
  auto invalid = [](OpKind kind, int root, size_t count, const void* send, const void* recv, int rank = 1,
                    DataType dtype = DataType::kFloat32, ReduceOp op = ReduceOp::kSum) {
    OpDesc d{};
    d.kind = kind;
    d.dtype = dtype;
    d.reduce_op = op;
    d.root = static_cast<uint32_t>(root);
    d.count = count;
    d.seq = 7;
    try {
      checkOpArgs(d, rank, 4, send, recv);
    } catch (const RcollError& e) {
      return e.kind() == ErrorKind::kInvalidArgument && std::string(e.what()).rfind("rank 1: ", 0) == 0;
    }
    return false;
  };
  float x[4] = {};
  check(!invalid(OpKind::kAllreduce, 0, 4, x, x), "a good allreduce passes");
  check(invalid(OpKind::kBroadcast, 4, 4, x, x), "root 4 of 4 ranks");
  check(invalid(OpKind::kReduce, -1, 4, x, x), "negative root");
  check(invalid(OpKind::kAllreduce, 0, 4, nullptr, x), "null send");
  check(!invalid(OpKind::kReduce, 0, 4, x, nullptr), "reduce: only the root needs recv");
  check(invalid(OpKind::kReduce, 1, 4, x, nullptr), "reduce: the root needs recv");
  check(!invalid(OpKind::kScatter, 0, 4, nullptr, x), "scatter: only the root needs send");
  check(!invalid(OpKind::kAllreduce, 0, 0, nullptr, nullptr), "nothing to move needs no buffer");
  check(invalid(OpKind::kAllgather, 0, static_cast<size_t>(-1) / 8, x, x), "a count past memory");
  check(invalid(OpKind::kAllreduce, 0, 4, x, x, 1, DataType::kBool, ReduceOp::kAvg), "avg of bool");
  check(!invalid(OpKind::kAllgather, 0, 4, x, x, 1, DataType::kBool, ReduceOp::kAvg),
        "a reduce op is only checked where the op reduces");
  check(opTraits(OpKind::kGather).rooted && !opTraits(OpKind::kBarrier).on_device, "table rows");

  const std::vector<int64_t> ok = {1, 1, 1, 1}, displs = {0, 1, 2, 3};
  float send[4], recv[4];
  AllToAllArgs a = checkAllToAllArgs(1, 4, DataType::kFloat32, send, recv, ok, displs, ok, displs);
  check(a.send_total == 4 && a.packed.size() == 16 && a.packed[4 + 3] == 3, "alltoall packs counts and displs");
  bool overlap = false;
  try {
    checkAllToAllArgs(1, 4, DataType::kFloat32, send, send, ok, displs, ok, displs);
  } catch (const RcollError&) {
    overlap = true;
  }
  check(overlap, "alltoall in place is refused");
}

// Every rank chooses each op's path from the same facts, so the chooser is
// tested as the table it is: each path where it belongs, and the thresholds.
void testRoutes() {
  auto op = [](OpKind kind, uint64_t count, DataType dtype = DataType::kFloat32) {
    OpDesc d;
    d.kind = kind;
    d.count = count;
    d.dtype = dtype;
    return d;
  };
  RouteFacts one_host;
  one_host.world = 4;
  one_host.host_windows = true;
  one_host.allreduce_rd_bytes = 32 << 10;
  one_host.cuda_ipc_slot_bytes = 16 << 20;
  one_host.cuda_ipc_hosts_min_bytes = 128 << 10;
  check(chooseRoute(op(OpKind::kAllreduce, 10), false, one_host).path == OpPath::kHostWindows, "host windows");
  check(chooseRoute(op(OpKind::kBarrier, 0), false, one_host).path == OpPath::kHostWindows, "barrier on windows");
  OpRoute gather = chooseRoute(op(OpKind::kGather, 10), false, one_host);
  check(gather.path == OpPath::kPipeline && gather.fallback == OpPath::kPipeline, "gather: the pipeline only");
  check(gather.algorithm.allreduce_rd_bytes == (32 << 10), "the pipeline keeps recursive doubling");
  OpRoute device = chooseRoute(op(OpKind::kAllreduce, 10), true, one_host);
  check(device.path == OpPath::kDeviceWindows && device.fallback == OpPath::kStaging, "device windows, else staging");
  check(device.algorithm.allreduce_rd_bytes == 0, "staging has no recursive doubling");
  check(chooseRoute(op(OpKind::kAllToAll, 10), true, one_host).path == OpPath::kStaging, "alltoall stages");
  RouteFacts tiny_slots = one_host;
  tiny_slots.cuda_ipc_slot_bytes = 8;
  check(chooseRoute(op(OpKind::kReduceScatter, 10), true, tiny_slots).path == OpPath::kStaging,
        "a step that cannot hold one element of every block stages");
  tiny_slots.cuda_ipc = false;
  check(chooseRoute(op(OpKind::kReduceScatter, 10), true, tiny_slots).path == OpPath::kDeviceWindows,
        "RCOLL_CUDA_IPC=0 still meets the windows' set-up, which agrees 'off'");

  RouteFacts hosts;
  hosts.world = 8;
  hosts.hosts = 2;
  hosts.hierarchical = true;
  hosts.cuda_ipc_slot_bytes = 16 << 20;
  hosts.cuda_ipc_hosts_min_bytes = 128 << 10;
  check(chooseRoute(op(OpKind::kAllreduce, 1000), false, hosts).algorithm.hierarchical, "hierarchical pipeline");
  check(chooseRoute(op(OpKind::kAllreduce, 1), true, hosts).path == OpPath::kDeviceOverHosts,
        "device allreduce of any size over the hosts' windows");
  check(chooseRoute(op(OpKind::kAllgather, 1000), true, hosts).path == OpPath::kStaging,
        "a small allgather stages (32 KB of 128 KB)");
  OpRoute big = chooseRoute(op(OpKind::kAllgather, 8192), true, hosts);
  check(big.path == OpPath::kDeviceOverHosts && big.fallback == OpPath::kStaging,
        "a 256 KB allgather takes the hosts' windows");
  hosts.cuda_ipc = false;
  check(chooseRoute(op(OpKind::kAllreduce, 1), true, hosts).path == OpPath::kStaging, "RCOLL_CUDA_IPC=0 over hosts");
  hosts.cuda_ipc = true;
  hosts.hierarchical = false;
  check(chooseRoute(op(OpKind::kAllreduce, 1), true, hosts).path == OpPath::kStaging, "not hierarchical: staging");
}

InterfaceAddress address(const std::string& ifname, const std::string& addr, int prefix, bool loopback = false) {
  InterfaceAddress a;
  a.ifname = ifname;
  a.address = addr;
  a.family = addr.find(':') == std::string::npos ? AF_INET : AF_INET6;
  a.prefix_len = prefix;
  a.loopback = loopback;
  a.link_local = addr.compare(0, 5, "fe80:") == 0;
  return a;
}

std::string chosen(const DataInterfaces& d) {
  std::string out;
  for (const InterfaceAddress& a : d.chosen) out += (out.empty() ? "" : " ") + a.ifname + "=" + a.address;
  return out;
}

bool throwsConfig(const std::function<void()>& fn, const std::string& says) {
  try {
    fn();
  } catch (const RcollError& e) {
    return e.kind() == ErrorKind::kConfig && std::string(e.what()).find(says) != std::string::npos;
  }
  return false;
}

void testNetworkChoices() {
  check(
      NameFilter("eth,ib").accepts("eth1") && NameFilter("eth,ib").accepts("ib0") && !NameFilter("eth").accepts("en0"),
      "prefixes");
  check(NameFilter("=eth0").accepts("eth0") && !NameFilter("=eth0").accepts("eth01"), "=exact");
  check(!NameFilter("^docker,lo").accepts("docker0") && NameFilter("^docker,lo").accepts("eth0"), "^exclude");
  check(!NameFilter("^=eth0").accepts("eth0") && NameFilter("^=eth0").accepts("eth01"), "^=exclude exactly");
  check(NameFilter("mlx5_0:1").accepts("mlx5_0", 1) && !NameFilter("mlx5_0:1").accepts("mlx5_0", 2), "ports");

  const std::vector<InterfaceAddress> host = {address("lo", "127.0.0.1", 8, true),  address("eth0", "198.18.1.1", 24),
                                              address("docker0", "172.17.0.1", 16), address("eth0", "2001:2::1", 64),
                                              address("eth0", "fe80::1%eth0", 64),  address("veth9", "10.88.0.1", 24),
                                              address("eth1", "198.18.2.1", 24)};
  check(chosen(chooseDataInterfaces("", "", host, "", 0)) ==
            "eth0=198.18.1.1 eth1=198.18.2.1 eth0=2001:2::1 eth0=fe80::1%eth0",
        "default: bridges and loopback out; IPv4, IPv6, link-local");
  check(chosen(chooseDataInterfaces("", "", host, "198.18.2.1", 0)).compare(0, 15, "eth1=198.18.2.1") == 0,
        "the address that reaches the store first");
  check(chosen(chooseDataInterfaces("", "ipv6", host, "", 0)) == "eth0=2001:2::1 eth0=fe80::1%eth0", "ipv6 only");
  check(chosen(chooseDataInterfaces("=eth1", "", host, "", 0)) == "eth1=198.18.2.1", "=eth1");
  check(chosen(chooseDataInterfaces("^eth", "", host, "", 0)) == "lo=127.0.0.1 docker0=172.17.0.1 veth9=10.88.0.1",
        "^eth: what is left, bridges too, when asked");
  check(chosen(chooseDataInterfaces("", "", {host[0], host[2]}, "", 0)) == "lo=127.0.0.1", "nothing else: loopback");
  check(throwsConfig([&] { chooseDataInterfaces("=eth9", "", host, "", 3); },
                     "rank 3: RCOLL_SOCKET_IFNAME==eth9: no interface 'eth9' is up"),
        "a missing exact name");
  check(throwsConfig([&] { chooseDataInterfaces("ib", "", host, "", 0); }, "matches no interface"), "no match");
  check(throwsConfig([&] { chooseDataInterfaces("", "ipv5", host, "", 0); }, "RCOLL_SOCKET_FAMILY=ipv5"), "family");

  const DataInterfaces mine = chooseDataInterfaces("", "", host, "", 0);
  check(chooseDialAddress("198.18.9.9:5,[2001:2::7]:5", mine, 0, 1) == "[2001:2::7]:5", "the shared subnet, IPv6");
  check(chooseDialAddress("198.18.2.7:5,[2001:2::7]:5", mine, 0, 1) == "198.18.2.7:5", "the first shared subnet");
  check(chooseDialAddress("[fe80::7]:5", mine, 0, 1) == "[fe80::7%eth0]:5", "link-local: this rank's scope");
  check(throwsConfig([&] { chooseDialAddress("203.0.113.9:5", mine, 0, 1); },
                     "rank 0: no network of this rank reaches rank 1: rank 1 listens on 203.0.113.9:5"),
        "no common network (and no route)");

  check(subnetsOf(mine) == std::vector<std::string>{"198.18.1.0/24", "198.18.2.0/24", "2001:2::/64"},
        "subnets: no link-local, sorted");
  check(commonSubnets({{"a", "b", "c"}, {"b", "c"}, {"c", "d"}}) == std::vector<std::string>{"c"}, "common subnets");
  check(dialAddressesOn({"198.18.1.0/24", "198.18.2.0/24"}, "198.18.2.7:5,198.18.1.7:5", 0, 1) ==
            "198.18.1.7:5,198.18.2.7:5",
        "one address per shared network, in the networks' order");
  check(laneAddress("a:1,b:2", 3) == "b:2" && laneAddress("a:1", 5) == "a:1", "lane k takes address k mod n");

  HostEntry entry{"boot/ns", true, {"198.18.1.0/24", "2001:2::/64"}};
  const HostEntry back = decodeHostEntry(encodeHostEntry(entry));
  check(back.identity == "boot/ns" && back.shm_ok && back.subnets == entry.subnets, "host entry with subnets");
  check(decodeHostEntry(encodeHostEntry(HostEntry{"id with spaces", false, {}})).identity == "id with spaces",
        "host entry: any identity, no subnets");

  LaneSchedule even(3), sender(2), receiver(2);
  std::vector<int> lanes;
  for (int i = 0; i < 6; ++i) lanes.push_back(even.next());
  check(lanes == std::vector<int>{0, 1, 2, 0, 1, 2}, "equal weights: k mod n");
  sender.setWeights({16, 4});
  receiver.setWeights({16, 4});
  int first = 0, agree = 0;
  for (int i = 0; i < 100; ++i) {
    const int peeked = receiver.peek();
    const int s = sender.next(), r = receiver.next();
    agree += s == r && peeked == r ? 1 : 0;
    first += s == 0 ? 1 : 0;
  }
  check(agree == 100, "both ends pick the same lane, and peek() tells it");
  check(first == 80, "weights 16:4: four messages of every five on the first lane");
}

// `lanes` connected pairs on 127.0.0.1, non-blocking: {dialer ends, acceptor ends}.
std::pair<std::vector<int>, std::vector<int>> loopbackLanes(int lanes) {
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  check(::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0 && ::listen(listener, lanes) == 0 &&
            ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) == 0,
        "a loopback listener");
  std::vector<int> dialer, acceptor;
  for (int k = 0; k < lanes; ++k) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    check(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0, "connect on loopback");
    dialer.push_back(fd);
    acceptor.push_back(::accept(listener, nullptr, nullptr));
  }
  ::close(listener);
  for (int fd : dialer) setNonBlocking(fd, true);
  for (int fd : acceptor) setNonBlocking(fd, true);
  return {dialer, acceptor};
}

// The sockets of a pair over several networks, measured when it connects
// (csrc/lane_probe.h): rates to weights, and the exchange itself over two
// loopback sockets (real links: tests/hosts/test_networks.py).
void testLaneProbe() {
  check(weightsFromRates({125e6, 31e6}) == std::vector<int>{16, 4}, "1 Gbit/s beside 250 Mbit/s: 16 and 4");
  check(weightsFromRates({100e6, 85e6}) == std::vector<int>{16, 16}, "within a fifth of the fastest: equal");
  check(weightsFromRates({100e6, 0.0}) == std::vector<int>{16, 1}, "a lane that moved nothing still gets 1");
  check(weightsFromRates({0.0, 0.0}) == std::vector<int>{16, 16}, "nothing measured: equal");

  auto [dialer, acceptor] = loopbackLanes(2);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  std::vector<int> dialed, accepted;
  std::vector<double> rates;
  std::string dialer_failed, acceptor_failed;
  std::thread other([&, fds = dialer] {
    try {
      dialed = probeLanesAsDialer(fds, deadline, 1, 0);
    } catch (const std::exception& e) {
      dialer_failed = e.what();
    }
  });
  try {
    accepted = probeLanesAsAcceptor(acceptor, deadline, 0, 1, &rates);
  } catch (const std::exception& e) {
    acceptor_failed = e.what();
    for (int fd : acceptor) ::shutdown(fd, SHUT_RDWR);  // the dialer fails at once, not at the deadline
  }
  other.join();
  check(dialer_failed.empty() && acceptor_failed.empty(),
        "the probe: dialer: " + dialer_failed + "; acceptor: " + acceptor_failed);
  check(accepted.size() == 2 && dialed == accepted, "both ends hold the same weights");
  check(rates.size() == 2 && rates[0] > 1e6 && rates[1] > 1e6, "loopback moves megabytes per second");
  // The streams are in step: what follows the probe on each socket is read whole, and nothing else is there.
  std::string why;
  for (size_t k = 0; k < 2; ++k) {
    const char sent[3] = {'o', 'k', static_cast<char>('0' + k)};
    char got[3] = {};
    check(sendAll(dialer[k], sent, 3, deadline, &why) && recvAll(acceptor[k], got, 3, deadline, &why) &&
              std::string(got, 3) == std::string(sent, 3),
          "lane " + std::to_string(k) + " in step after the probe " + why);
    char extra = 0;
    check(::recv(acceptor[k], &extra, 1, MSG_DONTWAIT) < 0 && ::recv(dialer[k], &extra, 1, MSG_DONTWAIT) < 0,
          "nothing left over either way on lane " + std::to_string(k));
    int lowat = -1;
    socklen_t len = sizeof(lowat);
    check(::getsockopt(dialer[k], IPPROTO_TCP, TCP_NOTSENT_LOWAT, &lowat, &len) == 0 && lowat == 0,
          "the dialer's TCP_NOTSENT_LOWAT is back to the system's on lane " + std::to_string(k));
  }
  for (int fd : dialer) ::close(fd);
  for (int fd : acceptor) ::close(fd);
}

// Which RoCE GID a port uses (csrc/rdma/ib_device.cc), on a dual-stack
// netdev's table: IPv4 by default, either family when asked for, never a
// link-local one, and a reason that names the setting when none fits.
void testGidChoice() {
  const std::vector<GidDescription> dual = {{0, "fe80::1", "RoCE v2", "eth0", false, true},
                                            {1, "::ffff:192.0.2.1", "RoCE v1", "eth0", true, false},
                                            {2, "::ffff:192.0.2.1", "RoCE v2", "eth0", true, false},
                                            {3, "2001:db8::1", "RoCE v2", "eth0", false, false}};
  std::string why;
  check(chooseGid(dual, -1, AF_UNSPEC, &why) == 2 && why.find("IPv4-mapped") != std::string::npos,
        "default: RoCE v2 with the IPv4 address, " + why);
  check(chooseGid(dual, -1, AF_INET6, &why) == 3 && why.find("RCOLL_IB_ADDR_FAMILY") != std::string::npos,
        "RCOLL_IB_ADDR_FAMILY=AF_INET6: the global IPv6 entry, " + why);
  check(chooseGid(dual, -1, AF_INET, &why) == 2, "RCOLL_IB_ADDR_FAMILY=AF_INET: the IPv4 entry");
  const std::vector<GidDescription> ipv4_only(dual.begin(), dual.begin() + 3);
  check(chooseGid(ipv4_only, -1, AF_INET6, &why) == -1 && why.find("IPv6") != std::string::npos &&
            why.find("RCOLL_IB_ADDR_FAMILY") != std::string::npos,
        "no entry of the family asked for: none, saying why: " + why);
  check(chooseGid(dual, 0, AF_INET, &why) == 0, "RCOLL_IB_GID_INDEX wins over the family");
}

// A rail of RailsTransport, connected to rank 1 from the start: it counts the
// memory it holds and the bytes it is given to send (a header's worth per
// message included), refuses (throws, or says no) when told to, and it
// completes `per_step` of its messages, oldest first, each time it is driven,
// so that rails of different steps look as fast as their steps.
class FakeRail : public Transport {
 public:
  enum class Refusal { kNone, kThrow, kNull };
  FakeRail(int* held, Refusal refusal, int per_step = 1, size_t* sent = nullptr)
      : held_(held), refusal_(refusal), per_step_(per_step), sent_(sent) {}

  const char* name() const override { return "fake"; }
  std::string listenAddress() const override { return ""; }
  void connect(int, const std::string&, Deadline) override {}
  int accept(Deadline) override { return 1; }
  void closeListener() override {}
  bool connected(int peer) const override { return peer == 1; }
  MemoryHandle registerMemory(void* data, size_t) override { return take(data); }
  MemoryHandle registerDeviceMemory(void* data, size_t, int, uint64_t, std::string* why) override {
    if (refusal_ == Refusal::kNull) {
      *why = "this port cannot reach device memory";
      return nullptr;
    }
    return take(data);
  }
  void deregisterMemory(MemoryHandle handle) override {
    if (handle != nullptr) --*held_;
  }
  Request* isend(int, const WireHeader&, const void*, size_t bytes) override {
    if (sent_ != nullptr) *sent_ += bytes + sizeof(WireHeader);
    return queue();
  }
  Request* irecv(int, const WireHeader&, void*, size_t) override { return queue(); }
  void progress(std::chrono::milliseconds) override { progressNow(); }
  Activity progressNow() override {
    int completed = 0;
    while (completed < per_step_ && next_ < requests_.size()) {
      requests_[next_++]->state = Request::State::kDone;
      ++completed;
    }
    return completed > 0 ? Activity::kFinished : Activity::kIdle;
  }
  bool prepareSleep(std::vector<pollfd>*) override { return next_ == requests_.size(); }
  Activity finishSleep(const pollfd*, size_t) override { return Activity::kIdle; }
  TransportFailure failure(Request*) const override { return {}; }
  void release(Request*) override {}
  void interrupt() override {}
  void abortPeers(ErrorKind, const std::string&) override {}

 private:
  MemoryHandle take(void* data) {
    if (refusal_ == Refusal::kThrow) throwError(ErrorKind::kGeneric, "ibv_reg_mr: Cannot allocate memory");
    ++*held_;
    return data;
  }
  Request* queue() {
    requests_.push_back(std::make_unique<Request>());
    return requests_.back().get();
  }
  int* held_;
  Refusal refusal_;
  int per_step_;
  size_t* sent_;
  std::vector<std::unique_ptr<Request>> requests_;
  size_t next_ = 0;
};

ConnectInfo pairInfo() {
  ConnectInfo info;
  info.rank = 0;
  info.size = 2;
  return info;
}

// The acceptor's measurement of two rails, one four times as fast as the
// other: when the fast one has brought its messages, the slow one has a
// quarter of its own, so the shares are 16 and 4; then the pair's messages
// go four of every five on the fast rail, also when sizes vary.
void testRailsShares() {
  int held = 0;
  std::vector<size_t> on(2);  // bytes, a header's worth per message included
  std::vector<std::unique_ptr<Transport>> rails;
  rails.push_back(std::make_unique<FakeRail>(&held, FakeRail::Refusal::kNone, 4, &on[0]));
  rails.push_back(std::make_unique<FakeRail>(&held, FakeRail::Refusal::kNone, 1, &on[1]));
  RailsTransport transport(pairInfo(), std::move(rails), std::chrono::microseconds(0));
  check(transport.accept(std::chrono::steady_clock::now() + std::chrono::seconds(10)) == 1, "rank 1 accepted");
  on.assign(2, 0);  // the measurement's own messages left out
  char buffer[4096];
  std::vector<Request*> sent;
  for (int m = 0; m < 1000; ++m) {
    const size_t bytes = m % 3 == 0 ? sizeof(buffer) : static_cast<size_t>(m % 1000);
    sent.push_back(transport.isend(1, WireHeader{}, buffer, bytes));
  }
  for (Request* r : sent) transport.release(r);
  check(on[0] > 3.9 * on[1] && on[0] < 4.1 * on[1],
        "bytes on the rails in proportion to 16:4: " + std::to_string(on[0]) + ", " + std::to_string(on[1]));
  transport.closeListener();
}

// A registration that the last of three ports refuses leaves nothing
// registered on the first two, whether it throws or says no.
void testRailsRegistration() {
  using Refusal = FakeRail::Refusal;
  for (Refusal refusal : {Refusal::kThrow, Refusal::kNull}) {
    int held = 0;
    std::vector<std::unique_ptr<Transport>> rails;
    rails.push_back(std::make_unique<FakeRail>(&held, Refusal::kNone));
    rails.push_back(std::make_unique<FakeRail>(&held, Refusal::kNone));
    rails.push_back(std::make_unique<FakeRail>(&held, refusal));
    RailsTransport transport(pairInfo(), std::move(rails), std::chrono::microseconds(0));
    char buffer[64];
    std::string why;
    bool threw = false;
    MemoryHandle handle = nullptr;
    try {
      handle = refusal == Refusal::kThrow ? transport.registerMemory(buffer, sizeof(buffer))
                                          : transport.registerDeviceMemory(buffer, sizeof(buffer), -1, 0, &why);
    } catch (const RcollError& e) {
      threw = std::string(e.what()).find("Cannot allocate memory") != std::string::npos;
    }
    const char* how = refusal == Refusal::kThrow ? "a port that throws" : "a port that says no";
    check(handle == nullptr, std::string("no handle past ") + how);
    check(refusal == Refusal::kThrow ? threw : !why.empty(), std::string("the refusal reaches the caller: ") + how);
    check(held == 0,
          std::string("nothing left registered on the other ports past ") + how + ": " + std::to_string(held));
  }
  int held = 0;
  std::vector<std::unique_ptr<Transport>> rails;
  rails.push_back(std::make_unique<FakeRail>(&held, Refusal::kNone));
  rails.push_back(std::make_unique<FakeRail>(&held, Refusal::kNone));
  RailsTransport transport(pairInfo(), std::move(rails), std::chrono::microseconds(0));
  char buffer[64];
  MemoryHandle handle = transport.registerMemory(buffer, sizeof(buffer));
  check(handle != nullptr && held == 2, "one registration per port");
  transport.deregisterMemory(handle);
  check(held == 0, "deregistered on every port");
}

}  // namespace

int main() {
  try {
    testTopology();
    testHostOrderedRings();
    testAgreedSettings();
    testOpChecks();
    testRoutes();
    testNetworkChoices();
    testLaneProbe();
    testGidChoice();
    testRailsRegistration();
    testRailsShares();
  } catch (const std::exception& e) {
    check(false, std::string("unexpected exception: ") + e.what());
  }
  return unit::finishUnit("test_setup_parts");
}
