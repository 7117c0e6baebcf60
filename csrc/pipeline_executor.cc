#include "pipeline_executor.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>

#include "error.h"
#include "log.h"
#include "op_errors.h"
#include "reduce_kernels.h"

namespace rcoll {

namespace {
constexpr size_t kMaxDirectRecvsInFlight = 64;
}  // namespace

PipelineExecutor::PipelineExecutor(Transport& transport, int rank, int size, uint64_t comm_id, size_t slot_bytes,
                                   int num_slots)
    : transport_(transport), rank_(rank), size_(size), comm_id_(comm_id) {
  // One aligned block, allocated once: reductions read it with vector loads.
  size_t stride = (slot_bytes + 63) / 64 * 64;
  slot_memory_ = static_cast<char*>(std::aligned_alloc(64, stride * static_cast<size_t>(num_slots)));
  if (slot_memory_ == nullptr) throwError(ErrorKind::kGeneric, "out of memory for staging segments");
  for (int i = 0; i < num_slots; ++i) free_slots_.push_back(slot_memory_ + stride * static_cast<size_t>(i));
  if (transport_.needsRegistration()) {
    slot_registration_ = transport_.registerMemory(slot_memory_, stride * static_cast<size_t>(num_slots));
  }
}

PipelineExecutor::~PipelineExecutor() {
  if (slot_registration_ != nullptr) transport_.deregisterMemory(slot_registration_);
  std::free(slot_memory_);
}

void PipelineExecutor::registerRegions(const Schedule& schedule, std::vector<MemoryHandle>* handles) {
  regions_.clear();
  const size_t es = schedule.elem_size;
  for (const SendStep& s : schedule.sends) {
    if (s.count > 0) regions_.emplace_back(const_cast<char*>(static_cast<const char*>(s.data)), s.count * es);
  }
  for (const RecvStep& r : schedule.recvs) {
    if (r.reduce_out == nullptr && r.count > 0) regions_.emplace_back(static_cast<char*>(r.direct), r.count * es);
  }
  std::sort(regions_.begin(), regions_.end());
  // Merge overlapping and touching ranges: adjacent segments are one buffer,
  // and a gap means memory that may not be mapped, which must not be registered.
  size_t out = 0;
  for (size_t i = 0; i < regions_.size(); ++i) {
    if (out > 0 && regions_[i].first <= regions_[out - 1].first + regions_[out - 1].second) {
      char* end = std::max(regions_[out - 1].first + regions_[out - 1].second, regions_[i].first + regions_[i].second);
      regions_[out - 1].second = static_cast<size_t>(end - regions_[out - 1].first);
    } else {
      regions_[out++] = regions_[i];
    }
  }
  regions_.resize(out);
  for (auto& region : regions_) handles->push_back(transport_.registerMemory(region.first, region.second));
}

void PipelineExecutor::cancelAll() {
  // Requests still in flight belong to a failed op; the transport has failed
  // their connection (or will drop them when the communicator closes), so only
  // their bookkeeping is returned here.
  for (auto& f : sends_in_flight_) transport_.release(f.request);
  for (auto& f : recvs_in_flight_) {
    transport_.release(f.request);
    if (f.slot != nullptr) free_slots_.push_back(f.slot);
  }
  sends_in_flight_.clear();
  recvs_in_flight_.clear();
}

void PipelineExecutor::fail(const Schedule& schedule, const TransportFailure& failure) {
  cancelAll();
  throwError(failure.kind, opFailureMessage(rank_, schedule.op, failure.message));
}

void PipelineExecutor::timeout(const Schedule& schedule, std::chrono::milliseconds limit) {
  std::set<int> waiting_recv, waiting_send;
  for (auto& f : recvs_in_flight_) waiting_recv.insert(schedule.recvs[static_cast<size_t>(f.index)].peer);
  for (auto& f : sends_in_flight_) waiting_send.insert(schedule.sends[static_cast<size_t>(f.index)].peer);
  cancelAll();
  throwError(ErrorKind::kTimeout, opTimeoutMessage(rank_, schedule.op, limit, waiting_recv, waiting_send,
                                                   "waiting for a dependency between segments"));
}

bool PipelineExecutor::harvest(const Schedule& schedule, size_t* sends_done, size_t* recvs_done) {
  bool any = false;
  // Completed receives: reduce staged segments, free their slots.
  for (size_t i = 0; i < recvs_in_flight_.size();) {
    InFlight& f = recvs_in_flight_[i];
    if (f.request->state == Request::State::kPending) {
      ++i;
      continue;
    }
    if (f.request->state == Request::State::kFailed) fail(schedule, transport_.failure(f.request));
    const RecvStep& step = schedule.recvs[static_cast<size_t>(f.index)];
    if (first_completion_ == std::chrono::steady_clock::time_point{})
      first_completion_ = std::chrono::steady_clock::now();
    if (f.slot != nullptr && step.reduce_after_send >= 0 && !send_done_[static_cast<size_t>(step.reduce_after_send)]) {
      ++i;  // arrived, but a send still reads what the reduction would overwrite
      continue;
    }
    if (f.slot != nullptr && step.reduce_after_recv >= 0 && !recv_progress_.done(step.reduce_after_recv)) {
      ++i;  // arrived, but what it is reduced with has not
      continue;
    }
    if (f.slot != nullptr) {
      const auto reduce_start =
          timeline_ != nullptr ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point{};
      if (step.staged_first) {
        // Reduced in the slot, then copied: the kernels let `out` alias only the first operand.
        reduceInto(f.slot, f.slot, step.reduce_in, step.count, schedule.op.dtype, schedule.op.reduce_op);
        std::memcpy(step.reduce_out, f.slot, step.count * schedule.elem_size);
      } else {
        reduceInto(step.reduce_out, step.reduce_in, f.slot, step.count, schedule.op.dtype, schedule.op.reduce_op);
      }
      if (step.divide_after) scaleDivide(step.reduce_out, step.count, schedule.op.dtype, static_cast<size_t>(size_));
      free_slots_.push_back(f.slot);
      if (timeline_ != nullptr) {
        timeline_->slice(0, "reduce", "reduce", reduce_start, std::chrono::steady_clock::now(),
                         strFormat("\"elements\": %zu, \"from\": %d", step.count, step.peer));
      }
    }
    recv_progress_.markDone(static_cast<size_t>(f.index));
    ++*recvs_done;
    transport_.release(f.request);
    f = recvs_in_flight_.back();
    recvs_in_flight_.pop_back();
    any = true;
  }
  for (size_t i = 0; i < sends_in_flight_.size();) {
    InFlight& f = sends_in_flight_[i];
    if (f.request->state == Request::State::kPending) {
      ++i;
      continue;
    }
    if (f.request->state == Request::State::kFailed) fail(schedule, transport_.failure(f.request));
    if (first_completion_ == std::chrono::steady_clock::time_point{})
      first_completion_ = std::chrono::steady_clock::now();
    send_done_[static_cast<size_t>(f.index)] = 1;
    send_queues_.finished(schedule.sends[static_cast<size_t>(f.index)].peer);
    ++*sends_done;
    transport_.release(f.request);
    f = sends_in_flight_.back();
    sends_in_flight_.pop_back();
    any = true;
  }
  return any;
}

void PipelineExecutor::run(const Schedule& schedule, Deadline deadline, std::chrono::milliseconds limit,
                           const std::atomic<bool>& abort_flag) {
  const size_t es = schedule.elem_size;
  const size_t n_sends = schedule.sends.size();
  const size_t n_recvs = schedule.recvs.size();
  recv_progress_.reset(n_recvs);
  send_done_.assign(n_sends, 0);
  first_completion_ = {};
  // Whole-buffer registrations for transports that need them, released however run() ends.
  struct Registrations {
    Transport& transport;
    std::vector<MemoryHandle> handles;
    ~Registrations() {
      for (MemoryHandle h : handles) transport.deregisterMemory(h);
    }
  } registrations{transport_, {}};
  if (transport_.needsRegistration()) registerRegions(schedule, &registrations.handles);
  send_queues_.reset(schedule, size_);  // one queue per peer (send_queues.h)
  size_t next_recv = 0, sends_done = 0, recvs_done = 0;

  while (sends_done < n_sends || recvs_done < n_recvs) {
    // Post receives in order, as far ahead as slots and the window allow.
    while (next_recv < n_recvs) {
      const RecvStep& step = schedule.recvs[next_recv];
      size_t bytes = step.count * es;
      char* slot = nullptr;
      if (step.reduce_out != nullptr) {
        if (free_slots_.empty()) break;
        slot = free_slots_.back();
        free_slots_.pop_back();
      } else if (recvs_in_flight_.size() >= kMaxDirectRecvsInFlight) {
        break;
      }
      WireHeader expected = makeHeader(schedule.op, comm_id_, static_cast<uint32_t>(step.peer), step.offset, bytes);
      if (!schedule.recv_pair_count.empty()) expected.count = schedule.recv_pair_count[static_cast<size_t>(step.peer)];
      Request* request = transport_.irecv(step.peer, expected, slot != nullptr ? slot : step.direct, bytes);
      recvs_in_flight_.push_back({static_cast<int>(next_recv), request, slot});
      ++next_recv;
    }
    // Post each peer's sends in order once what they forward has arrived.
    for (SendQueues::Peer& peer : send_queues_.peers()) {
      for (int64_t index;
           (index = send_queues_.next(peer)) >= 0 && sendWindowOpen(sends_in_flight_.size(), peer.in_flight);) {
        const SendStep& step = schedule.sends[static_cast<size_t>(index)];
        if (!recv_progress_.sendReady(step)) break;
        WireHeader header =
            makeHeader(schedule.op, comm_id_, static_cast<uint32_t>(rank_), step.offset, step.count * es);
        if (!schedule.send_pair_count.empty()) header.count = schedule.send_pair_count[static_cast<size_t>(step.peer)];
        Request* request = transport_.isend(step.peer, header, step.data, step.count * es);
        sends_in_flight_.push_back({static_cast<int>(index), request, nullptr});
        send_queues_.posted(peer);
      }
    }

    if (abort_flag.load(std::memory_order_relaxed)) {
      cancelAll();
      throwError(ErrorKind::kAborted,
                 strFormat("rank %d: %s (op #%llu) was aborted", rank_, describeOp(schedule.op).c_str(),
                           static_cast<unsigned long long>(schedule.op.seq)));
    }
    // Requests can finish at post time (a connection that already failed), so
    // look before blocking; block only when nothing is ready.
    if (harvest(schedule, &sends_done, &recvs_done)) continue;
    auto now = std::chrono::steady_clock::now();
    if (now >= deadline) timeout(schedule, limit);
    transport_.progress(std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now) +
                        std::chrono::milliseconds(1));
    harvest(schedule, &sends_done, &recvs_done);
  }
}

}  // namespace rcoll
