#include "config.h"

#include <sys/socket.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "error.h"

namespace rcoll {

const std::vector<ConfigVar>& configVars() {
  static const std::vector<ConfigVar> vars = {
      {"RCOLL_DEBUG", "WARN", "log level: `WARN`, `INFO`, `TRACE` (`NONE` silences warnings)"},
      {"RCOLL_TRANSPORT", "auto",
       "data transport, chosen per pair of ranks: `auto` (shared memory between ranks of one host; "
       "between hosts verbs when every rank with a peer on another host has an active RDMA port, "
       "else TCP, with one INFO line saying why), `shm` (every rank on one host, else a "
       "`ConfigError` naming a rank elsewhere), `ib` (verbs on every pair, or a clear error) or "
       "`tcp` (TCP on every pair)"},
      {"RCOLL_SHM_DISABLE", "0", "`1`: never shared memory on this rank's pairs (`auto` then picks verbs or TCP)"},
      {"RCOLL_HOSTID", "",
       "this rank's host identity, like `NCCL_HOSTID` (default: the kernel's boot id and the network "
       "namespace); ranks with equal values use shared memory with each other, so a value must name "
       "one machine (ranks of one machine may be split into several \"hosts\")"},
      {"RCOLL_SHM_RING_BYTES", "4M", "shared-memory ring per direction and pair of ranks (4K to 1G)"},
      {"RCOLL_SHM_COLL", "1",
       "when every rank is on one host, allreduce, allgather, reduce_scatter, broadcast and barrier "
       "go through shared windows (each rank publishes its data once; the others read and reduce it "
       "in place); `0`: the ring over shared memory"},
      {"RCOLL_SHM_COLL_SLOT_BYTES", "1M",
       "each rank's window slot (it has two); larger ops run in steps of this size (4K to 1G)"},
      {"RCOLL_SHM_COLL_DIRECT_BYTES", "256K",
       "window allreduce: while step bytes x ranks stay within this, every rank reduces the whole "
       "step (one hand-off); above, each rank reduces a slice and the others copy it"},
      {"RCOLL_CUDA_IPC", "1",
       "when every rank is on one host, CUDA tensors of allreduce, allgather, reduce_scatter and "
       "broadcast go device to device through CUDA IPC windows (each rank's two device slots, mapped "
       "by the others; reductions on the GPU); across hosts, the hierarchical allreduce, allgather and "
       "reduce_scatter run inside each host through them; ranks that cannot map each other's memory "
       "fall back together, with one warning; `0`: pinned host staging"},
      {"RCOLL_CUDA_IPC_SLOT_BYTES", "16M",
       "each rank's device window slot (it has two); larger ops run in steps of this size (4K to 1G)"},
      {"RCOLL_CUDA_IPC_DIRECT_BYTES", "1M",
       "CUDA IPC allreduce: while step bytes x ranks stay within this, every rank reduces the whole "
       "step (one hand-off); above, each reduces a slice that the others copy"},
      {"RCOLL_CUDA_IPC_HOSTS_MIN_BYTES", "128K",
       "across hosts, CUDA tensors of allgather, reduce_scatter and broadcast smaller than this (the "
       "whole buffer: allgather's output, reduce_scatter's input) are staged on every edge instead of "
       "going through the CUDA IPC windows inside each host: those ops run their phases inside and "
       "between the hosts one after the other, which saves nothing on small buffers (on one H200 the "
       "windows won every run from 128K and tied with staging below it, docs/benchmarks.md); the "
       "allreduce, whose phases alternate, takes the windows at every size. `0`: the windows at every "
       "size"},
      {"RCOLL_GDR", "auto",
       "GPUDirect RDMA: CUDA tensors sent over verbs go between GPU memory and the NIC with no copy "
       "through host memory (the staging slots are GPU memory, registered as a dma-buf, else through "
       "`nvidia-peermem`). `auto` uses it where GPU, driver and NIC allow and stages through pinned "
       "host memory otherwise (one WARN says why); `1` makes its absence a `ConfigError` at the "
       "first GPU op; `0` always stages. Each rank decides for itself"},
      {"RCOLL_SOCKET_IFNAME", "",
       "the interfaces that carry data between hosts, in NCCL's syntax: `eth,ib` (name prefixes), "
       "`=eth0,eth1` (exact names), `^docker,lo` (all but those). Default: every interface that is up "
       "with an address but loopback and container or VM bridges (docker*, virbr*, veth*, br-*, cni*, "
       "flannel*, cali*), when any other is there. A rank listens on all of their addresses; a peer "
       "dials one on a network both share, else one a route reaches through its own (docs/network.md)"},
      {"RCOLL_SOCKET_STRIPE", "0",
       "`1`: where every host has data interfaces on the same two or more networks (several NICs), each "
       "pair of ranks on different hosts opens `RCOLL_SOCKETS_PER_PEER` sockets on each network and a "
       "collective's segments are spread over them in proportion to what each carried when the pair "
       "connected (measured, docs/network.md); a socket whose link fails hands its messages to the others "
       "and the job goes on (after `RCOLL_PEER_TIMEOUT`). Rank 0's value holds for every rank"},
      {"RCOLL_SOCKET_FAMILY", "",
       "`AF_INET` (`ipv4`) or `AF_INET6` (`ipv6`): only addresses of that family carry data; default both"},
      {"RCOLL_SOCKET_BUFFER_BYTES", "0",
       "`SO_SNDBUF`/`SO_RCVBUF`; 0 keeps the kernel's autotuning, which usually grows larger than a "
       "fixed value can"},
      {"RCOLL_SOCKETS_PER_PEER", "1",
       "TCP connections between each pair of ranks (1 to 16). A collective's segments to a peer take "
       "turns on them (the k-th message on socket k mod N, on both ends), so that a fast NIC is not "
       "held to what one stream, copied by one core, carries; point-to-point traffic keeps one "
       "socket. On loopback or a host whose cores are already busy it gains nothing (see "
       "docs/benchmarks.md)"},
      {"RCOLL_RUNTIME_CONNECT", "1",
       "`1`: TCP connections and RDMA queue pairs are made on first use (the higher rank of a pair dials, "
       "the lower one asks it to; verbs then swaps queue pairs over that socket), except those the "
       "collectives always need, made at start-up: the neighbours in the host-ordered ring, the "
       "recursive-doubling and barrier partners, the ranks of the same host and those of the same local "
       "index on the neighbouring hosts. A rank then holds connections to O(log P + local ranks) peers "
       "instead of two to each of the P - 1; alltoall, rooted ops and send/recv connect the rest as they "
       "need them. `0`: every rank connects to every other at start-up, twice (collectives and "
       "point-to-point). Shared memory connects at start-up either way"},
      {"RCOLL_CHUNK_BYTES", "1M", "largest pipeline segment of the ring algorithms"},
      {"RCOLL_MIN_CHUNK_BYTES", "64K", "smallest segment a ring block is cut into for overlap"},
      {"RCOLL_PIPELINE_SLOTS", "8", "staging segments in flight per operation"},
      {"RCOLL_ALLREDUCE_RD_BYTES", "32K",
       "allreduce buffers up to this size use recursive doubling (log2 P exchanges of the whole "
       "buffer: latency-bound sizes), and allgathers whose gathered result is up to this size Bruck's "
       "algorithm (log2 P steps); larger ones the ring; `0`: always the ring"},
      {"RCOLL_ALGO", "auto",
       "algorithm of reduce_scatter and of the allgathers and allreduces above `RCOLL_ALLREDUCE_RD_BYTES` "
       "(an allgather's gathered size): "
       "`auto` takes `hierarchical` wherever it applies (two or more hosts with the same number, two "
       "or more, of ranks each: an allreduce moves 2(H-1)/H of the buffer over each host link where "
       "the flat ring moves 2(P-1)/P, an allgather (H-1)/H where the ring moves (P-1)/P, in fewer "
       "network steps) and `ring` elsewhere; `ring`: the ring in host order; `hierarchical`: as "
       "`auto`, with an INFO line where it does not apply"},
      {"RCOLL_SPIN_US", "50",
       "microseconds a waiting rank busy-polls its connections (yielding the core between polls) "
       "before it sleeps; `0`: sleep at once (least CPU, more latency)"},
      {"RCOLL_CONNECT_TIMEOUT", "300", "seconds to wait for the store and the peers at start-up"},
      {"RCOLL_PEER_TIMEOUT", "15",
       "seconds after which a peer whose host acknowledges nothing (a cut link, a host gone without closing "
       "its sockets) is declared dead: rcoll fails a socket whose data or probes its peer host has not "
       "acknowledged for 2/3 of this, and probes idle ones (keepalive), "
       "so the op fails with a `PeerError` naming it within this bound, idle or not (with "
       "`RCOLL_SOCKET_STRIPE`, one link of several failing: its messages go on over the others). A slow process is not "
       "dead, even one that reads nothing for minutes (its kernel still acknowledges); an outage shorter than about "
       "half of this is survived. `0`: "
       "the kernel's defaults (about 15 minutes with data in flight, never on an idle connection)"},
      {"RCOLL_TIMEOUT", "1800", "default per-operation timeout in seconds (`rcoll.init(timeout=...)` overrides)"},
      {"RCOLL_IB_HCA", "",
       "RDMA devices/ports, NCCL-style: `mlx5_0:1,mlx5_1` (name prefixes, optional port), `=mlx5_0` "
       "(exact names), `^mlx5_1` (exclude); every ACTIVE port it names carries a share of each pair's "
       "messages (docs/rdma.md); default: the first ACTIVE port"},
      {"RCOLL_IB_GID_INDEX", "",
       "RoCE GID index; default: scan the GID table, prefer RoCE v2 with an IPv4-mapped address, "
       "skip link-local and empty entries"},
      {"RCOLL_IB_ADDR_FAMILY", "",
       "`AF_INET` (`ipv4`) or `AF_INET6` (`ipv6`): the IP family of the RoCE GID chosen automatically, as "
       "NCCL_IB_ADDR_FAMILY (a dual-stack fabric routed for one family); default: IPv4 where the port's "
       "netdev has an IPv4 address, else IPv6"},
      {"RCOLL_IB_TIMEOUT", "16", "RC ack timeout exponent (4.096 us x 2^value per retry)"},
      {"RCOLL_IB_RETRY_CNT", "7",
       "RC retries before a silent peer is declared unreachable (Soft-RoCE takes 7 as no limit: set 6 or less there)"},
      {"RCOLL_IB_MR_CACHE_BYTES", "4G", "unused memory registrations kept for reuse (0: register per operation)"},
      {"RCOLL_IBVERBS_LIB", "", "the libibverbs to load (default `libibverbs.so.1`, then `libibverbs.so`)"},
      {"RCOLL_TIMELINE", "",
       "write a Chrome trace of every op to `<value>.rank<N>.json`; a process's later communicators "
       "(torch sub-groups) write `<value>.rank<N>.comm<K>.json` (docs/environment.md, \"The timeline\")"},
      {"RCOLL_TRACE_BUFFER_SIZE", "2000",
       "the flight recorder: how many of the process's last ops it keeps (sequence number, op, dtype, count, "
       "root or peer, algorithm, path, state, times); `0`: off (docs/operations.md)"},
      {"RCOLL_TRACE_DIR", "",
       "the flight recorder dumps to `<value>/rcoll_trace_rank_<rank>` (torch's flight-recorder format) when a "
       "communicator fails (a timeout, a dead peer, a mismatch, an abort) and on SIGUSR1; unset: only "
       "`rcoll.dump_trace(path)` dumps"},
      {"RCOLL_WATCH_INTERVAL", "5",
       "seconds between a process's rounds with the job's store: it publishes its status (what "
       "`python -m rcoll status` prints: one small key per rank), rank 0 judges the job's stragglers and "
       "slow links, and, when a rank's communicator failed, every rank dumps its flight recorder "
       "(RCOLL_TRACE_DIR set), also ranks that are not in an rcoll op; `0`: off (docs/operations.md)"},
      {"RCOLL_STATS_FILE", "",
       "write `rcoll.stats()` (count, bytes, time, algbw and busbw per op, algorithm and path; errors) as JSON to "
       "this file when the process exits; `{rank}` in it is replaced by the process's rank"},
      {"RCOLL_METRICS_PORT", "0",
       "serve the counters in Prometheus' text format (`GET /metrics`) on port value + the rank's local "
       "rank, on the job's data interface (the first that RCOLL_SOCKET_IFNAME chooses); `0`: off"},
      {"RCOLL_STRAGGLER_MS", "50",
       "the job's watch (rank 0, each RCOLL_WATCH_INTERVAL) names a rank as a straggler when, over the last 64 "
       "collectives without a root that every rank reported, it arrived last in at least half, by a median of at "
       "least this many milliseconds after the others, and spent at least half of that longer than they did "
       "between collectives (docs/operations.md)"},
      {"RCOLL_SLOW_LINK_RATIO", "4",
       "the job's watch names an edge between two hosts (one rank to another, one way) as slow when its large "
       "transfers lately (the last rounds, up to 30 s) reached less than the median of the other such edges of its "
       "transport divided by this (docs/operations.md)"},
      {"RCOLL_ELASTIC_JOIN", "0",
       "`1`: this process joins a job that is already running, at the store address (`MASTER_ADDR`, "
       "`MASTER_PORT`), with no rank of its own: `rcoll.init()` and `hvd.init()` wait (at most "
       "`RCOLL_TIMEOUT`) until the job's ranks take it in (`Communicator.grow`, `hvd.elastic` at a "
       "commit); it comes after them (docs/failures.md)"},
      {"RCOLL_HOROVOD_IDLE_CYCLE", "20",
       "rcoll.horovod: milliseconds between negotiation rounds, at most, after three quiet rounds (no op "
       "submitted or pending anywhere): an op submitted then waits up to this long for the other ranks "
       "(docs/horovod.md)"},
      {"RCOLL_HOROVOD_INLINE_BYTES", "256",
       "rcoll.horovod: a synchronous allreduce of a host tensor of at most this many bytes, with a name "
       "every rank has used before for the same op, completes in the round that agrees on it (one "
       "collective instead of two); `0` turns this off. Rank 0's value holds for every rank (docs/horovod.md)"},
      {"RCOLL_SHUTDOWN_TIMEOUT", "10",
       "seconds `shutdown()` (and `destroy_process_group`) lets pending operations finish before "
       "aborting them"},
      {"RCOLL_DEVICE_RUNTIME", "rcoll._cuda",
       "the Python module whose `device_api_capsule()` supplies the device runtime (csrc/device_api.h) "
       "when the first GPU buffer shows up; the tests name a host-memory emulation here "
       "(tests/device/emulated_device/) to check staging and stream logic on machines without a GPU"},
  };
  return vars;
}

std::string environmentValue(const char* name) {
  bool documented = false;
  for (const ConfigVar& var : configVars()) documented = documented || std::strcmp(var.name, name) == 0;
  if (!documented) {
    throwError(ErrorKind::kGeneric,
               strFormat("internal error: %s is read but not documented in configVars() (config.cc)", name));
  }
  const char* value = std::getenv(name);
  return value != nullptr ? value : "";
}

// --- one parser per kind of value ---------------------------------------------

size_t parseByteSize(const std::string& name, const std::string& value) {
  size_t pos = 0;
  unsigned long long number = 0;
  bool ok = !value.empty() && std::isdigit(static_cast<unsigned char>(value[0]));
  if (ok) {
    try {
      number = std::stoull(value, &pos);
    } catch (const std::exception&) {
      ok = false;
    }
  }
  unsigned long long scale = 1;
  if (ok && pos < value.size()) {
    char suffix = static_cast<char>(std::toupper(static_cast<unsigned char>(value[pos])));
    scale = suffix == 'K' ? 1ull << 10 : suffix == 'M' ? 1ull << 20 : suffix == 'G' ? 1ull << 30 : 0;
    pos++;
    if (pos < value.size() && (value[pos] == 'B' || value[pos] == 'b')) pos++;
    ok = scale != 0 && pos == value.size() && number <= (~0ull) / scale;
  }
  if (!ok) {
    throwError(ErrorKind::kConfig,
               strFormat("%s=%s is not a byte size (examples: 65536, 64K, 4M)", name.c_str(), value.c_str()));
  }
  return static_cast<size_t>(number * scale);
}

int addressFamilyNamed(const std::string& value) {
  if (value.empty()) return AF_UNSPEC;
  if (value == "AF_INET" || value == "ipv4" || value == "4") return AF_INET;
  if (value == "AF_INET6" || value == "ipv6" || value == "6") return AF_INET6;
  return -1;
}

namespace {

// 4096 -> "4K", 1 << 30 -> "1G": bounds in the form users write them.
std::string bytesText(size_t bytes) {
  if (bytes >= (size_t{1} << 30) && bytes % (size_t{1} << 30) == 0) return std::to_string(bytes >> 30) + "G";
  if (bytes >= (size_t{1} << 20) && bytes % (size_t{1} << 20) == 0) return std::to_string(bytes >> 20) + "M";
  if (bytes >= (size_t{1} << 10) && bytes % (size_t{1} << 10) == 0) return std::to_string(bytes >> 10) + "K";
  return std::to_string(bytes) + " bytes";
}

// A byte size within [lo, hi], rounded up to a multiple of `align`.
size_t parseBytesIn(const char* name, const std::string& value, size_t lo, size_t hi, size_t align = 1) {
  const size_t bytes = parseByteSize(name, value);
  if (bytes < lo || bytes > hi) {
    throwError(ErrorKind::kConfig, strFormat("%s=%s must be between %s and %s", name, value.c_str(),
                                             bytesText(lo).c_str(), bytesText(hi).c_str()));
  }
  return (bytes + align - 1) / align * align;
}

long parseInt(const char* name, const std::string& value, long lo, long hi) {
  char* end = nullptr;
  errno = 0;
  long parsed = std::strtol(value.c_str(), &end, 10);
  if (end == value.c_str() || *end != '\0' || errno != 0 || parsed < lo || parsed > hi) {
    throwError(ErrorKind::kConfig, strFormat("%s=%s must be an integer in [%ld, %ld]", name, value.c_str(), lo, hi));
  }
  return parsed;
}

bool parseFlag(const char* name, const std::string& value) { return parseInt(name, value, 0, 1) == 1; }

int parseAddressFamily(const char* name, const std::string& value) {
  const int family = addressFamilyNamed(value);
  if (family < 0) {
    throwError(ErrorKind::kConfig, strFormat("%s=%s: expected AF_INET (ipv4) or AF_INET6 (ipv6)", name, value.c_str()));
  }
  return family;
}

// Seconds, fractions allowed ("0.5"), at least `min_seconds`; `zero_ok` lets 0 through.
std::chrono::milliseconds parseSeconds(const char* name, const std::string& value, bool zero_ok) {
  char* end = nullptr;
  const double seconds = std::strtod(value.c_str(), &end);
  const bool ok = end != value.c_str() && *end == '\0' && std::isfinite(seconds) &&
                  (zero_ok ? seconds >= 0 : seconds > 0) && seconds <= 1e9;
  if (!ok) {
    throwError(ErrorKind::kConfig, strFormat("%s=%s must be a number of seconds %s (fractions allowed, e.g. 0.5)", name,
                                             value.c_str(), zero_ok ? ">= 0" : "> 0"));
  }
  return std::chrono::milliseconds(static_cast<long long>(std::ceil(seconds * 1000)));
}

std::string parseChoice(const char* name, const std::string& value, std::initializer_list<const char*> choices) {
  std::string listed;
  for (const char* choice : choices) {
    if (value == choice) return value;
    listed += (listed.empty() ? "" : ", ") + std::string(choice);
  }
  throwError(ErrorKind::kConfig, strFormat("%s=%s is not one of %s", name, value.c_str(), listed.c_str()));
}

// Read once per process: the log level, the libibverbs path, the device runtime module.
bool isProcessWide(const std::string& name) {
  return name == "RCOLL_DEBUG" || name == "RCOLL_IBVERBS_LIB" || name == "RCOLL_DEVICE_RUNTIME";
}

void checkOverrides(const Settings& overrides) {
  for (const auto& [name, value] : overrides) {
    bool documented = false;
    for (const ConfigVar& v : configVars()) documented = documented || name == v.name;
    if (!documented) {
      throwError(ErrorKind::kConfig,
                 strFormat("settings: %s is not an rcoll setting (python -m rcoll info lists them)", name.c_str()));
    }
    if (isProcessWide(name)) {
      throwError(ErrorKind::kConfig,
                 strFormat("settings: %s applies to the whole process: set it in the environment", name.c_str()));
    }
  }
}

}  // namespace

Config Config::fromEnvironment(const Settings& overrides) {
  checkOverrides(overrides);
  // Calls `parse` with the variable's value, the override's first, when it is set and not empty.
  auto ifSet = [&](const char* name, auto parse) {
    const auto found = overrides.find(name);
    const std::string value = found != overrides.end() ? found->second : environmentValue(name);
    if (!value.empty()) parse(name, value);
  };
  Config c;
  using S = const std::string&;
  ifSet("RCOLL_CHUNK_BYTES", [&](const char* n, S v) { c.chunk_bytes = parseBytesIn(n, v, 64, size_t{1} << 30); });
  ifSet("RCOLL_MIN_CHUNK_BYTES",
        [&](const char* n, S v) { c.min_chunk_bytes = parseBytesIn(n, v, 64, c.chunk_bytes); });
  if (c.min_chunk_bytes > c.chunk_bytes) {
    throwError(ErrorKind::kConfig, "RCOLL_MIN_CHUNK_BYTES must not exceed RCOLL_CHUNK_BYTES");
  }
  ifSet("RCOLL_PIPELINE_SLOTS",
        [&](const char* n, S v) { c.pipeline_slots = static_cast<int>(parseInt(n, v, 1, 256)); });
  ifSet("RCOLL_ALLREDUCE_RD_BYTES", [&](const char* n, S v) { c.allreduce_rd_bytes = parseByteSize(n, v); });
  ifSet("RCOLL_ALGO", [&](const char* n, S v) {
    const std::string a = parseChoice(n, v, {"auto", "ring", "hierarchical"});
    c.algo = a == "ring" ? Algo::kRing : a == "hierarchical" ? Algo::kHierarchical : Algo::kAuto;
  });
  ifSet("RCOLL_SPIN_US", [&](const char* n, S v) { c.spin = std::chrono::microseconds(parseInt(n, v, 0, 1000000)); });
  ifSet("RCOLL_SOCKET_BUFFER_BYTES", [&](const char* n, S v) { c.socket_buffer_bytes = parseByteSize(n, v); });
  ifSet("RCOLL_SOCKETS_PER_PEER",
        [&](const char* n, S v) { c.sockets_per_peer = static_cast<int>(parseInt(n, v, 1, 16)); });
  ifSet("RCOLL_RUNTIME_CONNECT", [&](const char* n, S v) { c.runtime_connect = parseFlag(n, v); });
  ifSet("RCOLL_SOCKET_IFNAME", [&](const char*, S v) { c.socket_ifname = v; });
  ifSet("RCOLL_SOCKET_FAMILY", [&](const char*, S v) { c.socket_family = v; });
  ifSet("RCOLL_SOCKET_STRIPE", [&](const char* n, S v) { c.socket_stripe = parseFlag(n, v); });
  ifSet("RCOLL_TRANSPORT", [&](const char* n, S v) { c.transport = parseChoice(n, v, {"auto", "shm", "ib", "tcp"}); });
  ifSet("RCOLL_SHM_DISABLE", [&](const char* n, S v) { c.shm_disable = parseFlag(n, v); });
  ifSet("RCOLL_SHM_RING_BYTES",
        [&](const char* n, S v) { c.shm_ring_bytes = parseBytesIn(n, v, 4096, size_t{1} << 30, 4096); });
  ifSet("RCOLL_SHM_COLL", [&](const char* n, S v) { c.shm_coll = parseFlag(n, v); });
  ifSet("RCOLL_SHM_COLL_SLOT_BYTES",
        [&](const char* n, S v) { c.shm_coll_slot_bytes = parseBytesIn(n, v, 4096, size_t{1} << 30, 64); });
  ifSet("RCOLL_SHM_COLL_DIRECT_BYTES", [&](const char* n, S v) { c.shm_coll_direct_bytes = parseByteSize(n, v); });
  ifSet("RCOLL_CUDA_IPC", [&](const char* n, S v) { c.cuda_ipc = parseFlag(n, v); });
  ifSet("RCOLL_CUDA_IPC_SLOT_BYTES",
        [&](const char* n, S v) { c.cuda_ipc_slot_bytes = parseBytesIn(n, v, 4096, size_t{1} << 30, 256); });
  ifSet("RCOLL_CUDA_IPC_DIRECT_BYTES", [&](const char* n, S v) { c.cuda_ipc_direct_bytes = parseByteSize(n, v); });
  ifSet("RCOLL_CUDA_IPC_HOSTS_MIN_BYTES",
        [&](const char* n, S v) { c.cuda_ipc_hosts_min_bytes = parseByteSize(n, v); });
  ifSet("RCOLL_GDR", [&](const char* n, S v) {
    const std::string g = parseChoice(n, v, {"auto", "0", "1"});
    c.gdr = g == "auto" ? Gdr::kAuto : g == "1" ? Gdr::kOn : Gdr::kOff;
  });
  ifSet("RCOLL_HOSTID", [&](const char*, S v) { c.host_id = v; });
  ifSet("RCOLL_IB_HCA", [&](const char*, S v) { c.ib_hca = v; });
  ifSet("RCOLL_IB_GID_INDEX", [&](const char* n, S v) { c.ib_gid_index = static_cast<int>(parseInt(n, v, 0, 65535)); });
  ifSet("RCOLL_IB_ADDR_FAMILY", [&](const char* n, S v) { c.ib_addr_family = parseAddressFamily(n, v); });
  ifSet("RCOLL_IB_TIMEOUT", [&](const char* n, S v) { c.ib_timeout = static_cast<int>(parseInt(n, v, 1, 31)); });
  ifSet("RCOLL_IB_RETRY_CNT", [&](const char* n, S v) { c.ib_retry_cnt = static_cast<int>(parseInt(n, v, 0, 7)); });
  ifSet("RCOLL_IB_MR_CACHE_BYTES", [&](const char* n, S v) { c.ib_mr_cache_bytes = parseByteSize(n, v); });
  ifSet("RCOLL_TIMELINE", [&](const char*, S v) { c.timeline = v; });
  ifSet("RCOLL_TRACE_BUFFER_SIZE",
        [&](const char* n, S v) { c.trace_buffer_size = static_cast<size_t>(parseInt(n, v, 0, 10000000)); });
  ifSet("RCOLL_TRACE_DIR", [&](const char*, S v) { c.trace_dir = v; });
  ifSet("RCOLL_STATS_FILE", [&](const char*, S v) { c.stats_file = v; });
  ifSet("RCOLL_METRICS_PORT", [&](const char* n, S v) { c.metrics_port = static_cast<int>(parseInt(n, v, 0, 65535)); });
  ifSet("RCOLL_WATCH_INTERVAL", [&](const char* n, S v) { c.watch_interval = parseSeconds(n, v, true); });
  ifSet("RCOLL_STRAGGLER_MS",
        [&](const char* n, S v) { c.straggler_ms = static_cast<int>(parseInt(n, v, 1, 3600000)); });
  ifSet("RCOLL_SLOW_LINK_RATIO",
        [&](const char* n, S v) { c.slow_link_ratio = static_cast<int>(parseInt(n, v, 2, 1000000)); });
  ifSet("RCOLL_DEVICE_RUNTIME", [&](const char*, S v) { c.device_runtime = v; });
  ifSet("RCOLL_CONNECT_TIMEOUT", [&](const char* n, S v) { c.connect_timeout = parseSeconds(n, v, false); });
  ifSet("RCOLL_PEER_TIMEOUT", [&](const char* n, S v) { c.peer_timeout = parseSeconds(n, v, true); });
  ifSet("RCOLL_TIMEOUT", [&](const char* n, S v) { c.timeout = parseSeconds(n, v, false); });
  ifSet("RCOLL_SHUTDOWN_TIMEOUT", [&](const char* n, S v) { c.shutdown_timeout = parseSeconds(n, v, true); });
  ifSet("RCOLL_ELASTIC_JOIN", [&](const char* n, S v) { c.elastic_join = parseFlag(n, v); });
  ifSet("RCOLL_HOROVOD_IDLE_CYCLE",
        [&](const char* n, S v) { c.horovod_idle_cycle = std::chrono::milliseconds(parseInt(n, v, 0, 60000)); });
  ifSet("RCOLL_HOROVOD_INLINE_BYTES",
        [&](const char* n, S v) { c.horovod_inline_bytes = static_cast<size_t>(parseInt(n, v, 0, 65536)); });
  return c;
}

std::string Config::describe() const {
  return strFormat(
      "transport=%s chunk_bytes=%zu min_chunk_bytes=%zu pipeline_slots=%d "
      "socket_buffer_bytes=%zu sockets_per_peer=%d socket_ifname=%s socket_family=%s",
      transport.c_str(), chunk_bytes, min_chunk_bytes, pipeline_slots, socket_buffer_bytes, sockets_per_peer,
      socket_ifname.empty() ? "(auto)" : socket_ifname.c_str(),
      socket_family.empty() ? "(both)" : socket_family.c_str());
}

}  // namespace rcoll
