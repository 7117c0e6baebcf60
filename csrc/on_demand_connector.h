// Connections on demand (transport.h), for a transport that connects some
// peers on first use: from set-up on, a thread of its own owns the listener
// and accepts every peer that dials (those of set-up too), dials the lower
// ranks this rank needs or that ask it to, and asks the higher ones to dial
// (peer_listener.h: the higher rank of a pair always dials, so two dials never
// cross). The transport's thread never blocks on a connection: it names the
// peers it needs (want()) and takes the finished sockets (take()) when
// readyFd() turns readable. Nor does the connector: its dials and notes are
// non-blocking (PendingDial) and share one poll(2) with the listener, so it
// answers every peer at once whatever it is dialing, and stop() ends it
// within one poll.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "peer_listener.h"
#include "socket_util.h"
#include "transport.h"

namespace rcoll {

class OnDemandConnector {
 public:
  struct Outcome {
    int peer = -1;
    std::vector<int> fds;      // one blocking socket per lane, in lane order; empty when it failed
    TransportFailure failure;  // why, when it failed
  };

  // `addresses[p]`: where peer p listens, "" for a peer of set-up (never dialed
  // or asked here, but accepted when it dials).
  // Takes over `listener` and starts the thread.
  OnDemandConnector(const ConnectInfo& info, std::unique_ptr<PeerListener> listener, std::vector<std::string> addresses,
                    const SocketOptions& options, int lanes, std::chrono::milliseconds dial_timeout);
  ~OnDemandConnector();  // stops the thread; closes the sockets nobody took
  OnDemandConnector(const OnDemandConnector&) = delete;
  OnDemandConnector& operator=(const OnDemandConnector&) = delete;

  bool onDemand(int peer) const { return !addresses_[static_cast<size_t>(peer)].empty(); }
  // Thread-safe. Connect `peer` (once; later calls for it do nothing).
  void want(int peer);
  // Thread-safe. What finished since the last call; cheap when nothing did.
  std::vector<Outcome> take();
  // Readable while take() has something.
  int readyFd() const { return ready_fd_; }
  // Thread-safe, does not wait: closes the listener (a peer that dials from now
  // on is refused, which tells it this rank is gone) and ends the thread.
  void stop();

 private:
  void loop();
  void acceptDialers();
  void connectWanted();  // starts dials and notes; re-sends notes; gives up on peers that never came
  void finishDials();
  void laneConnected(int peer, int lane, int fd);
  void partialLaneClosed(int fd);
  void closeLanes(int peer);  // the peer's lanes connected so far, if any
  void deliver(Outcome outcome);
  void deliverFailure(int peer, const TransportFailure& failure);

  const ConnectInfo info_;
  std::unique_ptr<PeerListener> listener_;  // the thread's alone
  const std::vector<std::string> addresses_;
  const SocketOptions options_;
  const int lanes_;
  const std::chrono::milliseconds dial_timeout_;
  int wake_fd_ = -1;   // want() and stop() wake the thread
  int ready_fd_ = -1;  // the thread wakes the transport

  std::mutex mutex_;
  std::vector<int> wanted_;        // by the transport, not yet handled by the thread
  std::vector<Outcome> outcomes_;  // finished, not yet taken
  std::atomic<bool> has_outcomes_{false};
  std::atomic<bool> stopping_{false};

  // The thread's alone. kDialing: dials (one per lane) in dials_; kAsked: a
  // note sent, waiting for the peer to dial, re-sent every second (a peer
  // that is gone then refuses it) until asked_until_; kDone: delivered.
  enum class PeerState : uint8_t { kIdle, kDialing, kAsked, kDone };
  std::vector<PeerState> state_;                     // per peer
  std::vector<int> sockets_;                         // per peer * lanes + lane: a lane connected, or -1
  std::vector<std::unique_ptr<PendingDial>> dials_;  // dials and notes in flight
  std::vector<int> asked_;                           // peers in kAsked
  std::vector<Deadline> asked_until_;                // per peer in kAsked
  std::vector<Deadline> next_note_;                  // per peer in kAsked
  std::thread thread_;
};

}  // namespace rcoll
