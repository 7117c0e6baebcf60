#include "work.h"

namespace rcoll {

bool Work::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout.count() < 0) {
    done_cv_.wait(lock, [&] { return done_; });
  } else if (!done_cv_.wait_for(lock, timeout, [&] { return done_; })) {
    return false;
  }
  if (failed_) throw RcollError(kind_, message_);
  return true;
}

bool Work::isCompleted() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return done_;
}

bool Work::failed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failed_;
}

ErrorKind Work::errorKind() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return kind_;
}

std::string Work::errorMessage() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return message_;
}

void Work::markDone() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
  }
  done_cv_.notify_all();
}

void Work::markFailed(ErrorKind kind, const std::string& message) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
    failed_ = true;
    kind_ = kind;
    message_ = message;
  }
  done_cv_.notify_all();
}

}  // namespace rcoll
