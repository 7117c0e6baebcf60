#include "work.h"

namespace rcoll {

bool Work::wait(std::chrono::milliseconds timeout) {
  if (timeout.count() < 0) {
    // Bounded waits never run the op: it could outlast their bound.
    if (auto runner = runner_.lock()) runner->runInline(*this);
  }
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

void CompletionQueue::push(uint64_t token) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tokens_.push_back(token);
  }
  cv_.notify_one();
}

bool CompletionQueue::pop(uint64_t* token, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!cv_.wait_for(lock, timeout, [&] { return closed_ || !tokens_.empty(); }) || closed_) return false;
  *token = tokens_.front();
  tokens_.pop_front();
  return true;
}

void CompletionQueue::close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
  }
  cv_.notify_all();
}

bool CompletionQueue::closed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return closed_;
}

bool Work::notifyOnCompletion(std::shared_ptr<CompletionQueue> queue, uint64_t token) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (done_) return false;
  queue_ = std::move(queue);
  token_ = token;
  return true;
}

void Work::markDone() {
  std::shared_ptr<CompletionQueue> queue;
  uint64_t token = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
    queue.swap(queue_);
    token = token_;
  }
  done_cv_.notify_all();
  if (queue) queue->push(token);
}

void Work::markFailed(ErrorKind kind, const std::string& message) {
  std::shared_ptr<CompletionQueue> queue;
  uint64_t token = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    done_ = true;
    failed_ = true;
    kind_ = kind;
    message_ = message;
    queue.swap(queue_);
    token = token_;
  }
  done_cv_.notify_all();
  if (queue) queue->push(token);
}

}  // namespace rcoll
