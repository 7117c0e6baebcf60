// The handle of one enqueued collective: wait for it, poll it, read its error.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "error.h"

namespace rcoll {

class DeviceEvent;  // device_runtime.h

// Where finished works announce themselves, for a consumer thread that must not
// be the progress thread (torch futures run user callbacks inline: completing
// them on the progress thread would deadlock a callback that waits on another op).
class CompletionQueue {
 public:
  void push(uint64_t token);
  // Waits up to `timeout` for a token; false if none came or the queue is closed.
  bool pop(uint64_t* token, std::chrono::milliseconds timeout);
  // Wakes every pop() and makes later ones return false at once: the consumer
  // thread is told to stop (before the interpreter finalizes; torch_backend.py).
  void close();
  bool closed() const;

 private:
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<uint64_t> tokens_;
  bool closed_ = false;
};

class Work;

// Whoever can run a queued op on the thread that waits for it (the
// communicator: see Communicator::runInline). Does nothing if the op is not
// next in line or something else runs.
class InlineRunner {
 public:
  virtual ~InlineRunner() = default;
  virtual void runInline(const Work& work) = 0;
};

class Work {
 public:
  explicit Work(uint64_t seq) : seq_(seq) {}

  // Waits until the op finished; returns false if `timeout` passed first
  // (negative = wait forever). Throws the op's RcollError if it failed. An
  // untimed wait first offers to run the op itself (setInlineRunner): a
  // waiter has nothing better to do, and it saves two thread wake-ups.
  bool wait(std::chrono::milliseconds timeout);
  void setInlineRunner(std::weak_ptr<InlineRunner> runner) { runner_ = std::move(runner); }
  bool isCompleted() const;
  bool failed() const;
  ErrorKind errorKind() const;
  std::string errorMessage() const;
  uint64_t seq() const { return seq_; }

  // Pushes `token` to `queue` when the op finishes. Returns false (and pushes
  // nothing) if it has finished already.
  bool notifyOnCompletion(std::shared_ptr<CompletionQueue> queue, uint64_t token);

  // Ops on device memory: the event recorded after the op's last copy or
  // kernel, for callers that order their own stream after the op
  // (torch's work.wait()). Set once, before the work is handed out.
  void setDeviceCompletion(std::shared_ptr<DeviceEvent> event) { device_completion_ = std::move(event); }
  const std::shared_ptr<DeviceEvent>& deviceCompletion() const { return device_completion_; }

  // Point-to-point receives: the rank the message came from (-1 until a
  // receive from any source has found its sender). Set before markDone().
  void setSourceRank(int rank) { source_rank_.store(rank, std::memory_order_release); }
  int sourceRank() const { return source_rank_.load(std::memory_order_acquire); }

  // Called by the progress thread, exactly once.
  void markDone();
  void markFailed(ErrorKind kind, const std::string& message);

 private:
  const uint64_t seq_;
  mutable std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  bool failed_ = false;
  ErrorKind kind_ = ErrorKind::kGeneric;
  std::string message_;
  std::shared_ptr<CompletionQueue> queue_;
  uint64_t token_ = 0;
  std::weak_ptr<InlineRunner> runner_;  // set before the Work is shared, then read only
  std::shared_ptr<DeviceEvent> device_completion_;
  std::atomic<int> source_rank_{-1};
};

}  // namespace rcoll
