// Runs a Schedule over a Transport, keeping the pipeline full.
//
// Sends are posted in schedule order per peer as soon as the receive they
// depend on has been reduced, within the send window (schedule.h); receives are posted in schedule order as far
// ahead as the staging slots allow. While the transport moves segment k+1, this thread
// reduces segment k: the network and the arithmetic overlap. A staging slot is
// freed the moment its segment is reduced (the result lives in the destination
// buffer), so slots never wait on sends and the ring cannot deadlock on them.
// The one exception, recursive doubling, holds a slot until the send that reads
// the reduction's destination is gone; that send depends only on receives
// posted earlier, which hold slots of their own, so it cannot deadlock either.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "schedule.h"
#include "send_queues.h"
#include "socket_util.h"
#include "timeline.h"
#include "transport.h"

namespace rcoll {

class PipelineExecutor {
 public:
  PipelineExecutor(Transport& transport, int rank, int size, uint64_t comm_id, size_t slot_bytes, int num_slots);
  ~PipelineExecutor();

  // Throws RcollError naming this rank, the op and the peer on failure, on
  // timeout (naming the peers still owed data), or when `abort_flag` is set.
  void run(const Schedule& schedule, Deadline deadline, std::chrono::milliseconds timeout,
           const std::atomic<bool>& abort_flag);

  // RCOLL_TIMELINE: reductions become slices; firstCompletion() dates the end of "wait for peers".
  void setTimeline(Timeline* timeline) { timeline_ = timeline; }
  std::chrono::steady_clock::time_point firstCompletion() const { return first_completion_; }

 private:
  // Registers the memory a schedule touches as few whole regions (segments of
  // one buffer are adjacent), returning the handles to deregister afterwards.
  void registerRegions(const Schedule& schedule, std::vector<MemoryHandle>* handles);
  // Processes finished requests (reductions included); true if there were any.
  bool harvest(const Schedule& schedule, size_t* sends_done, size_t* recvs_done);
  [[noreturn]] void fail(const Schedule& schedule, const TransportFailure& failure);
  [[noreturn]] void timeout(const Schedule& schedule, std::chrono::milliseconds timeout);
  void cancelAll();

  Transport& transport_;
  int rank_;
  int size_;
  uint64_t comm_id_;
  char* slot_memory_ = nullptr;
  MemoryHandle slot_registration_ = nullptr;
  Timeline* timeline_ = nullptr;
  std::chrono::steady_clock::time_point first_completion_{};
  std::vector<std::pair<char*, size_t>> regions_;  // scratch of registerRegions()
  std::vector<char*> free_slots_;

  // Per-run state, kept as members so that their capacity is reused.
  struct InFlight {
    int index;
    Request* request;
    char* slot;
  };
  std::vector<InFlight> sends_in_flight_;
  std::vector<InFlight> recvs_in_flight_;
  RecvProgress recv_progress_;
  std::vector<uint8_t> send_done_;
  SendQueues send_queues_;
};

}  // namespace rcoll
