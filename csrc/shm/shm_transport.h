// Shared-memory implementation of the transport interface, for ranks on one host.
//
// Per pair of ranks: one memfd segment with a single-producer single-consumer
// byte ring per direction (shm_ring.h, set up by shm_setup.h), plus the TCP
// socket of the handshake, kept as a side channel exactly as the verbs
// transport keeps it: EOF there means the peer's process is gone (pending
// receives and unfinished sends fail at once, naming the rank), and abort
// messages (header + text) travel on it.
//
// Data path. isend() copies the 64-byte header and the payload into the ring
// as room allows, in pieces of up to 64 KiB, publishing each piece, so a
// message may be far larger than the ring and the receiver copies a piece out
// while the next goes in. A send is done when its last byte is in the ring (as
// a TCP send is done when the kernel has it). irecv() reads the next header,
// checks it against the expected one (checkHeader) before a payload byte is
// copied, then copies the payload straight into the destination as it arrives.
// A mismatch fails the connection with kMismatch and leaves the destination
// untouched. Messages to a peer arrive in order; receives match in posting order.
//
// Ring size: RCOLL_SHM_RING_BYTES per direction (default 4M; the accepting
// rank's value is used by both ends of a pair, so ranks may differ).
//
// Waiting (the choice, and why). progress() first polls the rings for 50 us
// (kSpin) after the last byte moved, calling sched_yield() between looks: an
// active peer answers within that window with no wake-up on either side, and
// on an oversubscribed host the yield hands the core to whoever is runnable,
// often the very peer this rank waits for (a pause loop there holds the core
// the answer needs: measured on 2 busy cores, 8-byte ping-pong round trip
// 47 us with a pause spin, 8 us with no spin, 3.5 us with the yield spin, TCP
// loopback 21 us). After that it sleeps in poll() on three kinds of
// descriptors at once: this rank's *doorbell* eventfd (one per transport,
// shared with every shm peer at set-up), the interrupt eventfd, and every
// peer's side-channel socket. Before sleeping it announces, in each pair
// segment's sleep word, what it waits for (data from that peer, room towards
// it); a peer that publishes data or frees room then checks that word
// (seq_cst: one load, no syscall when nobody sleeps) and writes the doorbell
// only when it is set. So a sleeping rank costs no CPU at all (no timed
// slices), is woken by data within a scheduler wake-up, and still sees a dead
// peer (EOF), an abort or interrupt() at once. A futex in the segment was the
// alternative: it cannot wait on sockets (a dead peer would only be seen
// between bounded sleeps) nor on several peers' segments at once; the eventfd
// doorbell does both, for the same wake-up cost as FUTEX_WAKE.
//
// Threading: like every transport, driven by one thread (the progress
// thread); interrupt() may be called from any thread.
#pragma once

#include <atomic>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "config.h"
#include "peer_listener.h"
#include "request_lifecycle.h"
#include "side_channel.h"
#include "socket_util.h"
#include "transport.h"

namespace rcoll {

namespace shm {
class Segment;
}

class ShmTransport : public Transport {
 public:
  // Listens for handshakes on `bind_host` (an IP address; loopback is enough,
  // every peer is on this host) at an ephemeral port. Reads RCOLL_SHM_RING_BYTES.
  ShmTransport(const ConnectInfo& info, const Config& config, const std::string& bind_host);
  ~ShmTransport() override;

  const char* name() const override { return "shm"; }
  std::string listenAddress() const override { return listener_->address(); }
  // Both throw RcollError past `deadline`, and RcollError(kConfig) when the
  // peer turns out not to be on this host (or not in this network namespace).
  void connect(int peer, const std::string& address, Deadline deadline) override;
  int accept(Deadline deadline) override;
  void closeListener() override;
  bool connected(int peer) const override;

  MemoryHandle registerMemory(void*, size_t) override { return nullptr; }
  void deregisterMemory(MemoryHandle) override {}

