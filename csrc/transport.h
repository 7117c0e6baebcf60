// The transport interface: how bytes move between two ranks.
//
// Modelled on NCCL's net plugin: a small, non-blocking surface
// (listen / connect / accept, isend / irecv / test, progress, register memory,
// close) that TCP, verbs and shared memory implement, and that a composite
// transport (composite_transport.h) implements by routing each peer to one of them.
// A transport knows nothing of reductions or algorithms; it only moves
// header-framed messages in order per connection and checks each incoming
// header against the one the receiver expects (wire.h), so that a mismatch is
// caught before a single payload byte lands in a user buffer.
#pragma once

#include <poll.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "error.h"
#include "wire.h"

namespace rcoll {

// Identity every connection must prove before it is accepted.
struct ConnectInfo {
  uint64_t comm_id = 0;
  uint8_t token[16] = {};  // per-communicator secret from the store
  int rank = 0;
  int size = 0;
};

// One message in flight. Owned by the transport; the caller tests it until it
// is no longer pending and then releases it.
struct Request {
  enum class State { kPending, kDone, kFailed };
  State state = State::kPending;
  int peer = -1;  // the rank at the other end: how a composite routes failure() and release()
};

// What one non-blocking pass over a transport's connections did.
enum class Activity {
  kIdle,      // nothing moved: the caller may spin a little, then sleep
  kMoved,     // bytes moved but no request finished: keep spinning
  kFinished,  // a request finished or failed: the caller has something to look at
};

// Why a connection failed: what the executor turns into a PeerError or a
// MismatchError naming the rank and the op.
struct TransportFailure {
  ErrorKind kind = ErrorKind::kPeer;
  std::string message;
  // The path to the peer may be what failed, not its process (the NIC stopped
  // acknowledging, a socket timed out or lost its route): a rails transport
  // moves the pair's messages to its other ports (rails_failover.cc).
  bool link = false;
};

// What the large transfers over one edge reached (edge_meter.h): payload
// bytes, and the time they were on the way, measured at this end.
struct EdgeTraffic {
  int peer = -1;
  bool outgoing = false;       // this rank to the peer (else the peer to this rank)
  const char* transport = "";  // the transport's name()
  uint64_t bytes = 0;
  uint64_t nanos = 0;
};

// Memory registration handle (verbs needs one per buffer; TCP needs none).
using MemoryHandle = void*;

class Transport {
 public:
  virtual ~Transport() = default;
  virtual const char* name() const = 0;
  // The name of the transport that carries `peer`'s messages (a composite's child).
  virtual const char* transportOf(int /*peer*/) const { return name(); }

  // Set-up. listenAddress() is published in the store; connect() reaches a
  // peer's published address and proves `info`; accept() waits for a peer that
  // proves `info` and drops (with a WARN) anything else: stray scanners, wrong
  // tokens, garbage, half-sent handshakes. Both throw RcollError past `deadline`.
  virtual std::string listenAddress() const = 0;
  virtual void connect(int peer, const std::string& address, std::chrono::steady_clock::time_point deadline) = 0;
  virtual int accept(std::chrono::steady_clock::time_point deadline) = 0;  // returns the peer's rank
  virtual void closeListener() = 0;                                        // no more peers will come: stop accepting
  virtual bool connected(int peer) const = 0;
  // Connections on first use, for the peers where canConnectOnDemand(peer).
  // Called before set-up connects the others: `addresses` holds the published
  // address of each peer to connect on first use ("" for the peers of
  // set-up). accept() then returns set-up peers only, and closeListener()
  // leaves the listener open for the rest. The first isend/irecv to such a
  // peer connects it (on_demand_connector.h); its messages wait in order
  // until it is.
  virtual bool canConnectOnDemand(int /*peer*/) const { return false; }
  virtual void connectOnDemand(const std::vector<std::string>& /*addresses*/) {}
  // Which peers this transport serves (all by default, indexed by rank). A
  // composite gives each child its share before the mesh forms, so that a
  // child's accept() takes its own peers only and drops any other with a WARN.
  virtual void setPeers(std::vector<bool> served) { served_ = std::move(served); }
  bool serves(int peer) const {
    return served_.empty() ||
           (peer >= 0 && static_cast<size_t>(peer) < served_.size() && served_[static_cast<size_t>(peer)]);
  }

