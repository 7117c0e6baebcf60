#include "on_demand_connector.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "log.h"

namespace rcoll {

namespace {

// How often the thread looks again with nothing to wake it: the listener's
// stalled handshakes have deadlines of their own.
constexpr auto kIdleWake = std::chrono::milliseconds(500);
// How often a note is sent again to a higher rank that has not dialed yet.
constexpr auto kNoteInterval = std::chrono::seconds(1);

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
      sockets_(static_cast<size_t>(info.size) * static_cast<size_t>(lanes), -1),
      asked_until_(static_cast<size_t>(info.size)),
      next_note_(static_cast<size_t>(info.size)) {
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  ready_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0 || ready_fd_ < 0) {
    const int err = errno;
    if (wake_fd_ >= 0) ::close(wake_fd_);
    if (ready_fd_ >= 0) ::close(ready_fd_);
    throwError(ErrorKind::kGeneric, "eventfd(): " + errnoText(err));
  }
  thread_ = std::thread([this] { loop(); });
}

// Nothing here blocks for long: dials are non-blocking, so stop() ends the
// thread within one poll.
OnDemandConnector::~OnDemandConnector() {
  stop();
  if (thread_.joinable()) thread_.join();
  dials_.clear();
  for (int fd : sockets_) {
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
  signalEventfd(wake_fd_);
}

void OnDemandConnector::want(int peer) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    wanted_.push_back(peer);
  }
  signalEventfd(wake_fd_);
}

std::vector<OnDemandConnector::Outcome> OnDemandConnector::take() {
  std::vector<Outcome> taken;
  if (!has_outcomes_.load(std::memory_order_acquire)) return taken;
  std::lock_guard<std::mutex> lock(mutex_);
  drainEventfd(ready_fd_);
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
  signalEventfd(ready_fd_);
}