  Request* isend(int peer, const WireHeader& header, const void* data, size_t bytes) override;
  Request* irecv(int peer, const WireHeader& expected, void* data, size_t bytes) override;
  bool canPeek(int) const override { return true; }
  bool peekIncoming(int peer, WireHeader* header) override { return incomingMessage(peer, header); }
  void progress(std::chrono::milliseconds timeout) override;
  Activity progressNow() override;
  bool prepareSleep(std::vector<pollfd>* fds) override;
  Activity finishSleep(const pollfd* fds, size_t count) override;
  TransportFailure failure(Request* request) const override;
  void release(Request* request) override;
  void interrupt() override;
  void abortPeers(ErrorKind kind, const std::string& message) override;

  size_t ringBytes() const { return ring_bytes_; }  // per direction, for pairs this rank creates

  // Shared windows (shm_window.h), for the shared-memory collectives
  // (shm_collectives.h): moved by their user, this transport only maps them
  // and offers the waiting. Same thread as the data path.
  // The window of `rank` (this rank's own included); null when windows are
  // off (RCOLL_SHM_COLL=0) or `rank` is not connected over shared memory.
  char* window(int rank) const;
  size_t windowSlotBytes() const { return window_slot_bytes_; }
  void ringDoorbell(int peer);
  // Sleeps until a doorbell ring, news on a side channel (a dead or aborting
  // peer: see peerDown), interrupt() or `deadline`. True if interrupted.
  bool sleepForWindows(Deadline deadline);
  // Why the connection to `peer` is down (its process exited, it aborted), or null.
  const TransportFailure* peerDown(int peer) const;
  // True, with the header, when `peer` has sent a message nobody received yet:
  // a window user that expects none sees a peer running another collective.
  bool incomingMessage(int peer, WireHeader* header) const;

 private:
  struct ShmRequest;
  struct Connection;

  void adopt(int peer, int fd, Deadline deadline, bool creator);
  Request* post(ShmRequest* r);
  void finish(ShmRequest* r, Request::State state, const TransportFailure* why);

  bool driveAll();  // true if any byte moved
  bool driveSends(Connection& c);
  bool driveRecvs(Connection& c);
  bool canMove(Connection& c);
  void publishTail(Connection& c);
  void wakePeer(Connection& c, uint32_t wanted);
  bool sleep(Deadline deadline);                            // true if interrupted
  void appendWakeSources(std::vector<pollfd>* fds);         // doorbell + side channels, for poll()
  void handleWakeSources(const pollfd* fds, size_t count);  // drain the doorbell, read side channels
  void takeInterrupt();

  void serviceSideChannel(Connection& c);
  // `peer_reported`: the peer told us why it failed (an abort), so it is not lost (Transport::lostPeers).
  void peerClosed(Connection& c, const TransportFailure& why, bool peer_reported = false);
  void failConnection(Connection& c, ErrorKind kind, const std::string& message, bool peer_reported = false);

  ConnectInfo info_;
  Config config_;
  size_t ring_bytes_;
  std::unique_ptr<PeerListener> listener_;
  int wake_fd_ = -1;                      // interrupt()
  int doorbell_fd_ = -1;                  // peers wake this rank here
  std::unique_ptr<shm::Segment> window_;  // this rank's shared window (null when off)
  int window_fd_ = -1;                    // its memfd, handed to each peer; closed with the listener
  size_t window_slot_bytes_ = 0;
  std::atomic<bool> interrupted_{false};
  std::vector<std::unique_ptr<Connection>> connections_;  // indexed by peer rank
  RequestLifecycle<ShmRequest> requests_;
  std::vector<pollfd> poll_fds_;  // scratch for sleep()
  std::vector<int> poll_peers_;   // the peers whose side channels prepareSleep() appended, in order
  bool aborted_ = false;
  bool progressed_ = false;  // a request finished since progress() started
};

}  // namespace rcoll