  // Memory registration (a no-op returning nullptr for transports that need none).
  // Callers that know which memory an op will touch register it whole, once,
  // so that the transport's per-segment lookups hit one registration.
  virtual bool needsRegistration() const { return false; }
  virtual MemoryHandle registerMemory(void* data, size_t bytes) = 0;
  virtual void deregisterMemory(MemoryHandle handle) = 0;
  // Device (GPU) memory that the NIC reads and writes itself (GPUDirect RDMA),
  // registered until deregisterMemory(); isend()/irecv() of any range inside
  // it then move bytes without a copy through host memory. `dmabuf_fd` >= 0 is
  // a dma-buf of the range from the GPU driver, `dmabuf_offset` the range's
  // offset in it (the caller keeps and closes the descriptor); -1 registers
  // the address itself, which works where a peer-memory client such as
  // nvidia-peermem lets the NIC driver pin device pages. Null with *why when
  // this transport cannot (it has no NIC, or the registration failed).
  virtual MemoryHandle registerDeviceMemory(void* /*data*/, size_t /*bytes*/, int /*dmabuf_fd*/,
                                            uint64_t /*dmabuf_offset*/, std::string* why) {
    *why = std::string("the ") + name() + " transport moves bytes with the CPU, which cannot address device memory";
    return nullptr;
  }
  // Thread-safe: [data, data + bytes) is about to be freed, so any cached
  // registration of it must go (see rdma/mr_cache.h). No-op where nothing is cached.
  virtual void invalidateMemory(const void* /*data*/, size_t /*bytes*/) {}

  // Data path: non-blocking. Messages to one peer arrive in the order they were
  // sent; receives from one peer are matched in the order they were posted.
  virtual Request* isend(int peer, const WireHeader& header, const void* data, size_t bytes) = 0;
  virtual Request* irecv(int peer, const WireHeader& expected, void* data, size_t bytes) = 0;
  // The header of the next message from `peer` that has arrived, without
  // taking it (when a receive is already posted for it, that receive's): how
  // a receive from any source chooses its sender (p2p_engine.h). False when
  // nothing has arrived yet. canPeek() is false where a message cannot be
  // seen before its receive is posted (verbs: the sender waits for the
  // receiver's credit); peekIncoming() then always answers false.
  virtual bool canPeek(int /*peer*/) const { return false; }
  virtual bool peekIncoming(int /*peer*/, WireHeader* /*header*/) { return false; }
  // Moves bytes on every connection; blocks at most `timeout` when nothing moved.
  // A transport used alone is driven through this, its own tuned loop.
  virtual void progress(std::chrono::milliseconds timeout) = 0;

  // The same work in three steps, for one thread that waits on several
  // transports at once (composite_transport.h); called from the progress
  // thread only, never mixed with progress() on one transport.
  //  (a) One non-blocking pass over every connection.
  virtual Activity progressNow() = 0;
  //  (b) The caller is about to sleep in poll(2): announce it where peers must
  //      know (shm's sleep words, verbs' armed completion queue) and append the
  //      descriptors whose readiness means work here. False when work is
  //      already waiting: the caller must not sleep then. Either way the caller
  //      calls finishSleep() next.
  virtual bool prepareSleep(std::vector<pollfd>* fds) = 0;
  //  (c) After the sleep: `fds` are the entries (b) appended, with revents
  //      filled (all 0 when the caller did not sleep). Withdraws the
  //      announcement and handles what woke it (doorbell, completion event,
  //      side channel: a dead peer or an abort).
  virtual Activity finishSleep(const pollfd* fds, size_t count) = 0;
  //  The longest the caller may sleep before (a) again: a timer of the
  //  transport's own (the TCP transport's look at its sockets' acknowledgements).
  virtual std::chrono::milliseconds maxSleep() const { return std::chrono::milliseconds::max(); }
  // The failure of a request in state kFailed.
  virtual TransportFailure failure(Request* request) const = 0;
  virtual void release(Request* request) = 0;

  // Thread-safe: makes a blocked progress() return at once (abort, shutdown).
  virtual void interrupt() = 0;

  // Best effort, never blocks: tells every connected peer that this rank failed
  // and why, so that they fail with the original cause instead of a bare
  // "connection closed", then stops all traffic.
  virtual void abortPeers(ErrorKind kind, const std::string& message) = 0;
  // After abortPeers(), before the connections close (bounded, a no-op
  // otherwise): waits until the peers can have read the abort message, where
  // closing too early would throw it away.
  virtual void settleAbort() {}

  // Thread-safe: the ranks whose connection died under this transport (closed,
  // reset, unreachable past RCOLL_PEER_TIMEOUT, garbage), not those that told
  // us they failed and why: a shrink leaves them out without waiting for them.
  virtual std::vector<int> lostPeers() const {
    std::lock_guard<std::mutex> lock(lost_mutex_);
    return lost_;
  }

  // Thread-safe: appends what this transport's transfers reached, per peer it
  // meters (edge_meter.h); nothing where it meters none.
  virtual void edgeTraffic(std::vector<EdgeTraffic>* /*out*/) const {}

 protected:
  // Called by a transport where it learns that `peer`'s connection is gone.
  void markLost(int peer) {
    std::lock_guard<std::mutex> lock(lost_mutex_);
    if (std::find(lost_.begin(), lost_.end(), peer) == lost_.end()) lost_.push_back(peer);
  }

 private:
  std::vector<bool> served_;  // empty: every peer
  mutable std::mutex lost_mutex_;
  std::vector<int> lost_;
};

}  // namespace rcoll
