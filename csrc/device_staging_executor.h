// Runs a Schedule whose buffers live in device (GPU) memory, through pinned
// host staging slots, over any Transport.
//
// The algorithms are the same as for host memory (schedule.h knows nothing of
// memory kinds); only the way a segment reaches the wire differs:
//
//   send:  device data --D2H (copy stream)--> pinned send slot --> transport
//   recv:  transport --> pinned recv slot --H2D (reduce stream)--> device
//          destination, or device scratch + reduction kernel for reduced steps
//
// Copies and kernels are asynchronous; every slot carries an event, polled
// without blocking in the same loop that drives the transport, so the D2H of
// segment k+1, the network transfer of segment k and the H2D + reduction of
// segment k-1 overlap. D2H and H2D run on two streams so that both copy
// engines work at once. A send that forwards a received segment
// (SendStep::after_recv) starts its D2H once that segment's event completed;
// sends wait in one queue per peer (send_queues.h), so one that waits holds
// back only its own peer's.
//
// Slots are allocated once (pinned with the device API's host_alloc) and
// registered once with the transport (verbs); user buffers are never given to
// the transport.
//
// GPUDirect RDMA (RCOLL_GDR): where the transport can register device memory
// (verbs, with the GPU's memory as a dma-buf or through nvidia-peermem), the
// slots are device memory instead and the NIC reads and writes them itself:
//
//   send:  device data --D2D--> device send slot --> NIC
//   recv:  NIC --> device recv slot --> reduction kernel (or D2D) --> destination
//
// The schedule, the events and the loop are the same; only the copies change
// kind, and the PCIe round trip through host memory is gone. Before a kernel
// reads a slot that the NIC wrote, flush_rdma_writes() makes those writes
// visible to it (some platforms let a completion overtake the data).
//
// The CPU path (pipeline_executor.h) is untouched: the communicator picks this
// executor once per op, never per segment.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "config.h"
#include "device_runtime.h"
#include "local_memory.h"
#include "schedule.h"
#include "send_queues.h"
#include "socket_util.h"
#include "transport.h"

namespace rcoll {

// The local steps of the op table (op_table.h) run here on the device: copies
// and scaling on the executor's stream, scratch in device memory.
class DeviceStagingExecutor final : public LocalMemory {
 public:
  // `gdr`: RCOLL_GDR. kOn throws RcollError(kConfig) naming why when GPUDirect
  // RDMA is impossible; kAuto then stages through pinned host memory.
  DeviceStagingExecutor(Transport* transport, const DeviceApi& api, int device, int rank, int size, uint64_t comm_id,
                        size_t slot_bytes, int num_slots, Config::Gdr gdr);
  ~DeviceStagingExecutor();
  DeviceStagingExecutor(const DeviceStagingExecutor&) = delete;
  DeviceStagingExecutor& operator=(const DeviceStagingExecutor&) = delete;

  int device() const { return device_; }
  // Whether segments go between device memory and the NIC (GPUDirect RDMA).
  bool gdr() const { return gdr_; }

  // One op: begin() orders the op's streams after the caller's `ready` event
  // (null: nothing to wait for); local steps (copies, scaling) and run() follow;
  // finish() records `done` (may be null) and returns once every copy and
  // kernel of the op has completed. `context` ("rank 0: allreduce(...) (op #3)")
  // prefixes every error. After a failure, abandon() waits for the device.
  void begin(const DeviceEvent* ready, const std::string& context);
  void copy(char* dst, const char* src, size_t bytes) override;
  void scaleDivide(char* buf, size_t count, DataType dtype, size_t divisor) override;
  // Device memory for partial results, grown on demand (between ops only).
  char* scratch(size_t bytes) override;
  void run(const Schedule& schedule, Deadline deadline, std::chrono::milliseconds timeout,
           const std::atomic<bool>& abort_flag);
  void finish(DeviceEvent* done, Deadline deadline, std::chrono::milliseconds timeout,
              const std::atomic<bool>& abort_flag);
  void abandon();

  std::chrono::steady_clock::time_point firstCompletion() const { return first_completion_; }

 private:
  struct Slot {
    char* wire = nullptr;    // what the transport sends from or receives into (registered):
                             // pinned host memory, or device memory with GPUDirect RDMA
    char* device = nullptr;  // recv slots: where a reduced segment is on the device for the
                             // kernel (== wire with GPUDirect RDMA)
    std::unique_ptr<DeviceEvent> event;
  };
  struct InFlight {
    int index;         // step index in the schedule
    int slot;          // -1: zero-byte message, no slot
    Request* request;  // null until posted
  };

  void setUp(Config::Gdr gdr, size_t slot_bytes, int num_slots);
  void releaseResources();  // idempotent: the destructor, or a constructor that threw
  void check(int rc, const char* what);
  // Allocates the slots in device memory and registers them for the NIC;
  // false (with everything undone) when that is impossible, after logging
  // why, or throwing it when `required`.
  bool setUpGdr(size_t bytes, bool required);
  bool harvest(const Schedule& schedule, size_t* sends_done, size_t* recvs_done);
  // Polls without blocking: the device work in flight keeps the loop spinning.
  void waitForProgress(Deadline deadline, bool device_busy);
  [[noreturn]] void fail(const Schedule& schedule, ErrorKind kind, const std::string& why);
  [[noreturn]] void timeout(const Schedule& schedule, std::chrono::milliseconds limit);
  void releaseAll();

  Transport* transport_;  // null in a world of size 1
  const DeviceApi& api_;
  int device_;
  int rank_;
  int size_;
  uint64_t comm_id_;
  std::string context_;
  void* d2h_stream_ = nullptr;                // D2H of sends, and the op's local steps
  void* h2d_stream_ = nullptr;                // H2D of receives and the reduction kernels
  std::unique_ptr<DeviceEvent> join_event_;   // orders one stream after the other
  char* host_memory_ = nullptr;               // pinned slots (staging); null with GPUDirect RDMA
  char* device_memory_ = nullptr;             // recv slots' device side; every slot with GPUDirect RDMA
  MemoryHandle wire_registration_ = nullptr;  // of what the transport touches
  bool gdr_ = false;
  char* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  std::vector<Slot> send_slots_, recv_slots_;
  std::vector<int> free_send_slots_, free_recv_slots_;
  std::chrono::steady_clock::time_point first_completion_{};

  // Per-run state, members so that their capacity is reused.
  SendQueues send_queues_;
  std::vector<InFlight> staging_;  // D2H issued, not yet on the wire (in issue order)
  std::vector<InFlight> sends_posted_;
  std::vector<InFlight> recvs_posted_;   // on the wire
  std::vector<InFlight> recvs_landing_;  // H2D (+ reduction) queued, event pending
  RecvProgress recv_progress_;
};

}  // namespace rcoll
