#include "shm/window_steps.h"

#include <sched.h>

#include <set>
#include <string>

#include "error.h"
#include "op_errors.h"

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

bool WindowSteps::available(const ShmTransport& transport, const std::vector<int>& members) {
  if (members.size() < 2 || transport.windowSlotBytes() < members.size() * 64) return false;
  for (int r : members) {
    if (transport.window(r) == nullptr) return false;
  }
  return true;
}

WindowSteps::WindowSteps(ShmTransport& transport, std::vector<int> members, int rank, std::chrono::microseconds spin)
    : transport_(transport),
      members_(std::move(members)),
      rank_(rank),
      me_(indexOf(rank)),
      size_(static_cast<int>(members_.size())),
      spin_(spin),
      slot_bytes_(transport.windowSlotBytes()) {
  for (int r : members_) {
    windows_.push_back(transport.window(r));
    controls_.push_back(shm::windowControl(windows_.back()));
  }
  mine_ = controls_[static_cast<size_t>(me_)];
}

void WindowSteps::announce(const OpDesc& op, bool device) {
  mine_->current_op.value.store(packOp(op, device), std::memory_order_seq_cst);
  // A peer asleep in a window op must look: it may be waiting for this rank in vain.
  wakeSleepingPeers();
}

void WindowSteps::wakeSleepingPeers() {
  for (int p = 0; p < size_; ++p) {
    if (p != me_ && controls_[static_cast<size_t>(p)]->sleeping.bits.load(std::memory_order_seq_cst) != 0) {
      transport_.ringDoorbell(member(p));
    }
  }
}

void WindowSteps::beginStep(const RunContext& run) {
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
}

void WindowSteps::publish(Counter counter) {
  counterOf(mine_, static_cast<int>(counter)).store(step_, std::memory_order_seq_cst);
  wakeSleepingPeers();
}

void WindowSteps::waitAll(const RunContext& run, Counter counter, uint64_t target) {
  for (int p = 0; p < size_; ++p) {
    if (p == me_) continue;
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

void WindowSteps::checkPeer(const RunContext& run, int index, Counter counter, uint64_t target) {
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
    const TransportFailure* down = p == me_ ? nullptr : transport_.peerDown(member(p));
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
  const int peer = member(index);
  const uint64_t current = controls_[static_cast<size_t>(index)]->current_op.value.load(std::memory_order_seq_cst);
  std::atomic<uint64_t>& value = counterOf(controls_[static_cast<size_t>(index)], static_cast<int>(counter));
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
    // The peer may have finished this op, published its counter and sent its
    // next op's first message (an op over the transport: a full round's
    // alltoall after its allgather) since the load above: only a counter
    // still short after that message arrived means it skipped this op.
    if (value.load(std::memory_order_seq_cst) >= target) return;
    const OpDesc theirs = opFromHeader(header);
    throwError(ErrorKind::kMismatch,
               opFailureMessage(rank_, op, differentCallsMessage(peer, describeOp(theirs), theirs.seq, rank_, op)));
  }
  if (std::chrono::steady_clock::now() >= run.deadline) {
    std::set<int> silent;
    for (int p = 0; p < size_; ++p) {
      if (p != me_ && counterOf(controls_[static_cast<size_t>(p)], static_cast<int>(counter)).load() < target) {
        silent.insert(member(p));
      }
    }
    throwError(ErrorKind::kTimeout, opTimeoutMessage(rank_, op, run.timeout, silent, {},
                                                     "waiting for the ranks to finish with shared memory"));
  }
}

void WindowSteps::checkDescriptors(const RunContext& run) {
  const OpDesc& op = run.op;
  for (int p = 0; p < size_; ++p) {
    if (p == me_) continue;
    const shm::StepDesc& d = controls_[static_cast<size_t>(p)]->desc[step_ % 2];
    const uint32_t memory = run.device ? shm::kDeviceMemory : shm::kHostMemory;
    if (d.seq == op.seq && d.count == op.count && d.kind == static_cast<uint32_t>(op.kind) &&
        d.dtype == static_cast<uint32_t>(op.dtype) && d.reduce_op == static_cast<uint32_t>(op.reduce_op) &&
        d.root == op.root) {
      if (d.memory == memory) continue;
      throwError(
          ErrorKind::kMismatch,
          opFailureMessage(rank_, op, memoryMismatch(member(p), d.memory == shm::kDeviceMemory, rank_, run.device)));
    }
    const OpDesc theirs = descToOp(d);
    throwError(
        ErrorKind::kMismatch,
        opFailureMessage(rank_, op, differentCallsMessage(member(p), describeOp(theirs), theirs.seq, rank_, op)));
  }
  if (first_completion_ == std::chrono::steady_clock::time_point{}) {
    first_completion_ = std::chrono::steady_clock::now();
  }
}

void WindowSteps::publishValue(Counter counter, uint64_t value) {
  counterOf(mine_, static_cast<int>(counter)).store(value, std::memory_order_seq_cst);
  wakeSleepingPeers();
}

uint64_t WindowSteps::counter(int index, Counter counter) const {
  return counterOf(controls_[static_cast<size_t>(index)], static_cast<int>(counter)).load(std::memory_order_seq_cst);
}

}  // namespace rcoll
