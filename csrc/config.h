// Tunables: every RCOLL_* environment variable is documented and parsed here.
//
// configVars() lists each one (name, default, meaning): `python -m rcoll info`
// prints it, and docs/environment.md is generated from it
// (`python -m rcoll info --environment-markdown`; tests/api/test_config.py checks the
// file is current). Config::fromEnvironment() reads the settings of a
// communicator, once, with one parser per kind of value; the few process-wide
// settings (log level, libibverbs path) are read through environmentValue(),
// which refuses a name that is not documented.
#pragma once

#include <chrono>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "socket_util.h"

namespace rcoll {

struct ConfigVar {
  const char* name;
  const char* default_value;
  const char* meaning;  // Markdown (`code` spans)
};
const std::vector<ConfigVar>& configVars();

// The raw value of a documented RCOLL_* variable ("" when unset or empty).
// Throws RcollError for a name configVars() does not list (a bug in rcoll).
std::string environmentValue(const char* name);

// Values of RCOLL_* variables for one communicator, which win over the
// environment (`rcoll.Communicator(settings={...})`, as NCCL's ncclConfig_t):
// ranks that share a process (threads, or several communicators) can differ.
using Settings = std::map<std::string, std::string>;

struct Config {
  size_t chunk_bytes = 1 << 20;          // RCOLL_CHUNK_BYTES: largest pipeline segment
  size_t min_chunk_bytes = 64 << 10;     // RCOLL_MIN_CHUNK_BYTES: smallest segment worth pipelining
  int pipeline_slots = 8;                // RCOLL_PIPELINE_SLOTS: staging segments in flight
  size_t allreduce_rd_bytes = 32 << 10;  // RCOLL_ALLREDUCE_RD_BYTES: recursive doubling up to this size
  enum class Algo { kAuto, kRing, kHierarchical };
  Algo algo = Algo::kAuto;             // RCOLL_ALGO: allreduce algorithm above the recursive doubling size
  std::chrono::microseconds spin{50};  // RCOLL_SPIN_US: busy-poll this long before sleeping
  size_t socket_buffer_bytes = 0;      // RCOLL_SOCKET_BUFFER_BYTES: 0 = kernel autotuning
  std::chrono::milliseconds peer_timeout{std::chrono::seconds(15)};  // RCOLL_PEER_TIMEOUT: 0 = the kernel's
  bool runtime_connect = true;      // RCOLL_RUNTIME_CONNECT: point-to-point connects across hosts on first use
  int sockets_per_peer = 1;         // RCOLL_SOCKETS_PER_PEER: TCP connections per pair (messages striped)
  std::string socket_ifname;        // RCOLL_SOCKET_IFNAME: interfaces for data sockets (net_interfaces.h)
  std::string socket_family;        // RCOLL_SOCKET_FAMILY: "" (both), AF_INET or AF_INET6
  bool socket_stripe = false;       // RCOLL_SOCKET_STRIPE: sockets on every shared network, turns between them
  int socket_networks = 1;          // not a variable: the networks the mesh spreads each pair's sockets over (mesh.cc)
  std::string transport = "auto";   // RCOLL_TRANSPORT: auto|shm|ib|tcp
  bool shm_disable = false;         // RCOLL_SHM_DISABLE=1: never shared memory
  size_t shm_ring_bytes = 4 << 20;  // RCOLL_SHM_RING_BYTES: per direction and pair, 4K-aligned
  bool shm_coll = true;             // RCOLL_SHM_COLL: collectives through shared windows (all ranks on one host)
  size_t shm_coll_slot_bytes = 1 << 20;         // RCOLL_SHM_COLL_SLOT_BYTES: each window slot (two per rank)
  size_t shm_coll_direct_bytes = 256 << 10;     // RCOLL_SHM_COLL_DIRECT_BYTES: see configVars()
  bool cuda_ipc = true;                         // RCOLL_CUDA_IPC: device buffers through CUDA IPC windows (one host)
  size_t cuda_ipc_slot_bytes = 16 << 20;        // RCOLL_CUDA_IPC_SLOT_BYTES: each device window slot (two per rank)
  size_t cuda_ipc_direct_bytes = 1 << 20;       // RCOLL_CUDA_IPC_DIRECT_BYTES: see configVars()
  size_t cuda_ipc_hosts_min_bytes = 128 << 10;  // RCOLL_CUDA_IPC_HOSTS_MIN_BYTES: see configVars()
  enum class Gdr { kOff, kAuto, kOn };
  Gdr gdr = Gdr::kAuto;    // RCOLL_GDR: GPUDirect RDMA for device buffers over verbs
  std::string host_id;     // RCOLL_HOSTID: this rank's host identity (edge_plan.h)
  std::string ib_hca;      // RCOLL_IB_HCA: device/port filter (rdma/ib_device.h)
  int ib_gid_index = -1;   // RCOLL_IB_GID_INDEX: -1 = choose automatically
  int ib_addr_family = 0;  // RCOLL_IB_ADDR_FAMILY: AF_INET, AF_INET6, or 0 (AF_UNSPEC: IPv4 where there is one)
  int ib_timeout = 16;     // RCOLL_IB_TIMEOUT: RC ack timeout exponent
  int ib_retry_cnt = 7;    // RCOLL_IB_RETRY_CNT
  size_t ib_mr_cache_bytes = size_t{4} << 30;      // RCOLL_IB_MR_CACHE_BYTES: unused registrations kept
  std::string timeline;                            // RCOLL_TIMELINE: trace file prefix ("" = no trace)
  size_t trace_buffer_size = 2000;                 // RCOLL_TRACE_BUFFER_SIZE: ops the flight recorder keeps (0 = off)
  std::string trace_dir;                           // RCOLL_TRACE_DIR: where it dumps ("" = only on request)
  std::chrono::milliseconds watch_interval{5000};  // RCOLL_WATCH_INTERVAL: status and dump round (0 = off)
  std::string stats_file;                          // RCOLL_STATS_FILE: the counters as JSON at exit ("" = not)
  int metrics_port = 0;                            // RCOLL_METRICS_PORT: Prometheus text on this port (0 = off)
  int straggler_ms = 50;                           // RCOLL_STRAGGLER_MS: lateness that names a straggler
  int slow_link_ratio = 4;                         // RCOLL_SLOW_LINK_RATIO: how far below the others a slow edge is
  std::string device_runtime = "rcoll._cuda";      // RCOLL_DEVICE_RUNTIME: module with device_api_capsule()
  // Durations in seconds, fractions allowed, the same in Python and C++.
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(300)};  // RCOLL_CONNECT_TIMEOUT
  std::chrono::milliseconds timeout{std::chrono::minutes(30)};           // RCOLL_TIMEOUT: per op
  std::chrono::milliseconds shutdown_timeout{std::chrono::seconds(10)};  // RCOLL_SHUTDOWN_TIMEOUT
  std::chrono::milliseconds horovod_idle_cycle{20};  // RCOLL_HOROVOD_IDLE_CYCLE (rcoll.horovod's controller)
  size_t horovod_inline_bytes = 256;                 // RCOLL_HOROVOD_INLINE_BYTES (agreed_reduce.h's capacity)
  bool elastic_join = false;  // RCOLL_ELASTIC_JOIN: rcoll.init() / hvd.init() join a running job (python/rcoll/grow.py)

  // Reads the environment, `overrides` first; throws RcollError(kConfig) naming
  // the variable on a bad value, and on an override that is not a documented
  // per-communicator variable (RCOLL_DEBUG, RCOLL_IBVERBS_LIB and
  // RCOLL_DEVICE_RUNTIME are per process).
  static Config fromEnvironment(const Settings& overrides = {});
  std::string describe() const;  // one line for the INFO log

  // How every connection to a peer is set up (peer_listener.h).
  SocketOptions socketOptions() const { return SocketOptions{socket_buffer_bytes, peer_timeout}; }
};

// "4M", "65536", "64k" -> bytes. Throws RcollError(kConfig) naming `name`.
size_t parseByteSize(const std::string& name, const std::string& value);

// An address-family setting (RCOLL_SOCKET_FAMILY, RCOLL_IB_ADDR_FAMILY): ""
// is AF_UNSPEC, AF_INET / ipv4 / 4 and AF_INET6 / ipv6 / 6 the families, -1
// anything else (each caller words its own error).
int addressFamilyNamed(const std::string& value);

}  // namespace rcoll
