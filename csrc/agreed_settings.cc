#include "agreed_settings.h"

#include <sys/random.h>

#include <cerrno>
#include <cstring>

#include "error.h"
#include "log.h"
#include "socket_util.h"

namespace rcoll {

namespace {

struct AgreedSetting {
  const char* variables;  // as the warning names them
  uint64_t (*value)(const Config&);
  void (*adopt)(Config&, uint64_t);
};

// A window setting whose slot size 0 means "off" travels as one number.
const AgreedSetting kAgreedSettings[kAgreedSettingCount] = {
    {"RCOLL_CHUNK_BYTES", [](const Config& c) -> uint64_t { return c.chunk_bytes; },
     [](Config& c, uint64_t v) { c.chunk_bytes = v; }},
    {"RCOLL_MIN_CHUNK_BYTES", [](const Config& c) -> uint64_t { return c.min_chunk_bytes; },
     [](Config& c, uint64_t v) { c.min_chunk_bytes = v; }},
    {"RCOLL_ALLREDUCE_RD_BYTES", [](const Config& c) -> uint64_t { return c.allreduce_rd_bytes; },
     [](Config& c, uint64_t v) { c.allreduce_rd_bytes = v; }},
    {"RCOLL_ALGO", [](const Config& c) -> uint64_t { return static_cast<uint64_t>(c.algo); },
     [](Config& c, uint64_t v) { c.algo = static_cast<Config::Algo>(v); }},
    {"RCOLL_SHM_COLL/RCOLL_SHM_COLL_SLOT_BYTES (0: off)",
     [](const Config& c) -> uint64_t { return c.shm_coll ? c.shm_coll_slot_bytes : 0; },
     [](Config& c, uint64_t v) {
       c.shm_coll = v > 0;
       if (v > 0) c.shm_coll_slot_bytes = v;
     }},
    {"RCOLL_SHM_COLL_DIRECT_BYTES", [](const Config& c) -> uint64_t { return c.shm_coll_direct_bytes; },
     [](Config& c, uint64_t v) { c.shm_coll_direct_bytes = v; }},
    {"RCOLL_CUDA_IPC/RCOLL_CUDA_IPC_SLOT_BYTES (0: off)",
     [](const Config& c) -> uint64_t { return c.cuda_ipc ? c.cuda_ipc_slot_bytes : 0; },
     [](Config& c, uint64_t v) {
       c.cuda_ipc = v > 0;
       if (v > 0) c.cuda_ipc_slot_bytes = v;
     }},
    {"RCOLL_CUDA_IPC_DIRECT_BYTES", [](const Config& c) -> uint64_t { return c.cuda_ipc_direct_bytes; },
     [](Config& c, uint64_t v) { c.cuda_ipc_direct_bytes = v; }},
    // Which device ops across hosts take the windows (their wire differs from staging's).
    {"RCOLL_CUDA_IPC_HOSTS_MIN_BYTES", [](const Config& c) -> uint64_t { return c.cuda_ipc_hosts_min_bytes; },
     [](Config& c, uint64_t v) { c.cuda_ipc_hosts_min_bytes = v; }},
    // Both ends of a pair must open the same number of sockets.
    {"RCOLL_SOCKETS_PER_PEER", [](const Config& c) -> uint64_t { return static_cast<uint64_t>(c.sockets_per_peer); },
     [](Config& c, uint64_t v) { c.sockets_per_peer = static_cast<int>(v); }},
    // Both ends of a pair must open sockets on the same networks.
    {"RCOLL_SOCKET_STRIPE", [](const Config& c) -> uint64_t { return c.socket_stripe ? 1 : 0; },
     [](Config& c, uint64_t v) { c.socket_stripe = v != 0; }},
    // A rank that connects at start-up would wait for a peer that connects on first use.
    {"RCOLL_RUNTIME_CONNECT", [](const Config& c) -> uint64_t { return c.runtime_connect ? 1 : 0; },
     [](Config& c, uint64_t v) { c.runtime_connect = v != 0; }},
    // rcoll.horovod's cached rounds gather records of this size (agreed_reduce.h).
    {"RCOLL_HOROVOD_INLINE_BYTES", [](const Config& c) -> uint64_t { return c.horovod_inline_bytes; },
     [](Config& c, uint64_t v) { c.horovod_inline_bytes = static_cast<size_t>(v); }},
};

void fillRandom(void* out, size_t bytes) {
  auto* p = static_cast<uint8_t*>(out);
  while (bytes > 0) {
    ssize_t n = getrandom(p, bytes, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throwError(ErrorKind::kGeneric, "getrandom(): " + errnoText(errno));
    }
    p += n;
    bytes -= static_cast<size_t>(n);
  }
}

}  // namespace

JobInfo newJob(const Config& config, int size) {
  JobInfo job{};
  fillRandom(job.token, sizeof(job.token));
  fillRandom(&job.comm_id, sizeof(job.comm_id));
  job.size = static_cast<uint32_t>(size);
  for (int i = 0; i < kAgreedSettingCount; ++i) job.settings[i] = kAgreedSettings[i].value(config);
  return job;
}

std::vector<uint8_t> encodeJob(const JobInfo& job) {
  std::vector<uint8_t> bytes(sizeof(job));
  std::memcpy(bytes.data(), &job, sizeof(job));
  return bytes;
}

JobInfo decodeJob(const std::vector<uint8_t>& bytes, int rank, int size) {
  JobInfo job{};
  if (bytes.size() != sizeof(job)) {
    throwError(ErrorKind::kConfig, strFormat("rank %d: rank 0 published job information of another rcoll version "
                                             "(%zu bytes); install the same rcoll on every rank",
                                             rank, bytes.size()));
  }
  std::memcpy(&job, bytes.data(), sizeof(job));
  if (job.size != static_cast<uint32_t>(size)) {
    throwError(ErrorKind::kConfig,
               strFormat("rank %d was started with world size %d but rank 0 with %u", rank, size, job.size));
  }
  return job;
}

void adoptAgreedSettings(const JobInfo& job, Config& config) {
  for (int i = 0; i < kAgreedSettingCount; ++i) {
    const AgreedSetting& s = kAgreedSettings[i];
    const uint64_t mine = s.value(config);
    if (mine == job.settings[i]) continue;
    RCOLL_WARN("%s differs from rank 0's (this rank %llu, rank 0 %llu); using rank 0's", s.variables,
               static_cast<unsigned long long>(mine), static_cast<unsigned long long>(job.settings[i]));
    s.adopt(config, job.settings[i]);
  }
}

}  // namespace rcoll
