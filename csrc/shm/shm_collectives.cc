#include "shm/shm_collectives.h"

#include <sched.h>

#include <algorithm>
#include <cstring>
#include <set>

#include "error.h"
#include "op_errors.h"
#include "reduce_kernels.h"

namespace rcoll {

namespace {

// Sleeps are bounded so that a lost wake-up (which the protocol rules out)
// could only ever cost this much, never a hang.
constexpr auto kMaxSleep = std::chrono::seconds(1);

std::atomic<uint64_t>& counterOf(shm::WindowControl* control, int which) {
  switch (which) {
    case 0:
      return control->arrived.value;
    case 1:
      return control->reduced.value;
    case 2:
      return control->finished.value;
    case 3:
      return control->device_published.value;
    default:
      return control->device_opened.value;
  }
}

// memcpy with a null pointer is undefined even for 0 bytes (empty ops pass null buffers).
void copyBytes(void* dst, const void* src, size_t bytes) {
  if (bytes > 0) std::memcpy(dst, src, bytes);
}

// current_op: seq << 8 | device << 7 | OpKind (kinds are < 128).
constexpr uint64_t kDeviceBit = 0x80;
uint64_t packOp(const OpDesc& op, bool device) {
  return op.seq << 8 | (device ? kDeviceBit : 0) | static_cast<uint64_t>(op.kind);
}

const char* memoryName(bool device) { return device ? "device (GPU)" : "host (CPU)"; }

std::string memoryMismatch(int peer, bool their_device, int rank, bool my_device) {
  return strFormat(
      "rank %d passed %s buffers and rank %d %s buffers: pass tensors of one kind (all CUDA or all CPU) "
      "on every rank",
      peer, memoryName(their_device), rank, memoryName(my_device));
}

OpDesc descToOp(const shm::StepDesc& d) {
  OpDesc op;
  op.kind = static_cast<OpKind>(d.kind);
  op.dtype = static_cast<DataType>(d.dtype);
  op.reduce_op = static_cast<ReduceOp>(d.reduce_op);
  op.root = d.root;
  op.count = d.count;
  op.seq = d.seq;
  return op;
}

}  // namespace

bool ShmCollectives::available(const ShmTransport& transport, int size) {
  if (size < 2 || transport.windowSlotBytes() < static_cast<size_t>(size) * 64) return false;
  for (int r = 0; r < size; ++r) {
    if (transport.window(r) == nullptr) return false;
  }
  return true;
}

bool ShmCollectives::handles(OpKind kind) {
  return kind == OpKind::kAllreduce || kind == OpKind::kAllgather || kind == OpKind::kReduceScatter ||
         kind == OpKind::kBroadcast || kind == OpKind::kBarrier;
}

ShmCollectives::ShmCollectives(ShmTransport& transport, int rank, int size, std::chrono::microseconds spin,
                               size_t direct_bytes)
    : transport_(transport),
      rank_(rank),
      size_(size),
      spin_(spin),
      slot_bytes_(transport.windowSlotBytes()),
      direct_bytes_(direct_bytes) {
  for (int r = 0; r < size; ++r) {
    windows_.push_back(transport.window(r));
    controls_.push_back(shm::windowControl(windows_.back()));
  }
  mine_ = controls_[static_cast<size_t>(rank)];
}

ShmCollectives::~ShmCollectives() = default;

void ShmCollectives::announce(const OpDesc& op, bool device) {
  mine_->current_op.value.store(packOp(op, device), std::memory_order_seq_cst);
  // A peer asleep in a window op must look: it may be waiting for this rank in vain.
  wakeSleepingPeers();
}

void ShmCollectives::wakeSleepingPeers() {
  for (int p = 0; p < size_; ++p) {
    if (p != rank_ && controls_[static_cast<size_t>(p)]->sleeping.bits.load(std::memory_order_seq_cst) != 0) {
      transport_.ringDoorbell(p);
    }
  }
}

void ShmCollectives::run(const OpDesc& op, const char* send, char* recv, Deadline deadline,
                         std::chrono::milliseconds timeout, const std::atomic<bool>& abort_flag) {
  first_completion_ = {};
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
    case OpKind::kBarrier:
      return barrier(ctx);
    default:
      throwError(ErrorKind::kGeneric,
                 strFormat("rank %d: %s is not a shared-window collective", rank_, describeOp(op).c_str()));
  }
}

