#include "rails_transport.h"

#include <algorithm>

#include "error.h"
#include "lane_probe.h"
#include "log.h"
#include "rails_probe.h"
#include "socket_util.h"

namespace rcoll {

namespace {

// One registration per rail, handed out as one handle.
struct RailsMemory {
  std::vector<MemoryHandle> handles;  // rail i's is handles[i]; a partial registration holds the first ones
};

void deregisterEach(const std::vector<std::unique_ptr<Transport>>& rails, const RailsMemory& memory) {
  for (size_t i = 0; i < memory.handles.size(); ++i) rails[i]->deregisterMemory(memory.handles[i]);
}

}  // namespace

RailsTransport::RailsTransport(const ConnectInfo& info, std::vector<std::unique_ptr<Transport>> rails,
                               std::chrono::microseconds spin)
    : TransportGroup(info, std::move(rails), spin),
      sends_(static_cast<size_t>(info.size), std::vector<uint64_t>(children_.size())),
      recvs_(static_cast<size_t>(info.size), std::vector<uint64_t>(children_.size())),
      weights_(static_cast<size_t>(info.size), std::vector<int>(children_.size(), 1)),
      pairs_(static_cast<size_t>(info.size)) {
  if (children_.size() > kMaxRails) {
    throwError(ErrorKind::kConfig, strFormat("rank %d: %zu RDMA ports in RCOLL_IB_HCA; at most %zu can be used at once",
                                             info.rank, children_.size(), kMaxRails));
  }
  for (auto& rail : children_) {
    auto* endpoint = dynamic_cast<RailEndpoint*>(rail.get());
    if (endpoint == nullptr) {  // a rail that cannot trade notes: no failover
      endpoints_.clear();
      break;
    }
    endpoints_.push_back(endpoint);
  }
  for (RailEndpoint* endpoint : endpoints_) endpoint->joinRails();
  const size_t n = children_.size();
  for (Pair& pair : pairs_) {
    pair.sent.assign(n, 0);
    pair.received.assign(n, 0);
    pair.homes.resize(n);
    for (size_t i = 0; i < n; ++i) pair.homes[i].carrier = static_cast<int>(i);
  }
}

// The rails first: a peer's write may still be on its way into the probe's
// scratch memory until their connections are gone.
RailsTransport::~RailsTransport() { children_.clear(); }

std::string RailsTransport::listenAddress() const {
  std::string out;
  for (const auto& rail : children_) out += (out.empty() ? "" : "|") + rail->listenAddress();
  return out;
}

void RailsTransport::connect(int peer, const std::string& address, Deadline deadline) {
  const std::vector<std::string> parts = splitList(address, '|');
  if (parts.size() != children_.size()) {
    throwError(ErrorKind::kConfig,
               strFormat("rank %d: rank %d listens on %zu RDMA port(s), this rank on %zu: the ranks did not agree on "
                         "the ports (RCOLL_IB_HCA)",
                         info_.rank, peer, parts.size(), children_.size()));
  }
  for (size_t i = 0; i < parts.size(); ++i) children_[i]->connect(peer, parts[i], deadline);
  weighRails(peer, /*dialer=*/true, deadline);
}

int RailsTransport::accept(Deadline deadline) {
  const int peer = children_.front()->accept(deadline);
  for (size_t i = 1; i < children_.size(); ++i) {
    while (!children_[i]->connected(peer)) children_[i]->accept(deadline);  // other peers stay connected
  }
  weighRails(peer, /*dialer=*/false, deadline);
  return peer;
}

// Peers connected at set-up: both ends measure the rails once, before the
// pair's first message (rails_probe.h). Peers connected on first use keep
// equal shares at both ends.
void RailsTransport::weighRails(int peer, bool dialer, Deadline deadline) {
  if (probe_scratch_.empty()) probe_scratch_.resize(railProbeScratchBytes(children_.size()));
  std::vector<Transport*> rails;
  for (auto& rail : children_) rails.push_back(rail.get());
  std::vector<double> rates;
  weights_[static_cast<size_t>(peer)] =
      probeRails(*this, rails, info_, peer, dialer, deadline, probe_scratch_.data(), &rates);
  // The probe's messages came before the pair's first (rails_failover.cc counts from there).
  for (size_t i = 0; i < endpoints_.size(); ++i)
    pairs_[static_cast<size_t>(peer)].homes[i].stream_base = endpoints_[i]->arrived(peer, 0);
  RCOLL_INFO("rank %d: the RDMA ports to rank %d take shares %s", info_.rank, peer,
             describeShares(weights_[static_cast<size_t>(peer)], rates).c_str());
}

// No more peers at set-up: the probe's scratch memory is let go (its
// registrations with it).
void RailsTransport::closeListener() {
  for (auto& rail : children_) rail->closeListener();
  if (!probe_scratch_.empty()) {
    invalidateMemory(probe_scratch_.data(), probe_scratch_.size());
    std::vector<char>().swap(probe_scratch_);
  }
}

bool RailsTransport::connected(int peer) const {
  for (const auto& rail : children_) {
    if (!rail->connected(peer)) return false;
  }
  return true;
}

void RailsTransport::connectOnDemand(const std::vector<std::string>& addresses) {
  for (size_t i = 0; i < children_.size(); ++i) {
    std::vector<std::string> mine(addresses.size());
    for (size_t p = 0; p < addresses.size(); ++p) {
      if (addresses[p].empty()) continue;
      const std::vector<std::string> parts = splitList(addresses[p], '|');
      if (parts.size() != children_.size()) {
        throwError(ErrorKind::kConfig, strFormat("rank %d: rank %zu listens on %zu RDMA port(s), this rank on %zu",
                                                 info_.rank, p, parts.size(), children_.size()));
      }
      mine[p] = parts[i];
    }
    children_[i]->connectOnDemand(mine);
  }
}

void RailsTransport::setPeers(std::vector<bool> served) {
  for (auto& rail : children_) rail->setPeers(served);
  Transport::setPeers(std::move(served));
}

// A rail that cannot register (it throws: the port's memory limit, say)
// leaves no registration behind on the rails before it.
MemoryHandle RailsTransport::registerMemory(void* data, size_t bytes) {
  auto memory = std::make_unique<RailsMemory>();
  memory->handles.reserve(children_.size());
  try {
    for (auto& rail : children_) memory->handles.push_back(rail->registerMemory(data, bytes));
  } catch (...) {
    deregisterEach(children_, *memory);
    throw;
  }
  return memory.release();
}

MemoryHandle RailsTransport::registerDeviceMemory(void* data, size_t bytes, int dmabuf_fd, uint64_t dmabuf_offset,
                                                  std::string* why) {
  auto memory = std::make_unique<RailsMemory>();
  memory->handles.reserve(children_.size());
  try {
    for (auto& rail : children_) {
      MemoryHandle h = rail->registerDeviceMemory(data, bytes, dmabuf_fd, dmabuf_offset, why);
      if (h == nullptr) {  // `why` says why: the caller stages through host memory
        deregisterEach(children_, *memory);
        return nullptr;
      }
      memory->handles.push_back(h);
    }
  } catch (...) {
    deregisterEach(children_, *memory);
    throw;
  }
  return memory.release();
}

void RailsTransport::deregisterMemory(MemoryHandle handle) {
  std::unique_ptr<RailsMemory> memory(static_cast<RailsMemory*>(handle));
  if (memory) deregisterEach(children_, *memory);
}

void RailsTransport::invalidateMemory(const void* data, size_t bytes) {
  for (auto& rail : children_) rail->invalidateMemory(data, bytes);
}

// The rail that has carried the fewest bytes to (or from) `peer` for its
// weight (rails_probe.h: the pair's measured shares, equal until measured),
// counting the message about to go, the lowest on a tie; each message counts
// its payload and a header's worth, so that empty ones take turns too. Both
// ends hold the same weights and see the same sizes in the same order (a
// receive is posted for what its sender sends), so they pick alike.
size_t RailsTransport::railFor(std::vector<std::vector<uint64_t>>* load, int peer, size_t bytes) const {
  if (peer < 0 || peer >= info_.size) {
    throwError(ErrorKind::kInvalidArgument, strFormat("rank %d: rank %d is not a peer of this communicator (size %d)",
                                                      info_.rank, peer, info_.size));
  }
  std::vector<uint64_t>& carried = (*load)[static_cast<size_t>(peer)];
  const std::vector<int>& weights = weights_[static_cast<size_t>(peer)];
  const uint64_t cost = bytes + sizeof(WireHeader);
  __extension__ typedef unsigned __int128 Wide;  // (bytes so far) x (weight) cannot overflow it
  size_t best = 0;
  for (size_t i = 1; i < carried.size(); ++i) {
    // (carried[i] + cost) / weights[i] < (carried[best] + cost) / weights[best], without division
    if (Wide(carried[i] + cost) * static_cast<unsigned>(weights[best]) <
        Wide(carried[best] + cost) * static_cast<unsigned>(weights[i])) {
      best = i;
    }
  }
  carried[best] += cost;
  return best;
}

Request* RailsTransport::isend(int peer, const WireHeader& header, const void* data, size_t bytes) {
  const size_t i = railFor(&sends_, peer, bytes);
  RailRequest* w = requests_.take(true, peer, header, data, bytes);
  w->home = static_cast<int>(i);
  w->number = pairs_[static_cast<size_t>(peer)].sent[i]++;
  return post(w);
}

Request* RailsTransport::irecv(int peer, const WireHeader& expected, void* data, size_t bytes) {
  const size_t i = railFor(&recvs_, peer, bytes);
  RailRequest* w = requests_.take(false, peer, expected, data, bytes);
  w->home = static_cast<int>(i);
  w->number = pairs_[static_cast<size_t>(peer)].received[i]++;
  return post(w);
}

// On its rail, or, when that rail's link failed, on the rail that carries
// its messages now (a send waits until the peer said what it has of them:
// rails_failover.cc).
Request* RailsTransport::post(RailRequest* w) {
  Pair& pair = pairs_[static_cast<size_t>(w->peer)];
  if (!pair.rails_asked) {  // a peer connected on first use: every rail at once, each ready to take over
    pair.rails_asked = true;
    for (RailEndpoint* endpoint : endpoints_) endpoint->connectAhead(w->peer);
  }
  HomeRail& h = pair.homes[static_cast<size_t>(w->home)];
  if (h.carrier == w->home || (!h.given_up && (!w->is_send || (h.waiting.empty() && h.peer_carrier == h.carrier)))) {
    carry(w, h.carrier, streamOn(w->home, h.carrier));
  } else {
    h.waiting.push_back(w);  // given up: failWaiting() fails it with the others
    ++waiting_;
  }
  return w;
}

void RailsTransport::carry(RailRequest* w, int rail, int stream) {
  w->carrier = rail;
  Transport& child = *children_[static_cast<size_t>(rail)];
  if (stream == 0) {
    w->child = w->is_send ? child.isend(w->peer, w->header, w->data, w->bytes)
                          : child.irecv(w->peer, w->header, w->data, w->bytes);
  } else {
    RailEndpoint& endpoint = *endpoints_[static_cast<size_t>(rail)];
    w->child = w->is_send ? endpoint.isendOn(stream, w->peer, w->header, w->data, w->bytes)
                          : endpoint.irecvOn(stream, w->peer, w->header, w->data, w->bytes);
  }
  open_.push_back(w);
}

void RailsTransport::settle(RailRequest* w, Request::State state, const TransportFailure* why) {
  if (w->child != nullptr) {
    if (state == Request::State::kDone && w->is_send) {
      uint64_t& done = pairs_[static_cast<size_t>(w->peer)].homes[static_cast<size_t>(w->home)].sends_done;
      done = std::max(done, w->number + 1);
    }
    children_[static_cast<size_t>(w->carrier)]->release(w->child);
    w->child = nullptr;
  }
  if (requests_.finish(w, state, why)) settled_ = true;
}

// Each carried request whose child is final ends with it, except a failure
// of the link under its rail, which the failover takes over (it may not have
// been told yet: the child reports the link once what arrived is counted).
void RailsTransport::settleRequests() {
  for (size_t k = 0; k < open_.size();) {
    RailRequest* w = open_[k];
    const Request::State state = w->child->state;
    if (state == Request::State::kPending) {
      ++k;
      continue;
    }
    TransportFailure why;
    if (state == Request::State::kFailed) {
      why = children_[static_cast<size_t>(w->carrier)]->failure(w->child);
      if (why.link && mayReplace(w->peer, w->home)) {
        ++k;
        continue;
      }
    }
    open_[k] = open_.back();
    open_.pop_back();
    settle(w, state, state == Request::State::kFailed ? &why : nullptr);
  }
}

// A child's finished request is the caller's news once it is settled here;
// a rail's finished request is reported as well (the set-up probe drives
// the rails' own requests through progress()), which at worst makes a caller
// look once for nothing.
Activity RailsTransport::progressNow() { return afterRails(TransportGroup::progressNow()); }

Activity RailsTransport::finishSleep(const pollfd* fds, size_t count) {
  return afterRails(TransportGroup::finishSleep(fds, count));
}

Activity RailsTransport::afterRails(Activity rails) {
  settled_ = false;
  if (!endpoints_.empty()) takeFailures();
  if (waiting_ > 0) failWaiting();
  settleRequests();
  return settled_ ? Activity::kFinished : rails;
}

// Which rail the next receive from `peer` reads depends on its size, not
// known before its header: any rail's next header will do for a receive from
// any source (verbs cannot peek anyway).
bool RailsTransport::peekIncoming(int peer, WireHeader* header) {
  if (peer < 0 || peer >= info_.size) return false;
  for (auto& rail : children_) {
    if (rail->peekIncoming(peer, header)) return true;
  }
  return false;
}

TransportFailure RailsTransport::failure(Request* request) const { return requests_.failure(request); }

// A request released while it is carried ends (and is reused) when its child does.
void RailsTransport::release(Request* request) { requests_.release(request); }

// The rails' own (a rail's link failure is not one: RailEndpoint::joinRails),
// and the peers whose failed rail could not be replaced.
std::vector<int> RailsTransport::lostPeers() const {
  std::vector<int> lost = TransportGroup::lostPeers();
  {
    std::lock_guard<std::mutex> lock(unreplaced_mutex_);
    lost.insert(lost.end(), unreplaced_.begin(), unreplaced_.end());
  }
  std::sort(lost.begin(), lost.end());
  lost.erase(std::unique(lost.begin(), lost.end()), lost.end());
  return lost;
}

}  // namespace rcoll
