// Standalone tests for the parts of a communicator's set-up that need no
// peers: the topology every rank computes from the published hosts
// (csrc/topology.cc), the agreed settings (csrc/agreed_settings.cc) and the op
// table's checks (csrc/op_table.cc). Built and run by tests/test_cpp.py under
// ASan + UBSan. Exit status is nonzero on any failure.

#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "agreed_settings.h"
#include "error.h"
#include "op_table.h"
#include "topology.h"

using namespace rcoll;

namespace {

int gFailures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    ++gFailures;
    std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  }
}

std::vector<HostEntry> hostsOf(const std::vector<std::string>& identities) {
  std::vector<HostEntry> hosts;
  for (const std::string& id : identities) hosts.push_back(HostEntry{id, true});
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

}  // namespace

int main() {
  try {
    testTopology();
    testAgreedSettings();
    testOpChecks();
  } catch (const std::exception& e) {
    check(false, std::string("unexpected exception: ") + e.what());
  }
  if (gFailures) {
    std::fprintf(stderr, "test_setup_parts: %d failure(s)\n", gFailures);
    return 1;
  }
  std::printf("test_setup_parts: ok\n");
  return 0;
}