// --- steps ---------------------------------------------------------------------

char* ShmCollectives::beginStep(const RunContext& run) {
  ++step_;
  // Slot step % 2 was last used by step - 2: every peer must be done reading it.
  if (step_ > 2) waitAll(run, Counter::kFinished, step_ - 2);
  shm::StepDesc& d = mine_->desc[step_ % 2];
  d.seq = run.op.seq;
  d.count = run.op.count;
  d.kind = static_cast<uint32_t>(run.op.kind);
  d.dtype = static_cast<uint32_t>(run.op.dtype);
  d.reduce_op = static_cast<uint32_t>(run.op.reduce_op);
  d.root = run.op.root;
  d.memory = run.device ? shm::kDeviceMemory : shm::kHostMemory;
  return slot(rank_);
}

void ShmCollectives::publish(Counter counter) {
  counterOf(mine_, static_cast<int>(counter)).store(step_, std::memory_order_seq_cst);
  wakeSleepingPeers();
}

void ShmCollectives::waitAll(const RunContext& run, Counter counter, uint64_t target) {
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    std::atomic<uint64_t>& value = counterOf(controls_[static_cast<size_t>(p)], static_cast<int>(counter));
    if (value.load(std::memory_order_acquire) >= target) continue;
    const auto spin_start = std::chrono::steady_clock::now();
    for (;;) {
      if (value.load(std::memory_order_acquire) >= target) break;
      // sched_yield(), not a pause loop: on an oversubscribed host it hands the
      // core to whoever is runnable, often the very peer this rank waits for.
      if (std::chrono::steady_clock::now() - spin_start < spin_) {
        sched_yield();
        continue;
      }
      // Announce the sleep, then look once more (shm_window.h): a peer that
      // publishes after this store sees it and rings the doorbell.
      mine_->sleeping.bits.store(1, std::memory_order_seq_cst);
      if (value.load(std::memory_order_seq_cst) >= target) {
        mine_->sleeping.bits.store(0, std::memory_order_relaxed);
        break;
      }
      try {
        checkPeer(run, p, counter, target);
        if (value.load(std::memory_order_seq_cst) < target) {
          transport_.sleepForWindows(std::min(run.deadline, std::chrono::steady_clock::now() + kMaxSleep));
        }
      } catch (...) {
        mine_->sleeping.bits.store(0, std::memory_order_relaxed);
        throw;
      }
      mine_->sleeping.bits.store(0, std::memory_order_relaxed);
    }
  }
}

