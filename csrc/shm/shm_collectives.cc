#include "shm/shm_collectives.h"

#include <algorithm>
#include <cstring>

#include "error.h"
#include "reduce_kernels.h"

namespace rcoll {

namespace {

// memcpy with a null pointer is undefined even for 0 bytes (empty ops pass null buffers).
void copyBytes(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

}  // namespace

namespace {
std::vector<int> everyRank(int size) {
  std::vector<int> ranks(static_cast<size_t>(size));
  for (int r = 0; r < size; ++r) ranks[static_cast<size_t>(r)] = r;
  return ranks;
}
}  // namespace

bool ShmCollectives::available(const ShmTransport& transport, int size) {
  return WindowSteps::available(transport, everyRank(size));
}

ShmCollectives::ShmCollectives(ShmTransport& transport, int rank, int size, std::chrono::microseconds spin,
                               size_t direct_bytes)
    : steps_(transport, everyRank(size), rank, spin),
      rank_(rank),
      size_(size),
      slot_bytes_(transport.windowSlotBytes()),
      direct_bytes_(direct_bytes),
      ipc_(steps_) {}

ShmCollectives::~ShmCollectives() = default;

void ShmCollectives::run(const OpDesc& op, const char* send, char* recv, Deadline deadline,
                         std::chrono::milliseconds timeout, const std::atomic<bool>& abort_flag) {
  const RunContext ctx{op, deadline, timeout, abort_flag};
  switch (op.kind) {
    case OpKind::kAllreduce:
      return allreduce(ctx, send, recv);
    case OpKind::kAllgather:
      return allgather(ctx, send, recv);
    case OpKind::kReduceScatter:
      return reduceScatter(ctx, send, recv);
    case OpKind::kBroadcast:
      return broadcast(ctx, send, recv);
    case OpKind::kBarrier:  // the arrival counters alone
      return steps_.forEachStep(
          ctx, 0, 1, [](size_t, size_t) {}, [](size_t, size_t) {});
    default:
      throwError(ErrorKind::kGeneric,
                 strFormat("rank %d: %s is not a shared-window collective", rank_, describeOp(op).c_str()));
  }
}

// --- collectives -----------------------------------------------------------------

void ShmCollectives::reduceWindows(const OpDesc& op, char* out, const char* own, size_t offset, size_t count) {
  if (count == 0) return;
  const auto start = timeline_ != nullptr ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
  if (own == nullptr) {
    reduceInto(out, slot(0) + offset, slot(1) + offset, count, op.dtype, op.reduce_op);
    for (int r = 2; r < size_; ++r) reduceInto(out, out, slot(r) + offset, count, op.dtype, op.reduce_op);
  } else {
    bool first = true;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      reduceInto(out, first ? own : out, slot(r) + offset, count, op.dtype, op.reduce_op);
      first = false;
    }
  }
  if (op.reduce_op == ReduceOp::kAvg) scaleDivide(out, count, op.dtype, static_cast<size_t>(size_));
  if (timeline_ != nullptr) {
    timeline_->slice(0, "reduce", "reduce", start, std::chrono::steady_clock::now(),
                     strFormat("\"elements\": %zu, \"windows\": %d", count, size_));
  }
}

void ShmCollectives::allreduce(const RunContext& run, const char* send, char* recv) {
  const OpDesc& op = run.op;
  const size_t es = elementSize(op.dtype);
  const size_t total = op.count;
  if (send != recv && send < recv + total * es && recv < send + total * es) {
    std::memmove(recv, send, total * es);  // overlapping views: work in place
    send = recv;
  }
  const size_t P = static_cast<size_t>(size_);
  // Slices start on cache-line boundaries so that no two ranks write one line.
  const size_t align = std::max<size_t>(1, 64 / es);
  // Small steps: every rank reduces the whole step (one hand-off, and reading
  // a few windows costs less than a second one). Large: a slice each.
  auto direct = [&](size_t n) { return n * es * P <= direct_bytes_; };
  auto slice = [&](size_t n, size_t r, size_t* lo, size_t* len) { sliceOfStep(n, P, r, align, lo, len); };
  auto fill = [&](size_t done, size_t n) {
    char* mine = slot(rank_);
    const char* in = send + done * es;
    if (direct(n)) {
      copyBytes(mine, in, n * es);
      return;
    }
    // The others need every slice of this rank's input but its own.
    size_t my_lo = 0, my_len = 0;
    slice(n, static_cast<size_t>(rank_), &my_lo, &my_len);
    copyBytes(mine, in, my_lo * es);
    copyBytes(mine + (my_lo + my_len) * es, in + (my_lo + my_len) * es, (n - my_lo - my_len) * es);
  };
  auto consume = [&](size_t done, size_t n) {
    char* out = recv + done * es;
    const char* in = send + done * es;
    if (direct(n)) {
      // out = slot(0) op slot(1) op ... op slot(P-1), in rank order on every rank.
      reduceWindows(op, out, nullptr, 0, n);
      return;
    }
    // Slice my_lo of this rank's own input straight from `in` (which `out`
    // may alias: then it is the first operand, read before it is written).
    // One rank computes each slice, so every rank still gets the same bits.
    size_t my_lo = 0, my_len = 0;
    slice(n, static_cast<size_t>(rank_), &my_lo, &my_len);
    reduceWindows(op, out + my_lo * es, in + my_lo * es, my_lo * es, my_len);
    copyBytes(slot(rank_) + my_lo * es, out + my_lo * es, my_len * es);  // this rank's share, for the others
    steps_.exchange(run, Counter::kReduced);
    for (int r = 0; r < size_; ++r) {
      if (r == rank_) continue;
      size_t lo = 0, len = 0;
      slice(n, static_cast<size_t>(r), &lo, &len);
      copyBytes(out + lo * es, slot(r) + lo * es, len * es);
    }
  };
  steps_.forEachStep(run, total, slot_bytes_ / es, fill, consume);
}

void ShmCollectives::allgather(const RunContext& run, const char* send, char* recv) {
  const size_t es = elementSize(run.op.dtype);
  const size_t total = run.op.count;  // per rank
  char* own = recv + static_cast<size_t>(rank_) * total * es;
  if (send != own) std::memmove(own, send, total * es);  // then in place: own block is the input
  steps_.forEachStep(
      run, total, slot_bytes_ / es, [&](size_t done, size_t n) { copyBytes(slot(rank_), own + done * es, n * es); },
      [&](size_t done, size_t n) {
        for (int r = 0; r < size_; ++r) {
          if (r != rank_) copyBytes(recv + (static_cast<size_t>(r) * total + done) * es, slot(r), n * es);
        }
      });
}

void ShmCollectives::reduceScatter(const RunContext& run, const char* send, char* recv) {
  const OpDesc& op = run.op;
  const size_t es = elementSize(op.dtype);
  const size_t total = op.count;  // per rank: send holds size * total elements
  const size_t P = static_cast<size_t>(size_);
  const size_t me = static_cast<size_t>(rank_);
  // Slot layout of a step: block j's n elements at j * n. A recv that aliases
  // a send block is only written where this step has already copied from.
  steps_.forEachStep(
      run, total, slot_bytes_ / (es * P),  // >= 1: available() asks for slot >= 64 * size
      [&](size_t done, size_t n) {
        for (size_t j = 0; j < P; ++j) copyBytes(slot(rank_) + j * n * es, send + (j * total + done) * es, n * es);
      },
      [&](size_t done, size_t n) { reduceWindows(op, recv + done * es, nullptr, me * n * es, n); });
}

void ShmCollectives::broadcast(const RunContext& run, const char* send, char* recv) {
  const size_t es = elementSize(run.op.dtype);
  const size_t total = run.op.count;
  const int root = static_cast<int>(run.op.root);
  if (rank_ == root && send != recv) std::memmove(recv, send, total * es);
  steps_.forEachStep(
      run, total, slot_bytes_ / es,
      [&](size_t done, size_t n) {
        if (rank_ == root) copyBytes(slot(rank_), recv + done * es, n * es);
      },
      [&](size_t done, size_t n) {
        if (rank_ != root) copyBytes(recv + done * es, slot(root), n * es);
      });
}

}  // namespace rcoll
