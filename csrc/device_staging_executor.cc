#include "device_staging_executor.h"

#include <unistd.h>

#include <algorithm>
#include <set>
#include <thread>

#include "error.h"
#include "log.h"
#include "op_errors.h"

namespace rcoll {

namespace {
constexpr size_t kAlign = 256;  // slot stride: good for DMA and for the kernels' 16-byte loads

size_t alignUp(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }
}  // namespace

DeviceStagingExecutor::DeviceStagingExecutor(Transport* transport, const DeviceApi& api, int device, int rank, int size,
                                             uint64_t comm_id, size_t slot_bytes, int num_slots, Config::Gdr gdr)
    : transport_(transport), api_(api), device_(device), rank_(rank), size_(size), comm_id_(comm_id) {
  context_ = strFormat("rank %d: setting up the staging of device %d", rank, device);
  try {
    setUp(gdr, slot_bytes, num_slots);
  } catch (...) {
    releaseResources();  // the destructor does not run for a constructor that threw
    throw;
  }
}

void DeviceStagingExecutor::setUp(Config::Gdr gdr, size_t slot_bytes, int num_slots) {
  const int device = device_;
  // Pinned allocations use the thread's current device: make it ours, so that
  // no context is created on a GPU this rank does not use.
  check(api_.set_device(device), "selecting the device");
  check(api_.stream_create(device, &d2h_stream_), "creating a stream");
  check(api_.stream_create(device, &h2d_stream_), "creating a stream");
  join_event_ = std::make_unique<DeviceEvent>(api_, device, context_);
  if (transport_ == nullptr) return;  // world of size 1: local steps only
  const size_t stride = alignUp(slot_bytes);
  const size_t n = static_cast<size_t>(num_slots);
  gdr_ = gdr != Config::Gdr::kOff && setUpGdr(stride * 2 * n, gdr == Config::Gdr::kOn);
  if (!gdr_) {
    // One pinned block for both pools, registered once: every segment of every
    // op then hits that one registration.
    check(api_.host_alloc(stride * 2 * n, reinterpret_cast<void**>(&host_memory_)), "allocating pinned staging memory");
    check(api_.device_alloc(device, stride * n, reinterpret_cast<void**>(&device_memory_)),
          "allocating device staging memory");
    if (transport_->needsRegistration()) wire_registration_ = transport_->registerMemory(host_memory_, stride * 2 * n);
  }
  char* wire = gdr_ ? device_memory_ : host_memory_;
  for (size_t i = 0; i < n; ++i) {
    Slot send;
    send.wire = wire + stride * i;
    send.event = std::make_unique<DeviceEvent>(api_, device, context_);
    send_slots_.push_back(std::move(send));
    Slot recv;
    recv.wire = wire + stride * (n + i);
    recv.device = gdr_ ? recv.wire : device_memory_ + stride * i;
    recv.event = std::make_unique<DeviceEvent>(api_, device, context_);
    recv_slots_.push_back(std::move(recv));
    free_send_slots_.push_back(static_cast<int>(i));
    free_recv_slots_.push_back(static_cast<int>(i));
  }
}

bool DeviceStagingExecutor::setUpGdr(size_t slot_bytes, bool required) {
  std::vector<std::string> reasons;
  int supported = 0;
  if (!transport_->needsRegistration()) {
    reasons.push_back(strFormat("the %s transport has no NIC to read device memory", transport_->name()));
  } else if (api_.gdr_support(device_, &supported) != 0) {
    reasons.push_back(std::string("asking the GPU: ") + api_.last_error());
  } else if (supported == 0) {
    reasons.push_back("the GPU does not support GPUDirect RDMA");
  }
  // dma-buf export and registration work on whole pages (64K: the GPU's own).
  constexpr size_t kGpuPage = size_t{64} << 10;
  const size_t bytes = (slot_bytes + kGpuPage - 1) / kGpuPage * kGpuPage;
  char* memory = nullptr;
  if (reasons.empty() && api_.device_alloc(device_, bytes, reinterpret_cast<void**>(&memory)) != 0) {
    reasons.push_back(std::string("allocating device slots: ") + api_.last_error());
    memory = nullptr;
  }
  const char* method = nullptr;
  if (memory != nullptr) {
    int fd = -1;
    unsigned long long offset = 0;
    std::string why;
    if (api_.dmabuf_export(memory, bytes, &fd, &offset) != 0) {
      reasons.push_back(std::string("dma-buf export: ") + api_.last_error());
    } else {
      wire_registration_ = transport_->registerDeviceMemory(memory, bytes, fd, offset, &why);
      ::close(fd);  // the registration holds its own reference to the dma-buf
      if (wire_registration_ != nullptr) {
        method = "a dma-buf";
      } else {
        reasons.push_back(why);
      }
    }
    if (wire_registration_ == nullptr) {
      wire_registration_ = transport_->registerDeviceMemory(memory, bytes, -1, 0, &why);
      if (wire_registration_ != nullptr) {
        method = "peer memory (nvidia-peermem)";
      } else {
        reasons.push_back(why);
      }
    }
    if (wire_registration_ == nullptr) (void)api_.device_free(memory);
  }
  if (wire_registration_ == nullptr) {
    std::string all;
    for (const std::string& r : reasons) all += (all.empty() ? "" : "; ") + r;
    if (required) {
      throwError(ErrorKind::kConfig, strFormat("RCOLL_GDR=1 but GPUDirect RDMA is impossible for device "
                                               "%d: %s (RCOLL_GDR=auto stages through pinned host memory instead)",
                                               device_, all.c_str()));
    }
    // Worth a warning where a NIC is there but cannot reach the GPU (once per
    // process: every torch group would say the same).
    static std::atomic<bool> warned{false};
    if (transport_->needsRegistration() && supported != 0 && !warned.exchange(true)) {
      RCOLL_WARN("rank %d: GPU buffers are staged through pinned host memory, not GPUDirect RDMA: %s", rank_,
                 all.c_str());
    } else {
      RCOLL_INFO("rank %d: GPU buffers are staged through pinned host memory: %s", rank_, all.c_str());
    }
    return false;
  }
  device_memory_ = memory;
  // Why the dma-buf route was passed over, if it was: what to fix for it.
  const std::string passed_over = reasons.empty() ? "" : " (the dma-buf route: " + reasons.front() + ")";
  RCOLL_INFO(
      "rank %d: GPUDirect RDMA for device %d: %zu bytes of slots registered with the %s transport "
      "through %s%s",
      rank_, device_, bytes, transport_->name(), method, passed_over.c_str());
  return true;
}

DeviceStagingExecutor::~DeviceStagingExecutor() { releaseResources(); }

void DeviceStagingExecutor::releaseResources() {
  // Nothing may still read or write the memory freed below.
  if (d2h_stream_ != nullptr) (void)api_.stream_synchronize(d2h_stream_);
  if (h2d_stream_ != nullptr) (void)api_.stream_synchronize(h2d_stream_);
  send_slots_.clear();
  recv_slots_.clear();
  join_event_.reset();
  if (wire_registration_ != nullptr) transport_->deregisterMemory(wire_registration_);
  if (host_memory_ != nullptr) (void)api_.host_free(host_memory_);
  if (device_memory_ != nullptr) (void)api_.device_free(device_memory_);
  if (scratch_ != nullptr) (void)api_.device_free(scratch_);
  if (d2h_stream_ != nullptr) (void)api_.stream_destroy(d2h_stream_);
  if (h2d_stream_ != nullptr) (void)api_.stream_destroy(h2d_stream_);
  wire_registration_ = nullptr;
  host_memory_ = device_memory_ = scratch_ = nullptr;
  d2h_stream_ = h2d_stream_ = nullptr;
}

void DeviceStagingExecutor::check(int rc, const char* what) {
  if (rc != 0) deviceCheck(api_, rc, context_ + ": " + what);  // the message only on failure: called per segment
}

void DeviceStagingExecutor::begin(const DeviceEvent* ready, const std::string& context) {
  context_ = context;
  first_completion_ = {};
  check(api_.set_device(device_), "selecting the device");
  // The caller's stream may still be writing the input: both streams wait for
  // the event recorded there when the op was issued (no host wait).
  if (ready != nullptr) {
    ready->streamWait(d2h_stream_, context_);
    ready->streamWait(h2d_stream_, context_);
  }
}

void DeviceStagingExecutor::copy(char* dst, const char* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  check(api_.copy_d2d_async(dst, src, bytes, d2h_stream_), "copying within the device");
}

void DeviceStagingExecutor::scaleDivide(char* buf, size_t count, DataType dtype, size_t divisor) {
  if (count == 0) return;
  check(api_.scale_divide_async(buf, count, static_cast<int>(dtype), divisor, d2h_stream_), "dividing (avg)");
}

char* DeviceStagingExecutor::scratch(size_t bytes) {
  if (bytes <= scratch_bytes_) return scratch_;
  // Between ops the streams are idle (finish() waited for them), so the old
  // block can go at once.
  if (scratch_ != nullptr) check(api_.device_free(scratch_), "freeing device scratch memory");
  scratch_ = nullptr;
  scratch_bytes_ = 0;
  check(api_.device_alloc(device_, bytes, reinterpret_cast<void**>(&scratch_)), "allocating device scratch memory");
  scratch_bytes_ = bytes;
  return scratch_;
}

void DeviceStagingExecutor::releaseAll() {
  for (auto* list : {&staging_, &sends_posted_}) {
    for (auto& f : *list) {
      if (f.request != nullptr) transport_->release(f.request);
      if (f.slot >= 0) free_send_slots_.push_back(f.slot);
    }
    list->clear();
  }
  for (auto* list : {&recvs_posted_, &recvs_landing_}) {
    for (auto& f : *list) {
      if (f.request != nullptr) transport_->release(f.request);
      if (f.slot >= 0) free_recv_slots_.push_back(f.slot);
    }
    list->clear();
  }
}

void DeviceStagingExecutor::abandon() {
  // A failed op may have copies in flight into slots and user memory: wait
  // for them (the device always finishes them) before anything is reused.
  (void)api_.stream_synchronize(d2h_stream_);
  (void)api_.stream_synchronize(h2d_stream_);
  if (transport_ != nullptr) releaseAll();
}

void DeviceStagingExecutor::fail(const Schedule& schedule, ErrorKind kind, const std::string& why) {
  abandon();
  throwError(kind, opFailureMessage(rank_, schedule.op, why));
}

void DeviceStagingExecutor::timeout(const Schedule& schedule, std::chrono::milliseconds limit) {
  std::set<int> waiting_recv, waiting_send;
  for (auto& f : recvs_posted_) waiting_recv.insert(schedule.recvs[static_cast<size_t>(f.index)].peer);
  for (auto& f : sends_posted_) waiting_send.insert(schedule.sends[static_cast<size_t>(f.index)].peer);
  abandon();
  throwError(ErrorKind::kTimeout, opTimeoutMessage(rank_, schedule.op, limit, waiting_recv, waiting_send,
                                                   "waiting for device copies or a dependency between segments"));
}

bool DeviceStagingExecutor::harvest(const Schedule& schedule, size_t* sends_done, size_t* recvs_done) {
  bool any = false;
  const size_t es = schedule.elem_size;
  auto firstCompletion = [this] {
    if (first_completion_ == std::chrono::steady_clock::time_point{})
      first_completion_ = std::chrono::steady_clock::now();
  };
  // Landed segments whose copy (and reduction) finished: the data is in place.
  for (size_t i = 0; i < recvs_landing_.size();) {
    InFlight& f = recvs_landing_[i];
    if (!recv_slots_[static_cast<size_t>(f.slot)].event->done(context_, "copying a segment to the device")) {
      ++i;
      continue;
    }
    free_recv_slots_.push_back(f.slot);
    recv_progress_.markDone(static_cast<size_t>(f.index));
    ++*recvs_done;
    f = recvs_landing_.back();
    recvs_landing_.pop_back();
    any = true;
  }
  // Segments off the wire: queue their copy to the device (and reduction).
  bool flushed = false;
  for (size_t i = 0; i < recvs_posted_.size();) {
    InFlight& f = recvs_posted_[i];
    if (f.request->state == Request::State::kPending) {
      ++i;
      continue;
    }
    if (f.request->state == Request::State::kFailed) {
      TransportFailure failure = transport_->failure(f.request);
      fail(schedule, failure.kind, failure.message);
    }
    const RecvStep& step = schedule.recvs[static_cast<size_t>(f.index)];
    if (step.reduce_out != nullptr && step.reduce_after_recv >= 0 && !recv_progress_.done(step.reduce_after_recv)) {
      ++i;  // arrived, but what it is reduced with is not on the device yet
      continue;
    }
    firstCompletion();
    transport_->release(f.request);
    f.request = nullptr;
    if (f.slot < 0) {  // zero-byte message: nothing to copy
      recv_progress_.markDone(static_cast<size_t>(f.index));
      ++*recvs_done;
    } else {
      Slot& slot = recv_slots_[static_cast<size_t>(f.slot)];
      const size_t bytes = step.count * es;
      if (gdr_ && !flushed) {  // once per pass: it covers every write completed before it
        check(api_.flush_rdma_writes(device_), "flushing GPUDirect RDMA writes");
        flushed = true;
      }
      if (step.reduce_out != nullptr) {
        if (!gdr_) {
          check(api_.copy_h2d_async(slot.device, slot.wire, bytes, h2d_stream_), "copying a segment to the device");
        }
        check(api_.reduce_async(step.reduce_out, step.reduce_in, slot.device, step.count,
                                static_cast<int>(schedule.op.dtype), static_cast<int>(schedule.op.reduce_op),
                                h2d_stream_),
              "reducing a segment on the device");
        if (step.divide_after) {
          check(api_.scale_divide_async(step.reduce_out, step.count, static_cast<int>(schedule.op.dtype),
                                        static_cast<size_t>(size_), h2d_stream_),
                "dividing (avg) on the device");
        }
      } else if (gdr_) {
        check(api_.copy_d2d_async(step.direct, slot.wire, bytes, h2d_stream_), "copying a segment on the device");
      } else {
        check(api_.copy_h2d_async(step.direct, slot.wire, bytes, h2d_stream_), "copying a segment to the device");
      }
      slot.event->record(h2d_stream_, context_);
      recvs_landing_.push_back(f);
    }
    f = recvs_posted_.back();
    recvs_posted_.pop_back();
    any = true;
  }
  for (size_t i = 0; i < sends_posted_.size();) {
    InFlight& f = sends_posted_[i];
    if (f.request->state == Request::State::kPending) {
      ++i;
      continue;
    }
    if (f.request->state == Request::State::kFailed) {
      TransportFailure failure = transport_->failure(f.request);
      fail(schedule, failure.kind, failure.message);
    }
    firstCompletion();
    transport_->release(f.request);
    if (f.slot >= 0) free_send_slots_.push_back(f.slot);
    send_queues_.finished(schedule.sends[static_cast<size_t>(f.index)].peer);
    ++*sends_done;
    f = sends_posted_.back();
    sends_posted_.pop_back();
    any = true;
  }
  return any;
}

void DeviceStagingExecutor::waitForProgress(Deadline deadline, bool device_busy) {
  if (device_busy) {
    // Copies or kernels are running: move bytes if any are ready, then look at
    // the events again. Never sleep on the network while the device may finish.
    transport_->progress(std::chrono::milliseconds(0));
    std::this_thread::yield();
    return;
  }
  auto now = std::chrono::steady_clock::now();
  transport_->progress(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now) +
                       std::chrono::milliseconds(1));
}

