// The handle of one enqueued collective: wait for it, poll it, read its error.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

#include "error.h"

namespace rcoll {

class Work {
 public:
  explicit Work(uint64_t seq) : seq_(seq) {}

  // Waits until the op finished; returns false if `timeout` passed first
  // (negative = wait forever). Throws the op's RcollError if it failed.
  bool wait(std::chrono::milliseconds timeout);
  bool isCompleted() const;
  bool failed() const;
  ErrorKind errorKind() const;
  std::string errorMessage() const;
  uint64_t seq() const { return seq_; }

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
};

}  // namespace rcoll