void ShmCollectives::checkPeer(const RunContext& run, int peer, Counter counter, uint64_t target) {
  const OpDesc& op = run.op;
  if (run.abort_flag.load(std::memory_order_relaxed)) {
    throwError(ErrorKind::kAborted, strFormat("rank %d: %s (op #%llu) was aborted", rank_, describeOp(op).c_str(),
                                              static_cast<unsigned long long>(op.seq)));
  }
  // Any peer, not only the awaited one: a rank that died or aborted is the
  // cause to report, even while this rank still waits on another. But a peer
  // that already published what this wait needs may have finished its part
  // and gone: that alone is not a failure of this op.
  for (int p = 0; p < size_; ++p) {
    const TransportFailure* down = p == rank_ ? nullptr : transport_.peerDown(p);
    if (down == nullptr) continue;
    if (counterOf(controls_[static_cast<size_t>(p)], static_cast<int>(counter)).load(std::memory_order_seq_cst) >=
        target) {
      continue;
    }
    throwError(down->kind, opFailureMessage(rank_, op, down->message));
  }
  // Which op does the peer run? Loaded before the counter again: a peer
  // publishes its counter before it announces its next op, so a peer seen
  // past this op whose counter is still short really skipped it.
  const uint64_t current = controls_[static_cast<size_t>(peer)]->current_op.value.load(std::memory_order_seq_cst);
  std::atomic<uint64_t>& value = counterOf(controls_[static_cast<size_t>(peer)], static_cast<int>(counter));
  if (value.load(std::memory_order_seq_cst) >= target) return;
  const uint64_t their_seq = current >> 8;
  const auto their_kind = static_cast<OpKind>(current & (kDeviceBit - 1));
  const bool their_device = (current & kDeviceBit) != 0;
  if (their_seq == op.seq && their_kind != op.kind) {
    throwError(ErrorKind::kMismatch,
               opFailureMessage(rank_, op, differentCallsMessage(peer, opKindName(their_kind), their_seq, rank_, op)));
  }
  if (their_seq == op.seq && their_device != run.device) {
    throwError(ErrorKind::kMismatch,
               opFailureMessage(rank_, op, memoryMismatch(peer, their_device, rank_, run.device)));
  }
  if (their_seq > op.seq) {
    throwError(ErrorKind::kMismatch,
               opFailureMessage(rank_, op,
                                strFormat("rank %d finished op #%llu without this rank and went on to "
                                          "op #%llu (%s): the ranks called different collectives",
                                          peer, static_cast<unsigned long long>(op.seq),
                                          static_cast<unsigned long long>(their_seq), opKindName(their_kind))));
  }
  WireHeader header{};
  if (transport_.incomingMessage(peer, &header)) {
    const OpDesc theirs = opFromHeader(header);
    throwError(ErrorKind::kMismatch,
               opFailureMessage(rank_, op, differentCallsMessage(peer, describeOp(theirs), theirs.seq, rank_, op)));
  }
  if (std::chrono::steady_clock::now() >= run.deadline) {
    std::set<int> silent;
    for (int p = 0; p < size_; ++p) {
      if (p != rank_ && counterOf(controls_[static_cast<size_t>(p)], static_cast<int>(counter)).load() < target) {
        silent.insert(p);
      }
    }
    throwError(ErrorKind::kTimeout, opTimeoutMessage(rank_, op, run.timeout, silent, {},
                                                     "waiting for the ranks to finish with shared memory"));
  }
}

void ShmCollectives::checkDescriptors(const RunContext& run) {
  const OpDesc& op = run.op;
  for (int p = 0; p < size_; ++p) {
    if (p == rank_) continue;
    const shm::StepDesc& d = controls_[static_cast<size_t>(p)]->desc[step_ % 2];
    const uint32_t memory = run.device ? shm::kDeviceMemory : shm::kHostMemory;
    if (d.seq == op.seq && d.count == op.count && d.kind == static_cast<uint32_t>(op.kind) &&
        d.dtype == static_cast<uint32_t>(op.dtype) && d.reduce_op == static_cast<uint32_t>(op.reduce_op) &&
        d.root == op.root) {
      if (d.memory == memory) continue;
      throwError(ErrorKind::kMismatch,
                 opFailureMessage(rank_, op, memoryMismatch(p, d.memory == shm::kDeviceMemory, rank_, run.device)));
    }
    const OpDesc theirs = descToOp(d);
    throwError(ErrorKind::kMismatch,
               opFailureMessage(rank_, op, differentCallsMessage(p, describeOp(theirs), theirs.seq, rank_, op)));
  }
  if (first_completion_ == std::chrono::steady_clock::time_point{}) {
    first_completion_ = std::chrono::steady_clock::now();
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
  const size_t per_step = slot_bytes_ / es;
  const size_t P = static_cast<size_t>(size_);
  // Slices start on cache-line boundaries so that no two ranks write one line.
  const size_t align = std::max<size_t>(1, 64 / es);
  size_t done = 0;
  do {  // at least one step, for a count of 0 too: the descriptors still meet
    const size_t n = std::min(per_step, total - done);
    char* mine = beginStep(run);
    char* out = recv + done * es;
    const char* in = send + done * es;
    // Small steps: every rank reduces the whole step (one hand-off, and reading
    // a few windows costs less than a second one). Large: a slice each.
    const bool direct = n * es * P <= direct_bytes_;
    auto slice = [&](size_t r, size_t* lo, size_t* len) { sliceOfStep(n, P, r, align, lo, len); };
    size_t my_lo = 0, my_len = n;
    if (!direct) slice(static_cast<size_t>(rank_), &my_lo, &my_len);
    if (direct) {
      copyBytes(mine, in, n * es);
    } else {  // the others need every slice of this rank's input but its own
      copyBytes(mine, in, my_lo * es);
      copyBytes(mine + (my_lo + my_len) * es, in + (my_lo + my_len) * es, (n - my_lo - my_len) * es);
    }
    publish(Counter::kArrived);
    waitAll(run, Counter::kArrived, step_);
    checkDescriptors(run);
    if (direct) {
      // out = slot(0) op slot(1) op ... op slot(P-1), in rank order on every rank.
      reduceWindows(op, out, nullptr, 0, n);
    } else {
      // Slice my_lo of this rank's own input straight from `in` (which `out`
      // may alias: then it is the first operand, read before it is written).
      // One rank computes each slice, so every rank still gets the same bits.
      reduceWindows(op, out + my_lo * es, in + my_lo * es, my_lo * es, my_len);
      copyBytes(mine + my_lo * es, out + my_lo * es, my_len * es);  // this rank's share, for the others to copy
      publish(Counter::kReduced);
      waitAll(run, Counter::kReduced, step_);
      for (int r = 0; r < size_; ++r) {
        if (r == rank_) continue;
        size_t lo = 0, len = 0;
        slice(static_cast<size_t>(r), &lo, &len);
        copyBytes(out + lo * es, slot(r) + lo * es, len * es);
      }
    }
    publish(Counter::kFinished);
    done += n;
  } while (done < total);
}

void ShmCollectives::allgather(const RunContext& run, const char* send, char* recv) {
  const size_t es = elementSize(run.op.dtype);
  const size_t total = run.op.count;  // per rank
  char* own = recv + static_cast<size_t>(rank_) * total * es;
  if (send != own) std::memmove(own, send, total * es);  // then in place: own block is the input
  const size_t per_step = slot_bytes_ / es;
  size_t done = 0;
  do {
    const size_t n = std::min(per_step, total - done);
    char* mine = beginStep(run);
    copyBytes(mine, own + done * es, n * es);
    publish(Counter::kArrived);
    waitAll(run, Counter::kArrived, step_);
    checkDescriptors(run);
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) copyBytes(recv + (static_cast<size_t>(r) * total + done) * es, slot(r), n * es);
    }
    publish(Counter::kFinished);
    done += n;
  } while (done < total);
}