void DeviceStagingExecutor::run(const Schedule& schedule, Deadline deadline, std::chrono::milliseconds limit,
                                const std::atomic<bool>& abort_flag) {
  const size_t es = schedule.elem_size;
  const size_t n_sends = schedule.sends.size();
  const size_t n_recvs = schedule.recvs.size();
  recv_progress_.reset(n_recvs);
  // The op's local steps ran on the D2H stream; reductions on the H2D stream
  // may read what they wrote.
  join_event_->record(d2h_stream_, context_);
  join_event_->streamWait(h2d_stream_, context_);
  send_queues_.reset(schedule, size_);
  size_t next_recv = 0, sends_done = 0, recvs_done = 0;

  while (sends_done < n_sends || recvs_done < n_recvs) {
    bool moved = false;
    // Receives in order, as far ahead as the slots allow.
    while (next_recv < n_recvs) {
      const RecvStep& step = schedule.recvs[next_recv];
      const size_t bytes = step.count * es;
      int slot = -1;
      if (bytes > 0) {
        if (free_recv_slots_.empty()) break;
        slot = free_recv_slots_.back();
        free_recv_slots_.pop_back();
      }
      WireHeader expected = makeHeader(schedule.op, comm_id_, static_cast<uint32_t>(step.peer), step.offset, bytes);
      if (!schedule.recv_pair_count.empty()) expected.count = schedule.recv_pair_count[static_cast<size_t>(step.peer)];
      char* into = slot >= 0 ? recv_slots_[static_cast<size_t>(slot)].wire : nullptr;
      recvs_posted_.push_back({static_cast<int>(next_recv), slot, transport_->irecv(step.peer, expected, into, bytes)});
      ++next_recv;
      moved = true;
    }
    // Each peer's sends in order (send_queues.h), the D2H into a slot once
    // what they forward has landed. The last free slot goes only to the
    // earliest send in schedule order: sends to one peer that wait on a busy
    // receiver can then hold every slot but one, and the schedule-order chain
    // that the receivers' own progress may hang on always has a slot (with one
    // slot this is the schedule order itself).
    for (SendQueues::Peer& peer : send_queues_.peers()) {
      for (int64_t index; (index = send_queues_.next(peer)) >= 0;) {
        const SendStep& step = schedule.sends[static_cast<size_t>(index)];
        if (!recv_progress_.sendReady(step)) break;
        const size_t bytes = step.count * es;
        int slot = -1;
        if (bytes > 0) {
          if (free_send_slots_.empty() || (free_send_slots_.size() == 1 && index != send_queues_.earliestUnposted())) {
            break;
          }
          slot = free_send_slots_.back();
          free_send_slots_.pop_back();
          Slot& s = send_slots_[static_cast<size_t>(slot)];
          if (gdr_) {
            check(api_.copy_d2d_async(s.wire, step.data, bytes, d2h_stream_), "copying a segment on the device");
          } else {
            check(api_.copy_d2h_async(s.wire, step.data, bytes, d2h_stream_), "copying a segment to the host");
          }
          s.event->record(d2h_stream_, context_);
        }
        staging_.push_back({static_cast<int>(index), slot, nullptr});
        send_queues_.posted(peer);
        moved = true;
      }
    }
    // On the wire in the order of their copies, which finish in that order (one
    // stream), each once its copy finished: each peer's still in schedule order.
    size_t posted = 0;
    for (; posted < staging_.size(); ++posted) {
      InFlight& f = staging_[posted];
      if (f.slot >= 0 &&
          !send_slots_[static_cast<size_t>(f.slot)].event->done(context_, "copying a segment to the host")) {
        break;
      }
      const SendStep& step = schedule.sends[static_cast<size_t>(f.index)];
      const size_t bytes = step.count * es;
      WireHeader header = makeHeader(schedule.op, comm_id_, static_cast<uint32_t>(rank_), step.offset, bytes);
      if (!schedule.send_pair_count.empty()) header.count = schedule.send_pair_count[static_cast<size_t>(step.peer)];
      const char* from = f.slot >= 0 ? send_slots_[static_cast<size_t>(f.slot)].wire : nullptr;
      f.request = transport_->isend(step.peer, header, from, bytes);
      sends_posted_.push_back(f);
    }
    if (posted > 0) {
      staging_.erase(staging_.begin(), staging_.begin() + static_cast<std::ptrdiff_t>(posted));
      moved = true;
    }

    if (abort_flag.load(std::memory_order_relaxed)) {
      abandon();
      throwError(ErrorKind::kAborted,
                 strFormat("rank %d: %s (op #%llu) was aborted", rank_, describeOp(schedule.op).c_str(),
                           static_cast<unsigned long long>(schedule.op.seq)));
    }
    if (harvest(schedule, &sends_done, &recvs_done) || moved) continue;
    if (std::chrono::steady_clock::now() >= deadline) timeout(schedule, limit);
    waitForProgress(deadline, !staging_.empty() || !recvs_landing_.empty());
    harvest(schedule, &sends_done, &recvs_done);
  }
}

void DeviceStagingExecutor::finish(DeviceEvent* done, Deadline deadline, std::chrono::milliseconds limit,
                                   const std::atomic<bool>& abort_flag) {
  // One event that covers both streams: the caller's stream waits on it.
  join_event_->record(d2h_stream_, context_);
  join_event_->streamWait(h2d_stream_, context_);
  // (Recording join_event_ again is fine: a stream wait binds to the record
  // that precedes it.)
  DeviceEvent* last = done != nullptr ? done : join_event_.get();
  last->record(h2d_stream_, context_);
  // The op is complete when its data is in place: poll, as the network loop does.
  while (!last->done(context_, "finishing on the device")) {
    if (abort_flag.load(std::memory_order_relaxed)) {
      abandon();
      throwError(ErrorKind::kAborted, context_ + " was aborted");
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      throwError(ErrorKind::kTimeout,
                 strFormat("%s %s waiting for the device to finish its copies (is the GPU "
                           "hung or busy with a long kernel?)",
                           context_.c_str(), timedOut(static_cast<double>(limit.count()) / 1000.0).c_str()));
    }
    std::this_thread::yield();
  }
}

}  // namespace rcoll
