#include "config.h"

#include <cctype>
#include <cstdlib>

#include "error.h"

namespace rcoll {

const std::vector<ConfigVar>& configVars() {
  static const std::vector<ConfigVar> vars = {
      {"RCOLL_DEBUG", "WARN", "log level: WARN, INFO or TRACE (NONE silences warnings)"},
      {"RCOLL_TRANSPORT", "auto", "data transport, chosen per pair of ranks: auto (shared memory between ranks "
                                  "of one host, and between hosts verbs when every rank that talks to another "
                                  "host has an active RDMA port, else TCP), shm (every rank on one host, or an "
                                  "error), ib or tcp (that transport on every pair)"},
      {"RCOLL_SHM_DISABLE", "0", "1: never use shared memory (auto then picks verbs or TCP)"},
      {"RCOLL_HOSTID", "", "this rank's host identity (default: boot id and network namespace); ranks with "
                           "the same value use shared memory with each other, so it must name one machine"},
      {"RCOLL_SHM_COLL", "1", "1: when every rank is on one host, allreduce, allgather, reduce_scatter, broadcast "
                              "and barrier go through shared windows (each rank publishes its data once and the "
                              "others read and reduce it in place) instead of the ring; 0: the ring over shared "
                              "memory; rank 0's value is used by every rank"},
      {"RCOLL_SHM_COLL_SLOT_BYTES", "1M", "each rank's shared-window slot (it has two): larger ops go through in "
                                          "steps of this size (4K to 1G; rank 0's value is used by every rank)"},
      {"RCOLL_SHM_COLL_DIRECT_BYTES", "256K", "shared-window allreduce: while a step's bytes times the number "
                                              "of ranks stay within this, every rank reduces the whole step "
                                              "itself (one hand-off); above it each rank reduces its slice and "
                                              "the others copy it (each byte read once); rank 0's value is used"},
      {"RCOLL_CUDA_IPC", "1", "CUDA buffers of ranks that all share one host go device to device through "
                              "CUDA IPC windows (reduced on the GPU); 0 stages them through pinned host "
                              "memory; rank 0's value is used by every rank"},
      {"RCOLL_CUDA_IPC_SLOT_BYTES", "16M", "device memory per CUDA IPC window slot (two per rank); larger ops "
                                           "run in steps of this size (4K to 1G; rank 0's value is used)"},
      {"RCOLL_CUDA_IPC_DIRECT_BYTES", "1M", "CUDA IPC allreduce: while a step's bytes times the number of "
                                            "ranks stay within this, every rank reduces the whole step (one "
                                            "hand-off); above it each reduces a slice; rank 0's value is used"},
      {"RCOLL_GDR", "auto", "GPUDirect RDMA: CUDA buffers sent over verbs go between GPU memory and the NIC "
                            "without a copy through host memory (the GPU's memory registered as a dma-buf, "
                            "else through nvidia-peermem). auto uses it where the GPU, driver and NIC allow "
                            "and stages through pinned host memory otherwise (a WARN says why); 1 makes "
                            "its absence an error; 0 always stages. Each rank decides for itself"},
      {"RCOLL_SHM_RING_BYTES", "4M", "shared-memory ring per direction and pair of ranks (4K to 1G)"},
      {"RCOLL_SOCKET_IFNAME", "", "network interface whose IPv4 address data sockets bind to "
                                  "(default: the address that reaches the rendezvous store)"},
      {"RCOLL_SOCKET_BUFFER_BYTES", "0", "SO_SNDBUF/SO_RCVBUF for data sockets; 0 keeps the "
                                         "kernel's autotuning, which usually grows larger"},
      {"RCOLL_SOCKETS_PER_PEER", "1", "TCP connections between each pair of ranks (1 to 16); a collective's "
                                      "segments to a peer take turns on them, so a fast NIC is not bound by "
                                      "what one stream (one core's copies) carries. Point-to-point traffic "
                                      "keeps one; rank 0's value is used by every rank"},
      {"RCOLL_CHUNK_BYTES", "1M", "largest pipeline segment of the ring algorithms"},
      {"RCOLL_MIN_CHUNK_BYTES", "64K", "smallest segment the ring cuts a block into for overlap"},
      {"RCOLL_PIPELINE_SLOTS", "8", "staging segments that may be in flight per operation"},
      {"RCOLL_CONNECT_TIMEOUT", "300", "seconds to wait for peers during rendezvous"},
      {"RCOLL_TIMEOUT", "1800", "default per-operation timeout in seconds (numpy API)"},
      {"RCOLL_IB_HCA", "", "RDMA devices/ports to use, NCCL-style: mlx5_0:1,mlx5_1 picks, ^mlx5_1 "
                           "excludes, =name matches exactly (default: the first active port)"},
      {"RCOLL_IB_GID_INDEX", "", "RoCE GID index (default: scan the table, prefer RoCE v2 with an "
                                 "IPv4-mapped address, skip link-local and empty entries)"},
      {"RCOLL_IB_TIMEOUT", "16", "RC ack timeout exponent: 4.096 us * 2^value per retry (the verbs "
                                 "RC timeout attribute)"},
      {"RCOLL_IB_RETRY_CNT", "7", "RC transport retries before a peer is declared unreachable"},
      {"RCOLL_IB_MR_CACHE_BYTES", "4G", "registered memory the registration cache may keep pinned "
                                        "while unused; 0 registers per operation"},
      {"RCOLL_IBVERBS_LIB", "", "libibverbs to dlopen (default: libibverbs.so.1, then libibverbs.so)"},
      {"RCOLL_TIMELINE", "", "write a Chrome trace of every op (queue, wait for peers, transfer, reduce) to "
                             "<value>.rank<N>.json (a process's later communicators, e.g. torch "
                             "sub-groups: <value>.rank<N>.comm<K>.json); open in chrome://tracing or "
                             "ui.perfetto.dev"},
      {"RCOLL_ALLREDUCE_RD_BYTES", "32K", "allreduce buffers up to this size use recursive doubling "
                                         "(log2(P) exchanges of the whole buffer) instead of the ring; "
                                         "0 always uses the ring; rank 0's value is used by every rank"},
      {"RCOLL_SPIN_US", "50", "microseconds a waiting rank busy-polls its connections (yielding the core "
                              "between polls) before it sleeps; 0 sleeps at once (lowest CPU use, higher latency)"},
      {"RCOLL_SHUTDOWN_TIMEOUT", "10", "seconds shutdown() lets pending operations finish before aborting them"},
      {"RCOLL_TESTING_EMULATE_DEVICE_ID", "emulated:0", "tests only: the emulated GPU's identity; ranks with "
                                                        "different ones have no peer access (CUDA IPC falls back)"},
      {"RCOLL_TESTING_EMULATE_DEVICE", "0", "tests only: 1 runs GPU-buffer collectives on a host-memory emulation "
                                            "of the device runtime (checks rcoll's staging, not CUDA)"},
  };
  return vars;
}

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
    ok = scale != 0 && pos == value.size();
  }
  if (!ok) {
    throwError(ErrorKind::kConfig,
               strFormat("%s=%s is not a byte size (examples: 65536, 64K, 4M)", name.c_str(), value.c_str()));
  }
  return static_cast<size_t>(number * scale);
}

