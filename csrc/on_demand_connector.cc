#include "on_demand_connector.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "log.h"

namespace rcoll {

namespace {

void signal(int fd) {
  uint64_t one = 1;
  ssize_t ignored = ::write(fd, &one, sizeof(one));
  (void)ignored;
}

void drain(int fd) {
  uint64_t count = 0;
  ssize_t ignored = ::read(fd, &count, sizeof(count));
  (void)ignored;
}

// How often the thread looks again with nothing to wake it: the listener's
// stalled handshakes have deadlines of their own.
constexpr auto kIdleWake = std::chrono::milliseconds(500);

}  // namespace

OnDemandConnector::OnDemandConnector(const ConnectInfo& info, std::unique_ptr<PeerListener> listener,
                                     std::vector<std::string> addresses, const SocketOptions& options, int lanes,
                                     std::chrono::milliseconds dial_timeout)
    : info_(info),
      listener_(std::move(listener)),
      addresses_(std::move(addresses)),
      options_(options),
      lanes_(lanes),
      dial_timeout_(dial_timeout),
      state_(static_cast<size_t>(info.size), PeerState::kIdle),
      accepted_(static_cast<size_t>(info.size) * static_cast<size_t>(lanes), -1) {
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ready_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0 || ready_fd_ < 0) throwError(ErrorKind::kGeneric, "eventfd(): " + errnoText(errno));
  thread_ = std::thread([this] { loop(); });
}

OnDemandConnector::~OnDemandConnector() {
  stop();
  if (thread_.joinable()) thread_.join();
  for (int fd : accepted_) {
    if (fd >= 0) ::close(fd);
  }
  for (const Outcome& o : outcomes_) {
    for (int fd : o.fds) ::close(fd);
  }
  ::close(wake_fd_);
  ::close(ready_fd_);
}

void OnDemandConnector::stop() {
  stopping_.store(true);
  signal(wake_fd_);
}

void OnDemandConnector::want(int peer) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    wanted_.push_back(peer);
  }
  signal(wake_fd_);
}

std::vector<OnDemandConnector::Outcome> OnDemandConnector::take() {
  std::vector<Outcome> taken;
  if (!has_outcomes_.load(std::memory_order_acquire)) return taken;
  std::lock_guard<std::mutex> lock(mutex_);
  drain(ready_fd_);
  taken.swap(outcomes_);
  has_outcomes_.store(false, std::memory_order_release);
  return taken;
}

void OnDemandConnector::deliver(Outcome outcome) {
  state_[static_cast<size_t>(outcome.peer)] = PeerState::kDone;
  // Signalled under the lock, so that take()'s drain always goes with the
  // outcomes it takes: a signal left behind would keep the transport's
  // poll(2) waking with nothing to take.
  std::lock_guard<std::mutex> lock(mutex_);
  outcomes_.push_back(std::move(outcome));
  has_outcomes_.store(true, std::memory_order_release);
  signal(ready_fd_);
}

// A lower rank: every lane, or nothing. Its connector answers at once unless
// it is dialing a rank lower still.
void OnDemandConnector::dial(int peer) {
  Outcome outcome;
  outcome.peer = peer;
  const std::string& address = addresses_[static_cast<size_t>(peer)];
  const auto deadline = std::chrono::steady_clock::now() + dial_timeout_;
  RCOLL_INFO("rank %d: connecting to rank %d on first use (%s)", info_.rank, peer, address.c_str());
  try {
    for (int k = 0; k < lanes_; ++k) {
      outcome.fds.push_back(dialPeer(info_, peer, address, deadline, options_, k, lanes_, true));
    }
  } catch (const RcollError& e) {
    for (int fd : outcome.fds) ::close(fd);
    outcome.fds.clear();
    outcome.failure = {ErrorKind::kPeer, e.what()};
  }
  deliver(std::move(outcome));
}

void OnDemandConnector::loop() {
  std::vector<pollfd> fds;
  while (!stopping_.load()) {
    acceptDialers();
    connectWanted();
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    listener_->appendPollFds(&fds);
    if (::poll(fds.data(), fds.size(), static_cast<int>(kIdleWake.count())) < 0 && errno != EINTR) {
      RCOLL_WARN("rank %d: connections on demand stopped: poll(): %s", info_.rank, errnoText(errno).c_str());
      break;
    }
    drain(wake_fd_);
  }
  listener_->close();
}

// Every peer that dials, those of set-up included: one is delivered once
// every lane of it is in.
void OnDemandConnector::acceptDialers() {
  for (;;) {
    std::vector<bool> taken(accepted_.size());
    for (size_t i = 0; i < taken.size(); ++i) {
      taken[i] = accepted_[i] >= 0 || state_[i / static_cast<size_t>(lanes_)] == PeerState::kDone;
    }
    int fd = -1;
    int lane = 0;
    const int peer = listener_->acceptNow(taken, &fd, &lane);
    if (peer < 0) return;
    accepted_[static_cast<size_t>(peer * lanes_ + lane)] = fd;
    const auto first = accepted_.begin() + peer * lanes_;
    if (std::all_of(first, first + lanes_, [](int f) { return f >= 0; })) {
      Outcome outcome;
      outcome.peer = peer;
      outcome.fds.assign(first, first + lanes_);
      std::fill(first, first + lanes_, -1);
      RCOLL_TRACE("rank %d: rank %d connected", info_.rank, peer);
      deliver(std::move(outcome));
    }
  }
}

// Lower ranks that asked to be dialed, and the peers the transport wants.
void OnDemandConnector::connectWanted() {
  std::vector<int> todo = listener_->takeDialRequests();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    todo.insert(todo.end(), wanted_.begin(), wanted_.end());
    wanted_.clear();
  }
  for (int peer : todo) {
    if (stopping_.load()) return;
    if (peer < 0 || peer >= info_.size || !onDemand(peer) || state_[static_cast<size_t>(peer)] != PeerState::kIdle) {
      continue;
    }
    if (peer < info_.rank) {
      dial(peer);
      continue;
    }
    RCOLL_INFO("rank %d: asking rank %d to connect on first use (%s)", info_.rank, peer,
               addresses_[static_cast<size_t>(peer)].c_str());
    try {
      askToDial(info_, peer, addresses_[static_cast<size_t>(peer)], std::chrono::steady_clock::now() + dial_timeout_,
                options_);
      state_[static_cast<size_t>(peer)] = PeerState::kAsked;  // it dials back; acceptDialers() takes it
    } catch (const RcollError& e) {
      Outcome outcome;
      outcome.peer = peer;
      outcome.failure = {ErrorKind::kPeer, e.what()};
      deliver(std::move(outcome));
    }
  }
}

}  // namespace rcoll
