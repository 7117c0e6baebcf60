// A communicator: `size` ranks that rendezvoused through a store and hold a
// connection to each other, plus the progress thread that runs their
// collectives.
//
// Every collective call validates its arguments on the caller's thread (a bad
// call raises at once and consumes no sequence number), then enqueues the op
// and returns a Work handle. The progress thread runs ops strictly in issue
// order, which is what keeps every rank's op #n the same op. The first failure
// poisons the communicator: the peers are told why, and every pending and later
// op fails with that cause instead of hanging.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "config.h"
#include "dtype.h"
#include "pipeline_executor.h"
#include "schedule.h"
#include "store.h"
#include "transport.h"
#include "wire.h"
#include "work.h"

namespace rcoll {

struct CommunicatorOptions {
  std::string name = "default";  // store namespace; communicators on one store need distinct names
  std::chrono::milliseconds timeout{0};  // per-op default; 0 = RCOLL_TIMEOUT or 30 min
  std::string bind_hint;         // address to bind data sockets to when RCOLL_SOCKET_IFNAME is unset
};

class Communicator {
 public:
  // Rendezvous and connection set-up; blocks until every rank has joined (or
  // RCOLL_CONNECT_TIMEOUT passes). Call without holding the GIL.
  Communicator(std::shared_ptr<Store> store, int rank, int size, const CommunicatorOptions& options);
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  uint64_t commId() const { return info_.comm_id; }
  const char* transportName() const;
  const Config& config() const { return config_; }
  std::chrono::milliseconds defaultTimeout() const { return timeout_; }

  // `timeout` 0 = the communicator's default. `send` may equal `recv`.
  std::shared_ptr<Work> allreduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                                  std::chrono::milliseconds timeout = {});
  // `send`: count elements; `recv`: size*count elements (in place when send == recv + rank*count).
  std::shared_ptr<Work> allgather(const void* send, void* recv, size_t count, DataType dtype,
                                  std::chrono::milliseconds timeout = {});
  // `send`: size*count elements; `recv`: count elements, block `rank` of the reduction.
  std::shared_ptr<Work> reduceScatter(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                                      std::chrono::milliseconds timeout = {});
  // The root's `send` reaches every rank's `recv` (the root's too).
  std::shared_ptr<Work> broadcast(const void* send, void* recv, size_t count, DataType dtype, int root,
                                  std::chrono::milliseconds timeout = {});
  std::shared_ptr<Work> barrier(std::chrono::milliseconds timeout = {});

  // Fails the running and every queued op at once, tells the peers, and makes
  // the communicator unusable. Safe from any thread; returns without waiting.
  void abort(const std::string& reason);
  // Runs what is queued to completion (each op bounded by its timeout), then
  // closes the connections. Later calls raise.
  void shutdown();
  // "" while healthy, else the first error.
  std::string poisonMessage() const;

 private:
  struct Op {
    OpDesc desc;
    const char* send;
    char* recv;
    std::chrono::milliseconds timeout;
    std::shared_ptr<Work> work;
  };

  void rendezvous(Store& store, const std::string& bind_hint);
  std::shared_ptr<Work> enqueue(OpKind kind, DataType dtype, ReduceOp op, uint32_t root, size_t count,
                                const void* send, void* recv, std::chrono::milliseconds timeout);
  void progressLoop();
  void runOp(const Op& op);
  void poison(ErrorKind kind, const std::string& message);
  void stopThread();

  int rank_;
  int size_;
  std::string name_;
  Config config_;
  std::chrono::milliseconds timeout_;
  ConnectInfo info_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<PipelineExecutor> executor_;
  Schedule schedule_;                // reused by every op on the progress thread
  std::vector<char> scratch_;        // reduce-scatter partial sums, grown on demand

  mutable std::mutex mutex_;
  std::condition_variable queue_cv_;
  std::deque<Op> queue_;
  uint64_t next_seq_ = 1;
  bool stopping_ = false;           // shutdown(): no new ops, finish the queue
  bool closed_ = false;
  ErrorKind poison_kind_ = ErrorKind::kGeneric;
  std::string poison_message_;      // sticky first error
  std::atomic<bool> abort_flag_{false};
  std::string abort_reason_;
  std::thread thread_;
};

}  // namespace rcoll