void OnDemandConnector::closeLanes(int peer) {
  for (int k = 0; k < lanes_; ++k) {
    int& fd = sockets_[static_cast<size_t>(peer * lanes_ + k)];
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
}

void OnDemandConnector::deliverFailure(int peer, const TransportFailure& failure) {
  // The peer's other lanes: what was connected closes, what was dialing stops.
  closeLanes(peer);
  dials_.erase(std::remove_if(dials_.begin(), dials_.end(), [&](const auto& d) { return d->peer() == peer; }),
               dials_.end());
  Outcome outcome;
  outcome.peer = peer;
  outcome.failure = failure;
  deliver(std::move(outcome));
}

void OnDemandConnector::loop() {
  std::vector<pollfd> fds;
  while (!stopping_.load()) {
    acceptDialers();
    connectWanted();
    finishDials();
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    listener_->appendPollFds(&fds);
    const size_t first_dial = fds.size();
    auto wake = std::chrono::steady_clock::now() + kIdleWake;
    for (const auto& d : dials_) {
      fds.push_back(d->pollFd());
      wake = std::min(wake, d->deadline());
    }
    for (int peer : asked_) {
      wake = std::min({wake, next_note_[static_cast<size_t>(peer)], asked_until_[static_cast<size_t>(peer)]});
    }
    // Lanes of a peer whose other lanes are not connected yet: watched for
    // the dialer closing them (its dial of another lane failed).
    const size_t first_partial = fds.size();
    for (int fd : sockets_) {
      if (fd >= 0) fds.push_back({fd, POLLRDHUP, 0});
    }
    if (::poll(fds.data(), fds.size(), std::max(1, millisecondsUntil(wake))) < 0 && errno != EINTR) {
      // ENOMEM: try again shortly; the dials' and notes' deadlines still hold.
      RCOLL_WARN("rank %d: connections on demand: poll(): %s", info_.rank, errnoText(errno).c_str());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    drainEventfd(wake_fd_);
    for (size_t k = 0; k < dials_.size(); ++k) dials_[k]->step(fds[first_dial + k].revents);
    // Dials that just finished first: a set they complete is delivered (its
    // entries leave sockets_), so a lane the peer already used and closed (it
    // sent, then shut down) is no longer an early close: its data waits in
    // the socket for the transport. Nothing here opens a descriptor, so a
    // number in fds[] still names the same socket.
    finishDials();
    for (size_t k = first_partial; k < fds.size(); ++k) {
      if ((fds[k].revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0) partialLaneClosed(fds[k].fd);
    }
  }
  listener_->close();
}

// Every peer that dials, those of set-up included.
void OnDemandConnector::acceptDialers() {
  for (;;) {
    std::vector<bool> taken(sockets_.size());
    for (size_t i = 0; i < taken.size(); ++i) {
      taken[i] = sockets_[i] >= 0 || state_[i / static_cast<size_t>(lanes_)] == PeerState::kDone;
    }
    int fd = -1;
    int lane = 0;
    const int peer = listener_->acceptNow(taken, &fd, &lane);
    if (peer < 0) return;
    laneConnected(peer, lane, fd);
  }
}

// A peer is delivered once every lane of it is connected.
void OnDemandConnector::laneConnected(int peer, int lane, int fd) {
  sockets_[static_cast<size_t>(peer * lanes_ + lane)] = fd;
  const auto first = sockets_.begin() + peer * lanes_;
  if (!std::all_of(first, first + lanes_, [](int f) { return f >= 0; })) return;
  Outcome outcome;
  outcome.peer = peer;
  outcome.fds.assign(first, first + lanes_);
  std::fill(first, first + lanes_, -1);
  RCOLL_TRACE("rank %d: rank %d connected", info_.rank, peer);
  deliver(std::move(outcome));
}

// A peer that closes a lane before all of them are connected gave up on this
// rank: a dialer whose dial of another lane failed closes the lanes it had
// (deliverFailure on its side), and so does a process that exits. It counts
// this rank unreachable, so this rank fails it too, now rather than when a
// note would time out. A peer of set-up has its lanes closed and nothing
// more: set-up fails on its own.
void OnDemandConnector::partialLaneClosed(int fd) {
  const auto at = std::find(sockets_.begin(), sockets_.end(), fd);
  if (at == sockets_.end()) return;  // its peer was already given up in this pass
  const int peer = static_cast<int>((at - sockets_.begin()) / lanes_);
  const std::string text = strFormat(
      "rank %d: rank %d closed a connection to this rank before all %d sockets between them were "
      "connected (it failed to connect another, its error says why, or it exited)",
      info_.rank, peer, lanes_);
  RCOLL_INFO("%s", text.c_str());
  if (onDemand(peer)) {
    deliverFailure(peer, {ErrorKind::kPeer, text});
  } else {
    closeLanes(peer);
  }
}

// Lower ranks that asked to be dialed and the peers the transport wants:
// every lane of a lower rank is dialed at once; a higher rank gets a note.
void OnDemandConnector::connectWanted() {
  std::vector<int> todo = listener_->takeDialRequests();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    todo.insert(todo.end(), wanted_.begin(), wanted_.end());
    wanted_.clear();
  }
  const auto now = std::chrono::steady_clock::now();
  for (int peer : todo) {
    if (peer < 0 || peer >= info_.size || !onDemand(peer) || state_[static_cast<size_t>(peer)] != PeerState::kIdle) {
      continue;
    }
    const std::string& address = addresses_[static_cast<size_t>(peer)];
    if (peer < info_.rank) {
      RCOLL_INFO("rank %d: connecting to rank %d on first use (%s)", info_.rank, peer, address.c_str());
      state_[static_cast<size_t>(peer)] = PeerState::kDialing;
      for (int k = 0; k < lanes_; ++k) {
        dials_.push_back(std::make_unique<PendingDial>(info_, peer, laneAddress(address, k), options_, k, lanes_, false,
                                                       now + dial_timeout_));
      }
      continue;
    }
    RCOLL_INFO("rank %d: asking rank %d to connect on first use (%s)", info_.rank, peer, address.c_str());
    state_[static_cast<size_t>(peer)] = PeerState::kAsked;
    asked_.push_back(peer);
    asked_until_[static_cast<size_t>(peer)] = now + dial_timeout_;
    next_note_[static_cast<size_t>(peer)] = now;
  }
  // Notes: the first at once, then one a second until the peer dials; a note
  // that is refused tells this rank the peer is gone (finishDials).
  for (size_t i = 0; i < asked_.size();) {
    const int peer = asked_[i];
    const auto p = static_cast<size_t>(peer);
    if (state_[p] != PeerState::kAsked) {  // it dialed, or failed
      asked_[i] = asked_.back();
      asked_.pop_back();
      continue;
    }
    if (now >= asked_until_[p]) {
      deliverFailure(
          peer,
          {ErrorKind::kTimeout,
           strFormat("rank %d: asked rank %d to connect %lld s ago and it has not (is it stuck?)", info_.rank, peer,
                     static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(dial_timeout_).count()))});
      continue;  // state kDone: removed on the next pass
    }
    if (now >= next_note_[p]) {
      next_note_[p] = now + kNoteInterval;
      dials_.push_back(std::make_unique<PendingDial>(info_, peer, laneAddress(addresses_[p], 0), options_, 0, lanes_,
                                                     true, std::min(asked_until_[p], now + kNoteInterval)));
    }
    ++i;
  }
}

// Dials and notes that finished: a dialed lane is connected; a failed dial fails the peer, and so does a refused
// note (the peer is gone). A note that timed out is simply sent again.
void OnDemandConnector::finishDials() {
  for (size_t i = 0; i < dials_.size();) {
    PendingDial& d = *dials_[i];
    const int peer = d.peer();
    const auto state = d.step(0);
    if (state == PendingDial::State::kRunning) {
      ++i;
      continue;
    }
    // A note fails the peer only when refused (the peer is gone) or when the
    // peer counts sockets differently; any other trouble (a full queue, a
    // transient network error, no descriptor free here) waits for the next note.
    const bool fails_peer = state == PendingDial::State::kFailed &&
                            (!d.isNote() || (state_[static_cast<size_t>(peer)] == PeerState::kAsked &&
                                             (d.refused() || d.failure().kind == ErrorKind::kConfig)));
    if (fails_peer) {
      RCOLL_INFO("rank %d: %s", info_.rank, d.failure().message.c_str());
      const TransportFailure failure = d.failure();
      deliverFailure(peer, failure);  // erases this dial and the peer's others
      i = 0;
      continue;
    }
    if (d.isNote() || state != PendingDial::State::kDone) {
      dials_.erase(dials_.begin() + static_cast<long>(i));
      continue;
    }
    const int lane = d.lane();
    const int fd = d.takeFd();
    dials_.erase(dials_.begin() + static_cast<long>(i));
    laneConnected(peer, lane, fd);
  }
}

}  // namespace rcoll
