// The shared-window collectives on device buffers: the steps of
// shm_collectives.cc, with the data in device windows mapped through CUDA IPC
// (shm_device_windows.h explains the design).
#include <sched.h>

#include <algorithm>
#include <cstring>
#include <thread>

#include "error.h"
#include "log.h"
#include "op_errors.h"
#include "shm/shm_collectives.h"

namespace rcoll {

ShmDeviceWindows::~ShmDeviceWindows() { release(); }

void ShmDeviceWindows::release() {
  if (stream != nullptr) (void)api.stream_synchronize(stream);  // nothing may still read or write the blocks
  for (size_t r = 0; r < blocks.size(); ++r) {
    if (blocks[r] != nullptr && blocks[r] != own) (void)api.ipc_close(blocks[r]);
  }
  blocks.clear();
  if (own != nullptr) (void)api.device_free(own);
  own = nullptr;
  event.reset();
  if (stream != nullptr) (void)api.stream_destroy(stream);
  stream = nullptr;
}

std::string ShmCollectives::deviceWindowsState() const {
  if (!device_ || device_->state == ShmDeviceWindows::State::kUnset) return "not set up (no device op yet)";
  if (device_->state == ShmDeviceWindows::State::kOn) {
    return strFormat("on (device %d, 2 slots of %zu bytes per rank)", device_->device, device_->slot_bytes);
  }
  return "off: " + device_->why_off;
}

std::string ShmCollectives::deviceContext(const OpDesc& op) const {
  return strFormat("rank %d: %s (op #%llu) on device %d", rank_, describeOp(op).c_str(),
                   static_cast<unsigned long long>(op.seq), device_->device);
}

char* ShmCollectives::deviceSlot(int rank) const {
  return device_->blocks[static_cast<size_t>(rank)] + static_cast<size_t>(step_ % 2) * device_->slot_bytes;
}

void ShmCollectives::deviceCheck(int rc, const OpDesc& op, const char* what) const {
  if (rc != 0) rcoll::deviceCheck(device_->api, rc, deviceContext(op) + ": " + what);
}

void ShmCollectives::deviceCopy(const OpDesc& op, void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  deviceCheck(device_->api.copy_d2d_async(dst, src, bytes, device_->stream), op, "copying through the device windows");
}

void ShmCollectives::deviceReduceSlots(const OpDesc& op, char* out, size_t offset, size_t count) {
  if (count == 0) return;
  const DeviceApi& api = device_->api;
  const int dtype = static_cast<int>(op.dtype), reduce_op = static_cast<int>(op.reduce_op);
  // Rank order on every rank that computes it, so that all get the same bits.
  deviceCheck(
      api.reduce_async(out, deviceSlot(0) + offset, deviceSlot(1) + offset, count, dtype, reduce_op, device_->stream),
      op, "reducing the device windows");
  for (int r = 2; r < size_; ++r) {
    deviceCheck(api.reduce_async(out, out, deviceSlot(r) + offset, count, dtype, reduce_op, device_->stream), op,
                "reducing the device windows");
  }
  if (op.reduce_op == ReduceOp::kAvg) {
    deviceCheck(api.scale_divide_async(out, count, dtype, static_cast<size_t>(size_), device_->stream), op,
                "dividing (avg) on the device");
  }
}

void ShmCollectives::deviceWait(const RunContext& run) {
  const std::string context = deviceContext(run.op);
  device_->event->record(device_->stream, context);
  // The GPU always finishes what was queued; the checks only bound a hung one.
  while (!device_->event->done(context, "waiting for the device windows' copies")) {
    if (run.abort_flag.load(std::memory_order_relaxed)) {
      throwError(ErrorKind::kAborted, context + " was aborted");
    }
    if (std::chrono::steady_clock::now() >= run.deadline) {
      throwError(ErrorKind::kTimeout,
                 strFormat("%s %s waiting for its own device copies (is the GPU hung or busy "
                           "with a long kernel?)",
                           context.c_str(), timedOut(static_cast<double>(run.timeout.count()) / 1000.0).c_str()));
    }
    std::this_thread::yield();
  }
}

// --- set-up ------------------------------------------------------------------------

bool ShmCollectives::setUpDevice(const RunContext& run, const DeviceConfig& config) {
  if (!device_)
    device_ = std::make_unique<ShmDeviceWindows>(*config.api, config.device, config.slot_bytes, config.direct_bytes);
  ShmDeviceWindows& dev = *device_;
  if (dev.state != ShmDeviceWindows::State::kUnset) return dev.state == ShmDeviceWindows::State::kOn;
  if (config.slot_bytes == 0) {  // RCOLL_CUDA_IPC=0, rank 0's value: every rank takes this branch
    dev.state = ShmDeviceWindows::State::kOff;
    dev.why_off = "RCOLL_CUDA_IPC=0";
    return false;
  }
  const std::string context = deviceContext(run.op);
  // 1. Export this rank's block (or say that it cannot).
  std::string mine_failed;
  try {
    deviceCheck(dev.api.set_device(dev.device), run.op, "selecting the device");
    deviceCheck(dev.api.stream_create(dev.device, &dev.stream), run.op, "creating a stream");
    dev.event = std::make_unique<DeviceEvent>(dev.api, dev.device, context);
    deviceCheck(dev.api.device_alloc(dev.device, 2 * dev.slot_bytes, reinterpret_cast<void**>(&dev.own)), run.op,
                "allocating the device window");
    deviceCheck(dev.api.ipc_handle(dev.own, mine_->ipc_handle), run.op, "exporting the device window");
    std::memset(mine_->device_id, 0, sizeof(mine_->device_id));
    deviceCheck(dev.api.device_id(dev.device, mine_->device_id, sizeof(mine_->device_id) - 1), run.op,
                "naming the GPU");
  } catch (const RcollError& e) {
    mine_failed = e.what();
  }
  // A failure from here on (a peer that died, mismatched or timed out) leaves
  // the windows off: the communicator reports it and is not used again.
  try {
    return agreeOnDevice(run, mine_failed);
  } catch (...) {
    dev.state = ShmDeviceWindows::State::kOff;
    dev.why_off = "the set-up with the other ranks failed";
    dev.release();
    throw;
  }
}

bool ShmCollectives::agreeOnDevice(const RunContext& run, const std::string& mine_failed) {
  ShmDeviceWindows& dev = *device_;
  mine_->device_slot_bytes = dev.slot_bytes;
  mine_->device = dev.device;
  mine_->device_published.value.store(mine_failed.empty() ? shm::kDeviceOk : shm::kDeviceFailed,
                                      std::memory_order_seq_cst);
  wakeSleepingPeers();
  waitAll(run, Counter::kDevicePublished, shm::kDeviceOk);
  // 2. Map every peer's block (or say that this rank cannot).
  std::string why = mine_failed;
  dev.blocks.assign(static_cast<size_t>(size_), nullptr);
  dev.blocks[static_cast<size_t>(rank_)] = dev.own;
  for (int p = 0; p < size_ && why.empty(); ++p) {
    if (p == rank_) continue;
    shm::WindowControl* theirs = controls_[static_cast<size_t>(p)];
    if (theirs->device_published.value.load(std::memory_order_acquire) != shm::kDeviceOk) continue;  // they say why
    // The kernels here read the peer's slots: its GPU must be this one or
    // one with peer access (VMs with passthrough GPUs often have none).
    char their_id[RCOLL_DEVICE_ID_BYTES] = {};
    std::memcpy(their_id, theirs->device_id, sizeof(their_id) - 1);
    int access = 0;
    if (dev.api.peer_access(dev.device, their_id, &access) != 0) {
      const char* err = dev.api.last_error();
      why = strFormat("rank %d could not check its access to rank %d's GPU %s: %s", rank_, p, their_id,
                      err != nullptr ? err : "device runtime error");
      break;
    }
    if (access == RCOLL_PEER_NOT_VISIBLE) {
      why = strFormat("rank %d's GPU %s is not visible to rank %d (CUDA_VISIBLE_DEVICES?)", p, their_id, rank_);
      break;
    }
    if (access == RCOLL_PEER_NO_ACCESS) {
      why = strFormat("rank %d's GPU %s has no peer-to-peer access to rank %d's GPU %s", p, their_id, rank_,
                      mine_->device_id);
      break;
    }
    const int rc =
        dev.api.ipc_open(dev.device, theirs->ipc_handle, reinterpret_cast<void**>(&dev.blocks[static_cast<size_t>(p)]));
    if (rc != 0) {
      const char* err = dev.api.last_error();
      why = strFormat("rank %d could not map rank %d's device window (device %lld): %s", rank_, p,
                      static_cast<long long>(theirs->device), err != nullptr ? err : "device runtime error");
    }
  }
  mine_->device_opened.value.store(why.empty() ? shm::kDeviceOk : shm::kDeviceFailed, std::memory_order_seq_cst);
  wakeSleepingPeers();
  waitAll(run, Counter::kDeviceOpened, shm::kDeviceOk);
  // 3. On only if every rank exported and mapped: the same answer everywhere.
  std::vector<int> failed;
  for (int p = 0; p < size_; ++p) {
    shm::WindowControl* c = controls_[static_cast<size_t>(p)];
    if (c->device_published.value.load() != shm::kDeviceOk || c->device_opened.value.load() != shm::kDeviceOk) {
      failed.push_back(p);
    }
  }
  if (failed.empty()) {
    dev.state = ShmDeviceWindows::State::kOn;
    RCOLL_INFO("rank %d: device ops of this communicator go through CUDA IPC windows (device %d, 2 x %zu bytes)", rank_,
               dev.device, dev.slot_bytes);
    return true;
  }
  std::string ranks;
  for (int p : failed) ranks += (ranks.empty() ? "" : ", ") + std::to_string(p);
  dev.why_off = !why.empty() ? why : "rank(s) " + ranks + " could not export or map a device window";
  dev.state = ShmDeviceWindows::State::kOff;
  dev.release();
  RCOLL_WARN(
      "rank %d: CUDA IPC is off for this communicator, device ops are staged through pinned host memory "
      "(slower): %s (set RCOLL_CUDA_IPC=0 to skip the attempt)",
      rank_, dev.why_off.c_str());
  return false;
}

// --- ops -----------------------------------------------------------------------------

bool ShmCollectives::runDevice(const OpDesc& op, const char* send, char* recv, const DeviceConfig& config,
                               const DeviceEvent* ready, DeviceEvent* done, Deadline deadline,
                               std::chrono::milliseconds timeout, const std::atomic<bool>& abort_flag) {
  if (!handles(op.kind) || op.kind == OpKind::kBarrier) return false;
  if (device_ && device_->state == ShmDeviceWindows::State::kOff) return false;
  first_completion_ = {};
  RunContext ctx{op, deadline, timeout, abort_flag, true};
  if (device_ && device_->device != config.device) {
    throwError(
        ErrorKind::kInvalidArgument,
        strFormat("rank %d: %s (op #%llu): buffers on device %d, but this communicator serves device %d", rank_,
                  describeOp(op).c_str(), static_cast<unsigned long long>(op.seq), config.device, device_->device));
  }
  if (!setUpDevice(ctx, config)) return false;
  ShmDeviceWindows& dev = *device_;
  try {
    deviceCheck(dev.api.set_device(dev.device), op, "selecting the device");
    // The caller's stream may still be writing the input.
    if (ready != nullptr) ready->streamWait(dev.stream, deviceContext(op));
    switch (op.kind) {
      case OpKind::kAllreduce:
        deviceAllreduce(ctx, send, recv);
        break;
      case OpKind::kAllgather:
        deviceAllgather(ctx, send, recv);
        break;
      case OpKind::kReduceScatter:
        deviceReduceScatter(ctx, send, recv);
        break;
      case OpKind::kBroadcast:
        deviceBroadcast(ctx, send, recv);
        break;
      default:
        break;
    }
    if (done != nullptr) done->record(dev.stream, deviceContext(op));  // complete already: every phase was waited for
  } catch (...) {
    (void)dev.api.stream_synchronize(dev.stream);  // no copy may still write the caller's memory
    throw;
  }
  return true;
}

void ShmCollectives::deviceAllreduce(const RunContext& run, const char* send, char* recv) {
  const OpDesc& op = run.op;
  const size_t es = elementSize(op.dtype);
  const size_t total = op.count;
  const size_t per_step = device_->slot_bytes / es;
  const size_t P = static_cast<size_t>(size_);
  // Slices start on 256-byte boundaries: the kernels' 16-byte vector loads.
  const size_t align = std::max<size_t>(1, 256 / es);
  size_t done = 0;
  do {  // at least one step, for a count of 0 too: the descriptors still meet
    const size_t n = std::min(per_step, total - done);
    beginStep(run);
    char* out = recv + done * es;
    const char* in = send + done * es;
    // The whole step's input goes into the slot first: `out` may alias `in`.
    deviceCopy(op, deviceSlot(rank_), in, n * es);
    deviceWait(run);
    publish(Counter::kArrived);
    waitAll(run, Counter::kArrived, step_);
    checkDescriptors(run);
    if (n * es * P <= device_->direct_bytes) {
      // Every rank reduces the whole step: one hand-off.
      deviceReduceSlots(op, out, 0, n);
      deviceWait(run);
    } else {
      // Rank r reduces slice r and leaves it in its slot; the others copy it out.
      auto slice = [&](size_t r, size_t* lo, size_t* len) { sliceOfStep(n, P, r, align, lo, len); };
      size_t my_lo = 0, my_len = 0;
      slice(static_cast<size_t>(rank_), &my_lo, &my_len);
      deviceReduceSlots(op, out + my_lo * es, my_lo * es, my_len);
      deviceCopy(op, deviceSlot(rank_) + my_lo * es, out + my_lo * es, my_len * es);
      deviceWait(run);
      publish(Counter::kReduced);
      waitAll(run, Counter::kReduced, step_);
      for (int r = 0; r < size_; ++r) {
        if (r == rank_) continue;
        size_t lo = 0, len = 0;
        slice(static_cast<size_t>(r), &lo, &len);
        deviceCopy(op, out + lo * es, deviceSlot(r) + lo * es, len * es);
      }
      deviceWait(run);
    }
    publish(Counter::kFinished);
    done += n;
  } while (done < total);
}

void ShmCollectives::deviceAllgather(const RunContext& run, const char* send, char* recv) {
  const OpDesc& op = run.op;
  const size_t es = elementSize(op.dtype);
  const size_t total = op.count;  // per rank
  const size_t per_step = device_->slot_bytes / es;
  size_t done = 0;
  do {
    const size_t n = std::min(per_step, total - done);
    beginStep(run);
    deviceCopy(op, deviceSlot(rank_), send + done * es, n * es);
    deviceWait(run);
    publish(Counter::kArrived);
    waitAll(run, Counter::kArrived, step_);
    checkDescriptors(run);
    // Every block from a slot, this rank's too: `send` may alias a block of `recv`.
    for (int r = 0; r < size_; ++r) {
      deviceCopy(op, recv + (static_cast<size_t>(r) * total + done) * es, deviceSlot(r), n * es);
    }
    deviceWait(run);
    publish(Counter::kFinished);
    done += n;
  } while (done < total);
}

void ShmCollectives::deviceReduceScatter(const RunContext& run, const char* send, char* recv) {
  const OpDesc& op = run.op;
  const size_t es = elementSize(op.dtype);
  const size_t total = op.count;  // per rank: send holds size * total elements
  const size_t P = static_cast<size_t>(size_);
  const size_t per_step = std::max<size_t>(1, device_->slot_bytes / (es * P));
  const size_t me = static_cast<size_t>(rank_);
  size_t done = 0;
  do {
    const size_t n = std::min(per_step, total - done);
    beginStep(run);
    // Slot layout of a step: block j's n elements at j * n.
    for (size_t j = 0; j < P; ++j)
      deviceCopy(op, deviceSlot(rank_) + j * n * es, send + (j * total + done) * es, n * es);
    deviceWait(run);
    publish(Counter::kArrived);
    waitAll(run, Counter::kArrived, step_);
    checkDescriptors(run);
    deviceReduceSlots(op, recv + done * es, me * n * es, n);
    deviceWait(run);
    publish(Counter::kFinished);
    done += n;
  } while (done < total);
}

void ShmCollectives::deviceBroadcast(const RunContext& run, const char* send, char* recv) {
  const OpDesc& op = run.op;
  const size_t es = elementSize(op.dtype);
  const size_t total = op.count;
  const int root = static_cast<int>(op.root);
  const size_t per_step = device_->slot_bytes / es;
  size_t done = 0;
  do {
    const size_t n = std::min(per_step, total - done);
    beginStep(run);
    if (rank_ == root) {
      deviceCopy(op, deviceSlot(rank_), send + done * es, n * es);
      deviceWait(run);
    }
    publish(Counter::kArrived);
    waitAll(run, Counter::kArrived, step_);
    checkDescriptors(run);
    deviceCopy(op, recv + done * es, deviceSlot(root), n * es);  // the root's own copy from its slot too
    deviceWait(run);
    publish(Counter::kFinished);
    done += n;
  } while (done < total);
}

}  // namespace rcoll
