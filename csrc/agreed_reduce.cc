#include "agreed_reduce.h"

#include <cstring>
#include <string>
#include <vector>

#include "communicator.h"
#include "error.h"
#include "op_kind.h"
#include "reduce_kernels.h"

namespace rcoll {
namespace {

// One rank's record in the allgather: [input (capacity, padded)] [Spec]
// [offer]. Every record is a multiple of 64 bytes, so each rank's input
// starts as aligned as the buffer (the kernels load unaligned anyway).
constexpr size_t kAlign = 64;

size_t roundUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// What a rank's input is: ranks that hand in the same tag must agree on it.
struct Spec {
  int64_t tag;
  uint64_t count;
  int32_t dtype, op;
  bool operator==(const Spec& o) const { return tag == o.tag && count == o.count && dtype == o.dtype && op == o.op; }
};

struct RecordLayout {
  size_t spec_at, offer_at, bytes;
  explicit RecordLayout(const AgreedReduceArgs& a)
      : spec_at(roundUp(a.payload_capacity)),
        offer_at(spec_at + sizeof(Spec)),
        bytes(roundUp(offer_at + a.offer_bytes)) {}
};

bool candidateSet(const uint8_t* vector, const AgreedReduceArgs& a, int64_t tag) {
  const size_t byte = a.candidates_at + static_cast<size_t>(tag) / 8;
  return byte < a.offer_bytes && (vector[byte] >> (tag % 8) & 1) != 0;
}

// A tag whose input this rank cannot hand in: every rank learns it from the
// records, so every rank raises, and none waits for a collective this rank left.
constexpr int64_t kRefusedTag = -2;

// Why this rank cannot hand in its input under its tag, or "".
std::string inputProblem(const AgreedReduceArgs& a) {
  if (a.tag < 0) return "";
  if (static_cast<size_t>(a.tag) >= (a.offer_bytes - a.candidates_at) * 8) {
    return "tag " + std::to_string(a.tag) + " has no candidate bit";
  }
  if (a.count * elementSize(a.dtype) > a.payload_capacity) {
    return std::to_string(a.count * elementSize(a.dtype)) + " bytes of input do not fit the " +
           std::to_string(a.payload_capacity) + " set aside";
  }
  return reduceUnsupportedReason(a.dtype, a.op);
}

}  // namespace

bool agreeAndReduce(Communicator& comm, const AgreedReduceArgs& a) {
  const std::string who = "rank " + std::to_string(comm.rank()) + ": an agreed allreduce: ";
  if (a.candidates_at > a.offer_bytes) {  // the same on every rank: the caller's layout
    throwError(ErrorKind::kInvalidArgument,
               who + "the candidate bits start past the offer's " + std::to_string(a.offer_bytes) + " bytes");
  }
  const RecordLayout layout(a);
  const size_t world = static_cast<size_t>(comm.size());
  const bool short_gather = comm.topology().hosts() <= 1 || layout.bytes * world <= comm.config().allreduce_rd_bytes;
  if (a.agreement_only || a.payload_capacity == 0 || !short_gather) {
    comm.collective(OpKind::kAllreduce, a.offer, a.agreed, a.offer_bytes, DataType::kUInt8, ReduceOp::kBand, 0,
                    a.timeout, Launch::kCallerWaits)
        ->wait(std::chrono::milliseconds(-1));
    return false;
  }
  const std::string problem = inputProblem(a);
  const bool hands_in = a.tag >= 0 && problem.empty();
  const size_t input_bytes = hands_in ? a.count * elementSize(a.dtype) : 0;

  // Reused by the thread's next round: a negotiating front end runs one per op.
  thread_local std::vector<uint8_t> mine, everyone;
  mine.assign(layout.bytes, 0);
  everyone.resize(layout.bytes * world);
  if (input_bytes > 0) std::memcpy(mine.data(), a.input, input_bytes);
  const Spec spec = hands_in ? Spec{a.tag, a.count, static_cast<int32_t>(a.dtype), static_cast<int32_t>(a.op)}
                             : Spec{problem.empty() ? -1 : kRefusedTag, 0, 0, 0};
  std::memcpy(mine.data() + layout.spec_at, &spec, sizeof spec);
  std::memcpy(mine.data() + layout.offer_at, a.offer, a.offer_bytes);
  comm.collective(OpKind::kAllgather, mine.data(), everyone.data(), layout.bytes, DataType::kUInt8, ReduceOp::kSum, 0,
                  a.timeout, Launch::kCallerWaits)
      ->wait(std::chrono::milliseconds(-1));

  auto record = [&](size_t r) { return everyone.data() + r * layout.bytes; };
  std::memcpy(a.agreed, record(0) + layout.offer_at, a.offer_bytes);
  bool same_tag = hands_in;
  Spec theirs[2];  // rank 0's, then each other rank's in turn
  std::memcpy(&theirs[0], record(0) + layout.spec_at, sizeof(Spec));
  int odd_rank = -1;      // a rank whose input differs from rank 0's under the same tag
  int refused_rank = -1;  // a rank that could not hand its input in
  for (size_t r = 0; r < world; ++r) {
    const uint8_t* offer = record(r) + layout.offer_at;
    for (size_t i = 0; i < a.offer_bytes; ++i) a.agreed[i] &= offer[i];
    std::memcpy(&theirs[1], record(r) + layout.spec_at, sizeof(Spec));
    same_tag = same_tag && theirs[1].tag == a.tag;
    if (odd_rank < 0 && !(theirs[1] == theirs[0])) odd_rank = static_cast<int>(r);
    if (refused_rank < 0 && theirs[1].tag == kRefusedTag) refused_rank = static_cast<int>(r);
  }
  if (refused_rank >= 0) {
    throwError(
        ErrorKind::kInvalidArgument,
        who + (problem.empty() ? "rank " + std::to_string(refused_rank) + " could not hand in its input" : problem));
  }
  if (same_tag && odd_rank >= 0) {
    // Every rank sees the same records, so every rank raises this. The front
    // end's agreement said these are one op: inputs that differ are a bug.
    std::memcpy(&theirs[1], record(static_cast<size_t>(odd_rank)) + layout.spec_at, sizeof(Spec));
    auto describe = [](const Spec& s) {
      return std::to_string(s.count) + " elements (dtype " + std::to_string(s.dtype) + ", op " + std::to_string(s.op) +
             ")";
    };
    throwError(ErrorKind::kInvalidArgument, who + "under tag " + std::to_string(a.tag) + " rank 0 handed in " +
                                                describe(theirs[0]) + ", rank " + std::to_string(odd_rank) + " " +
                                                describe(theirs[1]));
  }
  if (!same_tag || !candidateSet(a.agreed, a, a.tag)) return false;

  // Every rank holds every input: fold them in rank order, the same on each.
  if (input_bytes > 0) {
    std::memcpy(a.out, record(0), input_bytes);
    for (size_t r = 1; r < world; ++r) reduceInto(a.out, a.out, record(r), a.count, a.dtype, a.op);
    if (a.op == ReduceOp::kAvg) scaleDivide(a.out, a.count, a.dtype, world);
  }
  return true;
}

}  // namespace rcoll
