#include "composite_transport.h"

#include <sched.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <sstream>

#include "log.h"
#include "socket_util.h"

namespace rcoll {

CompositeTransport::CompositeTransport(const ConnectInfo& info, std::vector<std::unique_ptr<Transport>> children,
                                       std::vector<int> route, std::chrono::microseconds spin)
    : info_(info), spin_(spin), children_(std::move(children)), route_(std::move(route)) {
  if (route_.size() != static_cast<size_t>(info_.size)) {
    throwError(ErrorKind::kGeneric,
               strFormat("rank %d: a composite transport needs a route for each of %d ranks", info_.rank, info_.size));
  }
  for (size_t i = 0; i < children_.size(); ++i) {
    std::vector<bool> served(route_.size());
    for (size_t p = 0; p < route_.size(); ++p) served[p] = route_[p] == static_cast<int>(i);
    children_[i]->setPeers(served);
    if (children_[i]->needsRegistration()) {
      if (registrar_ != nullptr) {
        throwError(ErrorKind::kGeneric, strFormat("rank %d: two transports of one composite need memory "
                                                  "registration (%s and %s)",
                                                  info_.rank, registrar_->name(), children_[i]->name()));
      }
      registrar_ = children_[i].get();
    }
    if (i > 0) name_ += "+";
    name_ += children_[i]->name();
  }
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) throwError(ErrorKind::kGeneric, "eventfd(): " + errnoText(errno));
}