void ShmCollectives::reduceScatter(const RunContext& run, const char* send, char* recv) {
  const OpDesc& op = run.op;
  const size_t es = elementSize(op.dtype);
  const size_t total = op.count;  // per rank: send holds size * total elements
  const size_t P = static_cast<size_t>(size_);
  const size_t per_step = slot_bytes_ / (es * P);  // >= 1: available() asks for slot >= 64 * size
  const size_t me = static_cast<size_t>(rank_);
  size_t done = 0;
  do {
    const size_t n = std::min(per_step, total - done);
    char* mine = beginStep(run);
    // Slot layout of a step: block j's n elements at j * n. A recv that aliases
    // a send block is only written where this step has already copied from.
    for (size_t j = 0; j < P; ++j) copyBytes(mine + j * n * es, send + (j * total + done) * es, n * es);
    publish(Counter::kArrived);
    waitAll(run, Counter::kArrived, step_);
    checkDescriptors(run);
    reduceWindows(op, recv + done * es, nullptr, me * n * es, n);
    publish(Counter::kFinished);
    done += n;
  } while (done < total);
}

void ShmCollectives::broadcast(const RunContext& run, const char* send, char* recv) {
  const size_t es = elementSize(run.op.dtype);
  const size_t total = run.op.count;
  const int root = static_cast<int>(run.op.root);
  if (rank_ == root && send != recv) std::memmove(recv, send, total * es);
  const size_t per_step = slot_bytes_ / es;
  size_t done = 0;
  do {
    const size_t n = std::min(per_step, total - done);
    char* mine = beginStep(run);
    if (rank_ == root) copyBytes(mine, recv + done * es, n * es);
    publish(Counter::kArrived);
    waitAll(run, Counter::kArrived, step_);
    checkDescriptors(run);
    if (rank_ != root) copyBytes(recv + done * es, slot(root), n * es);
    publish(Counter::kFinished);
    done += n;
  } while (done < total);
}

void ShmCollectives::barrier(const RunContext& run) {
  beginStep(run);
  publish(Counter::kArrived);
  waitAll(run, Counter::kArrived, step_);
  checkDescriptors(run);
  publish(Counter::kFinished);
}

}  // namespace rcoll
