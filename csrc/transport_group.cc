#include "transport_group.h"

#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "error.h"
#include "socket_util.h"

namespace rcoll {

TransportGroup::TransportGroup(const ConnectInfo& info, std::vector<std::unique_ptr<Transport>> children,
                               std::chrono::microseconds spin)
    : info_(info), children_(std::move(children)), spin_(spin) {
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throwError(ErrorKind::kGeneric, "eventfd(): " + errnoText(errno));
}

TransportGroup::~TransportGroup() {
  children_.clear();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void TransportGroup::progress(std::chrono::milliseconds timeout) {
  const Deadline deadline = std::chrono::steady_clock::now() + timeout;
  auto last_move = std::chrono::steady_clock::now();
  for (;;) {
    const Activity activity = progressNow();
    if (activity == Activity::kFinished) return;
    if (interrupted_.load(std::memory_order_acquire)) {
      takeInterrupt();
      return;
    }
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline) return;
    if (activity == Activity::kMoved) {
      last_move = now;
      continue;
    }
    // Poll every child for RCOLL_SPIN_US after the last byte moved before
    // sleeping, as the shm transport does (shm_transport.cc explains the sched_yield()).
    if (now - last_move < spin_) {
      sched_yield();
      continue;
    }
    if (sleep(deadline)) return;
    last_move = std::chrono::steady_clock::now();
  }
}

Activity TransportGroup::progressNow() {
  Activity most = Activity::kIdle;
  for (auto& child : children_) most = std::max(most, child->progressNow());
  return most;
}

// One poll() over every child's descriptors and the interrupt eventfd. Returns
// true when interrupted or when a child finished a request while waking.
bool TransportGroup::sleep(Deadline deadline) {
  poll_fds_.clear();
  poll_fds_.push_back({wake_fd_, POLLIN, 0});
  child_fds_.clear();
  bool may_sleep = true;
  size_t prepared = 0;
  for (auto& child : children_) {
    child_fds_.push_back(poll_fds_.size());
    ++prepared;
    if (!child->prepareSleep(&poll_fds_)) {
      may_sleep = false;  // work is waiting there: look again instead of sleeping
      break;
    }
  }
  child_fds_.push_back(poll_fds_.size());
  int rc = 0;
  int err = 0;
  if (may_sleep && !interrupted_.load(std::memory_order_relaxed)) {
    // Rounded up: a sub-millisecond remainder must sleep, not spin on poll(0).
    const auto left = deadline - std::chrono::steady_clock::now();
    const auto ms = std::min(
        std::chrono::duration_cast<std::chrono::milliseconds>(left + std::chrono::microseconds(999)), maxSleep());
    const int wait_ms = static_cast<int>(std::max<long long>(0, std::min<long long>(ms.count(), 1 << 30)));
    rc = ::poll(poll_fds_.data(), poll_fds_.size(), wait_ms);
    if (rc < 0) err = errno;
  }
  // Every child that announced a sleep withdraws it, whatever happened.
  bool finished = false;
  for (size_t i = 0; i < prepared; ++i) {
    const size_t begin = child_fds_[i], end = child_fds_[i + 1];
    finished |= children_[i]->finishSleep(poll_fds_.data() + begin, end - begin) == Activity::kFinished;
  }
  if (rc < 0 && err != EINTR) throwError(ErrorKind::kGeneric, "poll(): " + errnoText(err));
  if (rc > 0 && (poll_fds_[0].revents & POLLIN)) {
    takeInterrupt();
    return true;
  }
  return finished;
}

std::chrono::milliseconds TransportGroup::maxSleep() const {
  auto most = std::chrono::milliseconds::max();
  for (const auto& child : children_) most = std::min(most, child->maxSleep());
  return most;
}

bool TransportGroup::prepareSleep(std::vector<pollfd>* fds) {
  child_fds_.clear();
  for (auto& child : children_) {
    child_fds_.push_back(fds->size());
    if (!child->prepareSleep(fds)) {
      child_fds_.push_back(fds->size());
      return false;
    }
  }
  child_fds_.push_back(fds->size());
  return true;
}

Activity TransportGroup::finishSleep(const pollfd* fds, size_t count) {
  // `fds` starts where prepareSleep() began appending: offsets are relative to the first child's start.
  Activity most = Activity::kIdle;
  const size_t base = child_fds_.empty() ? 0 : child_fds_.front();
  for (size_t i = 0; i + 1 < child_fds_.size(); ++i) {
    const size_t begin = child_fds_[i] - base, end = child_fds_[i + 1] - base;
    const size_t n = end <= count ? end - begin : 0;
    most = std::max(most, children_[i]->finishSleep(n > 0 ? fds + begin : nullptr, n));
  }
  return most;
}

void TransportGroup::takeInterrupt() {
  interrupted_.store(false, std::memory_order_relaxed);
  drainEventfd(wake_fd_);
}

void TransportGroup::interrupt() {
  interrupted_.store(true, std::memory_order_release);
  signalEventfd(wake_fd_);
}

void TransportGroup::abortPeers(ErrorKind kind, const std::string& message) {
  for (auto& child : children_) child->abortPeers(kind, message);
}

void TransportGroup::settleAbort() {
  for (auto& child : children_) child->settleAbort();
}

std::vector<int> TransportGroup::lostPeers() const {
  std::vector<int> lost;
  for (const auto& child : children_) {
    for (int peer : child->lostPeers()) lost.push_back(peer);
  }
  std::sort(lost.begin(), lost.end());  // rails: every child serves the same peers
  lost.erase(std::unique(lost.begin(), lost.end()), lost.end());
  return lost;
}

void TransportGroup::edgeTraffic(std::vector<EdgeTraffic>* out) const {
  for (const auto& child : children_) child->edgeTraffic(out);
}

}  // namespace rcoll