CompositeTransport::~CompositeTransport() {
  children_.clear();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

Transport& CompositeTransport::childOf(int peer) const {
  if (peer < 0 || peer >= info_.size || route_[static_cast<size_t>(peer)] < 0) {
    throwError(ErrorKind::kInvalidArgument, strFormat("rank %d: rank %d is not a peer of this communicator (size %d)",
                                                      info_.rank, peer, info_.size));
  }
  return *children_[static_cast<size_t>(route_[static_cast<size_t>(peer)])];
}

const char* CompositeTransport::transportOf(int peer) const {
  if (peer == info_.rank) return "self";
  return childOf(peer).name();
}

// --- set-up --------------------------------------------------------------------

std::string CompositeTransport::listenAddress() const {
  std::string out;
  for (auto& child : children_) {
    if (!out.empty()) out += ' ';
    out += listenAddresses(*child);
  }
  return out;
}

void CompositeTransport::connect(int peer, const std::string& address, Deadline deadline) {
  childOf(peer).connect(peer, address, deadline);
}

int CompositeTransport::accept(Deadline deadline) {
  // Child by child, each until its higher peers are in (see the header for why
  // this cannot deadlock).
  for (auto& child : children_) {
    for (int peer = info_.rank + 1; peer < info_.size; ++peer) {
      if (child->serves(peer) && !child->connected(peer)) return child->accept(deadline);
    }
  }
  throwError(ErrorKind::kGeneric, strFormat("rank %d: accept() with every higher rank connected", info_.rank));
}

void CompositeTransport::closeListener() {
  for (auto& child : children_) child->closeListener();
}

bool CompositeTransport::canConnectOnDemand(int peer) const { return childOf(peer).canConnectOnDemand(peer); }

// Each child gets the addresses of its own peers.
void CompositeTransport::connectOnDemand(const std::vector<std::string>& addresses) {
  for (auto& child : children_) {
    std::vector<std::string> mine(addresses.size());
    for (size_t p = 0; p < addresses.size(); ++p) {
      if (child->serves(static_cast<int>(p))) mine[p] = addresses[p];
    }
    child->connectOnDemand(mine);
  }
}

bool CompositeTransport::connected(int peer) const {
  if (peer < 0 || peer >= info_.size || route_[static_cast<size_t>(peer)] < 0) return false;
  return childOf(peer).connected(peer);
}

// --- memory --------------------------------------------------------------------

MemoryHandle CompositeTransport::registerMemory(void* data, size_t bytes) {
  return registrar_ != nullptr ? registrar_->registerMemory(data, bytes) : nullptr;
}

MemoryHandle CompositeTransport::registerDeviceMemory(void*, size_t, int, uint64_t, std::string* why) {
  *why = "this rank's edges mix transports (" + name_ + "): GPUDirect RDMA needs every edge on verbs";
  return nullptr;
}

void CompositeTransport::deregisterMemory(MemoryHandle handle) {
  if (registrar_ != nullptr) registrar_->deregisterMemory(handle);
}

void CompositeTransport::invalidateMemory(const void* data, size_t bytes) {
  for (auto& child : children_) child->invalidateMemory(data, bytes);
}

// --- data path -----------------------------------------------------------------

Request* CompositeTransport::isend(int peer, const WireHeader& header, const void* data, size_t bytes) {
  return childOf(peer).isend(peer, header, data, bytes);
}

Request* CompositeTransport::irecv(int peer, const WireHeader& expected, void* data, size_t bytes) {
  return childOf(peer).irecv(peer, expected, data, bytes);
}

bool CompositeTransport::canPeek(int peer) const { return childOf(peer).canPeek(peer); }

bool CompositeTransport::peekIncoming(int peer, WireHeader* header) { return childOf(peer).peekIncoming(peer, header); }

TransportFailure CompositeTransport::failure(Request* request) const { return childOf(request->peer).failure(request); }

void CompositeTransport::release(Request* request) { childOf(request->peer).release(request); }

// --- waiting -------------------------------------------------------------------

void CompositeTransport::progress(std::chrono::milliseconds timeout) {
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

Activity CompositeTransport::progressNow() {
  Activity most = Activity::kIdle;
  for (auto& child : children_) most = std::max(most, child->progressNow());
  return most;
}

// One poll() over every child's descriptors and the interrupt eventfd. Returns
// true when interrupted or when a child finished a request while waking.
bool CompositeTransport::sleep(Deadline deadline) {
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
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(left + std::chrono::microseconds(999));
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

bool CompositeTransport::prepareSleep(std::vector<pollfd>* fds) {
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

Activity CompositeTransport::finishSleep(const pollfd* fds, size_t count) {
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

void CompositeTransport::takeInterrupt() {
  interrupted_.store(false, std::memory_order_relaxed);
  drainEventfd(wake_fd_);
}

void CompositeTransport::interrupt() {
  interrupted_.store(true, std::memory_order_release);
  signalEventfd(wake_fd_);
}

void CompositeTransport::abortPeers(ErrorKind kind, const std::string& message) {
  for (auto& child : children_) child->abortPeers(kind, message);
}

void CompositeTransport::settleAbort() {
  for (auto& child : children_) child->settleAbort();
}

std::vector<int> CompositeTransport::lostPeers() const {
  std::vector<int> lost;
  for (const auto& child : children_) {
    for (int peer : child->lostPeers()) lost.push_back(peer);
  }
  return lost;  // the children serve disjoint peers: no duplicates
}

// --- published addresses ---------------------------------------------------------

std::string listenAddresses(const Transport& transport) {
  if (auto* composite = dynamic_cast<const CompositeTransport*>(&transport)) return composite->listenAddress();
  return std::string(transport.name()) + "=" + transport.listenAddress();
}

std::string pickAddress(const std::string& published, const std::string& kind, int rank, int peer) {
  std::istringstream in(published);
  std::string entry;
  const std::string prefix = kind + "=";
  while (in >> entry) {
    if (entry.compare(0, prefix.size(), prefix) == 0) return entry.substr(prefix.size());
  }
  throwError(ErrorKind::kConfig,
             strFormat("rank %d: rank %d runs no %s listener (it published \"%s\"): the two ranks chose different "
                       "transports for their edge; is the same rcoll installed on both?",
                       rank, peer, kind.c_str(), published.c_str()));
}

}  // namespace rcoll