namespace {
// A window slot size: 4K to 1G, rounded up to `align` bytes.
size_t parseSlotBytes(const char* name, const char* value, size_t align) {
  const size_t bytes = parseByteSize(name, value);
  if (bytes < 4096 || bytes > (size_t{1} << 30)) {
    throwError(ErrorKind::kConfig, strFormat("%s=%s must be between 4K and 1G", name, value));
  }
  return (bytes + align - 1) / align * align;
}
}  // namespace

static const char* envOrNull(const char* name) {
  const char* value = std::getenv(name);
  return (value != nullptr && *value != '\0') ? value : nullptr;
}

static long parseInt(const char* name, const char* value, long lo, long hi) {
  char* end = nullptr;
  long parsed = std::strtol(value, &end, 10);
  if (end == value || *end != '\0' || parsed < lo || parsed > hi) {
    throwError(ErrorKind::kConfig,
               strFormat("%s=%s must be an integer in [%ld, %ld]", name, value, lo, hi));
  }
  return parsed;
}

Config Config::fromEnvironment() {
  Config config;
  if (const char* v = envOrNull("RCOLL_CHUNK_BYTES")) config.chunk_bytes = parseByteSize("RCOLL_CHUNK_BYTES", v);
  if (const char* v = envOrNull("RCOLL_MIN_CHUNK_BYTES")) {
    config.min_chunk_bytes = parseByteSize("RCOLL_MIN_CHUNK_BYTES", v);
  }
  if (config.chunk_bytes < 64 || config.chunk_bytes > (1ull << 30)) {
    throwError(ErrorKind::kConfig, "RCOLL_CHUNK_BYTES must be between 64 bytes and 1G");
  }
  if (config.min_chunk_bytes < 64 || config.min_chunk_bytes > config.chunk_bytes) {
    throwError(ErrorKind::kConfig, "RCOLL_MIN_CHUNK_BYTES must be between 64 bytes and RCOLL_CHUNK_BYTES");
  }
  if (const char* v = envOrNull("RCOLL_PIPELINE_SLOTS")) {
    config.pipeline_slots = static_cast<int>(parseInt("RCOLL_PIPELINE_SLOTS", v, 1, 256));
  }
  if (const char* v = envOrNull("RCOLL_ALLREDUCE_RD_BYTES")) {
    config.allreduce_rd_bytes = parseByteSize("RCOLL_ALLREDUCE_RD_BYTES", v);
  }
  if (const char* v = envOrNull("RCOLL_SPIN_US")) {
    config.spin = std::chrono::microseconds(parseInt("RCOLL_SPIN_US", v, 0, 1000000));
  }
  if (const char* v = envOrNull("RCOLL_SOCKET_BUFFER_BYTES")) {
    config.socket_buffer_bytes = parseByteSize("RCOLL_SOCKET_BUFFER_BYTES", v);
  }
  if (const char* v = envOrNull("RCOLL_SOCKETS_PER_PEER")) {
    config.sockets_per_peer = static_cast<int>(parseInt("RCOLL_SOCKETS_PER_PEER", v, 1, 16));
  }
  if (const char* v = envOrNull("RCOLL_SOCKET_IFNAME")) config.socket_ifname = v;
  if (const char* v = envOrNull("RCOLL_TRANSPORT")) {
    config.transport = v;
    if (config.transport != "auto" && config.transport != "tcp" && config.transport != "ib" &&
        config.transport != "shm") {
      throwError(ErrorKind::kConfig,
                 strFormat("RCOLL_TRANSPORT=%s is not a transport (use auto, shm, ib or tcp)", v));
    }
  }
  if (const char* v = envOrNull("RCOLL_SHM_DISABLE")) {
    config.shm_disable = parseInt("RCOLL_SHM_DISABLE", v, 0, 1) == 1;
  }
  if (const char* v = envOrNull("RCOLL_SHM_COLL")) config.shm_coll = parseInt("RCOLL_SHM_COLL", v, 0, 1) == 1;
  if (const char* v = envOrNull("RCOLL_SHM_COLL_SLOT_BYTES")) {
    config.shm_coll_slot_bytes = parseSlotBytes("RCOLL_SHM_COLL_SLOT_BYTES", v, 64);
  }
  if (const char* v = envOrNull("RCOLL_SHM_COLL_DIRECT_BYTES")) {
    config.shm_coll_direct_bytes = parseByteSize("RCOLL_SHM_COLL_DIRECT_BYTES", v);
  }
  if (const char* v = envOrNull("RCOLL_CUDA_IPC")) config.cuda_ipc = parseInt("RCOLL_CUDA_IPC", v, 0, 1) == 1;
  if (const char* v = envOrNull("RCOLL_CUDA_IPC_SLOT_BYTES")) {
    config.cuda_ipc_slot_bytes = parseSlotBytes("RCOLL_CUDA_IPC_SLOT_BYTES", v, 256);
  }
  if (const char* v = envOrNull("RCOLL_CUDA_IPC_DIRECT_BYTES")) {
    config.cuda_ipc_direct_bytes = parseByteSize("RCOLL_CUDA_IPC_DIRECT_BYTES", v);
  }
  if (const char* v = envOrNull("RCOLL_GDR")) {
    const std::string g = v;
    if (g == "auto") {
      config.gdr = Config::Gdr::kAuto;
    } else if (g == "0" || g == "1") {
      config.gdr = g == "1" ? Config::Gdr::kOn : Config::Gdr::kOff;
    } else {
      throwError(ErrorKind::kConfig, strFormat("RCOLL_GDR=%s is not a choice (use auto, 0 or 1)", v));
    }
  }
  if (const char* v = envOrNull("RCOLL_HOSTID")) config.host_id = v;
  if (const char* v = envOrNull("RCOLL_IB_HCA")) config.ib_hca = v;
  if (const char* v = envOrNull("RCOLL_IB_GID_INDEX")) {
    config.ib_gid_index = static_cast<int>(parseInt("RCOLL_IB_GID_INDEX", v, 0, 65535));
  }
  if (const char* v = envOrNull("RCOLL_IB_TIMEOUT")) {
    config.ib_timeout = static_cast<int>(parseInt("RCOLL_IB_TIMEOUT", v, 1, 31));
  }
  if (const char* v = envOrNull("RCOLL_IB_RETRY_CNT")) {
    config.ib_retry_cnt = static_cast<int>(parseInt("RCOLL_IB_RETRY_CNT", v, 0, 7));
  }
  if (const char* v = envOrNull("RCOLL_IB_MR_CACHE_BYTES")) {
    config.ib_mr_cache_bytes = parseByteSize("RCOLL_IB_MR_CACHE_BYTES", v);
  }
  if (const char* v = envOrNull("RCOLL_CONNECT_TIMEOUT")) {
    config.connect_timeout = std::chrono::seconds(parseInt("RCOLL_CONNECT_TIMEOUT", v, 1, 86400));
  }
  return config;
}

std::string Config::describe() const {
  return strFormat("transport=%s chunk_bytes=%zu min_chunk_bytes=%zu pipeline_slots=%d "
                   "socket_buffer_bytes=%zu sockets_per_peer=%d socket_ifname=%s",
                   transport.c_str(), chunk_bytes, min_chunk_bytes, pipeline_slots,
                   socket_buffer_bytes, sockets_per_peer, socket_ifname.empty() ? "(auto)" : socket_ifname.c_str());
}

}  // namespace rcoll
