// Authenticated TCP connections between the ranks of one communicator.
//
// Every transport needs the same first step: a socket to each peer whose other
// end has proved it belongs to this job (the 44-byte handshake carrying the
// communicator id and the per-job token from the store). A pair of ranks may
// be joined by several sockets ("lanes", RCOLL_SOCKETS_PER_PEER); each
// handshake names its lane and how many the dialer opens, and both ends
// refuse, as a configuration error, a peer that counts differently. The TCP transport
// then moves data on that socket; the verbs transport uses it to swap queue
// pair numbers and keeps it as a side channel that sees a dead peer at once
// and carries abort messages. This file owns that step and nothing else.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "socket_util.h"
#include "transport.h"

namespace rcoll {

// Listens on `bind_host` at an ephemeral port and hands out sockets of peers
// that completed a valid handshake. Stray scanners, wrong tokens, garbage and
// half-sent handshakes are dropped with a WARN, never returned.
class PeerListener {
 public:
  // `lanes`: sockets per peer that this rank expects (and dials); 1 for verbs.
  PeerListener(const ConnectInfo& info, const std::string& bind_host, const SocketOptions& options, int lanes = 1);
  ~PeerListener();
  PeerListener(const PeerListener&) = delete;
  PeerListener& operator=(const PeerListener&) = delete;

  // "host:port", or several comma-separated (one per data interface), published in the store
  const std::string& address() const { return address_; }

  // Blocks until a higher rank completes the handshake of a lane that is not
  // yet in `connected` (indexed by rank * lanes + lane); returns its rank, the
  // lane in *lane and a blocking socket in *fd. Throws RcollError(kTimeout) at
  // `deadline`, and RcollError(kConfig) when a rank of this job opens another
  // number of sockets per peer (after telling it so in the ack). `lane` may
  // be null where one socket per peer is all there is.
  int accept(Deadline deadline, const std::vector<bool>& connected, int* fd, int* lane = nullptr);
  // The same without blocking, for a transport that keeps accepting after
  // set-up (connections on demand, transport.h): one pass over what has
  // arrived; -1 when no handshake completed. A peer that errs is dropped with
  // a WARN, never thrown. appendPollFds() adds what a sleep must watch.
  int acceptNow(const std::vector<bool>& connected, int* fd, int* lane = nullptr);
  void appendPollFds(std::vector<pollfd>* fds) const;
  // The lower ranks that asked this one to dial them (a PendingDial note) since the
  // last call.
  std::vector<int> takeDialRequests();
  void close();  // no more peers will come
  bool closed() const { return listen_fd_ < 0; }

 private:
  struct PendingHandshake;
  bool serviceHandshake(PendingHandshake& pending, const std::vector<bool>& connected, int* peer);
  int step(const std::vector<bool>& connected, int* fd, int* lane);  // one pass; -1: nothing complete

  ConnectInfo info_;
  SocketOptions options_;
  int lanes_;
  int listen_fd_ = -1;
  std::string address_;
  std::vector<std::unique_ptr<PendingHandshake>> pending_;
  std::vector<int> dial_requests_;
  Deadline resting_until_{};  // out of descriptors: the listen socket stays out of the poll until then
};

// Connects to `peer` at `address` and completes the handshake of socket `lane`
// of `lanes`; returns a blocking socket. Retries refusals until `deadline` (the
// peer may not listen yet); throws RcollError(kPeer) if the process there is
// not that rank of this job, RcollError(kConfig) if it expects another number
// of sockets per peer.
int dialPeer(const ConnectInfo& info, int peer, const std::string& address, Deadline deadline,
             const SocketOptions& options, int lane = 0, int lanes = 1);

// A dial that never blocks, for connections on demand (on_demand_connector.h),
// where one thread dials and accepts for a whole rank: a non-blocking
// connect, then the hello, then the ack, each step taken when poll(2) says
// the socket is ready. The higher rank of a pair dials, so that two dials
// never cross; a lower rank that needs a higher one sends it a "dial me"
// note instead (`note`: the handshake marked so, then the socket is closed;
// nothing comes back, the peer answers by dialing), which it never waits on
// beyond the kernel's connect. After set-up every peer listens, so a refusal
// means the peer is gone.
class PendingDial {
 public:
  enum class State { kRunning, kDone, kFailed };
  PendingDial(const ConnectInfo& info, int peer, const std::string& address, const SocketOptions& options, int lane,
              int lanes, bool note, Deadline deadline);
  ~PendingDial();  // closes the socket unless takeFd() took it
  PendingDial(const PendingDial&) = delete;
  PendingDial& operator=(const PendingDial&) = delete;

  // Advances as far as the socket allows; `revents` from the last poll (0: look anyway).
  State step(short revents);
  State state() const { return state_; }
  pollfd pollFd() const;  // what to wait for while kRunning
  Deadline deadline() const { return deadline_; }
  int peer() const { return peer_; }
  int lane() const { return lane_; }
  bool isNote() const { return note_; }
  int takeFd();                                                 // kDone, not a note: a blocking socket
  const TransportFailure& failure() const { return failure_; }  // kFailed
  bool refused() const { return refused_; }  // kFailed because the peer's listener refused: it is gone

 private:
  void fail(ErrorKind kind, const std::string& message);

  ConnectInfo info_;
  int peer_;
  std::string address_;
  int lane_;
  int lanes_;
  bool note_;
  Deadline deadline_;
  int fd_ = -1;
  enum class Phase { kConnecting, kSending, kReceiving } phase_ = Phase::kConnecting;
  std::vector<unsigned char> out_;  // the hello (or note) still to send
  size_t sent_ = 0;
  std::vector<unsigned char> in_;  // the ack, as it arrives
  size_t got_ = 0;
  State state_ = State::kRunning;
  TransportFailure failure_;
  bool refused_ = false;
};

// An abort message's header: kAbort, the sender's ErrorKind and text length.
WireHeader makeAbortHeader(const ConnectInfo& info, ErrorKind kind, size_t text_bytes);

// What an abort announced by a peer means here: a mismatch stays a mismatch;
// any other failure of a peer is a peer failure from this rank's point of view.
ErrorKind errorKindFromWire(uint8_t value);

// A peer's text (cut at some byte count, or garbage) made valid UTF-8: what is
// valid is kept, every other byte becomes U+FFFD, so Python can raise it.
std::string validUtf8(const std::string& s);

// `text` cut to at most `max_bytes` without splitting a UTF-8 character.
std::string truncateUtf8(const std::string& text, size_t max_bytes);

}  // namespace rcoll
