// TCP implementation of the transport interface.
//
// One full-duplex socket per peer, or several (RCOLL_SOCKETS_PER_PEER, "lanes";
// RCOLL_SOCKET_STRIPE: on several networks): the k-th message to a peer goes
// out on the lane the pair's schedule picks (lane_schedule.h: k mod N, or in
// proportion to what each lane carried when the pair connected, measured by
// lane_probe.h where the lanes span several NICs) and the k-th receive posted
// for it reads that same lane, so both ends agree without a word and the
// per-pair order that the interface promises holds (completions may come out
// of order across lanes; callers test each request). Several streams let a
// fast NIC carry more than one core's copies, and keep one slow segment from
// holding up the next. On one network a failure on any lane fails the whole
// peer; over several, a lane whose link fails hands its messages to the
// others (tcp_failover.cc), and only the last one's failure fails the peer.
// An abort goes out on every lane. Sends go straight from the caller's buffer
// (sendmsg of header + payload). Receives read a header into the connection's
// inbox together with whatever follows it, up to 8 KiB: a small message costs
// one recv() and is copied out after its header is checked; the rest of a
// larger payload lands straight in its destination, with no copy beyond the
// kernel's. All sockets are non-blocking and driven by progress(), which the
// communicator's progress thread (or a caller running a blocking op inline)
// calls: no extra thread, no hand-off.
#pragma once

#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "ack_watch.h"
#include "config.h"
#include "edge_meter.h"
#include "lane_schedule.h"
#include "message_stash.h"
#include "on_demand_peers.h"
#include "peer_listener.h"
#include "request_lifecycle.h"
#include "socket_util.h"
#include "transport.h"

namespace rcoll {

class TcpTransport : public Transport {
 public:
  // Listens on `bind_host` (an IP address) at an ephemeral port.
  TcpTransport(const ConnectInfo& info, const Config& config, const std::string& bind_host);
  ~TcpTransport() override;

  const char* name() const override { return "tcp"; }
  std::string listenAddress() const override { return listen_address_; }
  void connect(int peer, const std::string& address, Deadline deadline) override;
  int accept(Deadline deadline) override;
  void closeListener() override;
  bool connected(int peer) const override;
  bool canConnectOnDemand(int) const override { return true; }
  void connectOnDemand(const std::vector<std::string>& addresses) override;

  MemoryHandle registerMemory(void*, size_t) override { return nullptr; }
  void deregisterMemory(MemoryHandle) override {}

  Request* isend(int peer, const WireHeader& header, const void* data, size_t bytes) override;
  Request* irecv(int peer, const WireHeader& expected, void* data, size_t bytes) override;
  bool canPeek(int) const override { return true; }
  bool peekIncoming(int peer, WireHeader* header) override;
  void progress(std::chrono::milliseconds timeout) override;
  Activity progressNow() override;
  bool prepareSleep(std::vector<pollfd>* fds) override;
  Activity finishSleep(const pollfd* fds, size_t count) override;
  std::chrono::milliseconds maxSleep() const override;  // the next look at the sockets' acknowledgements
  TransportFailure failure(Request* request) const override;
  void release(Request* request) override;
  void interrupt() override;
  void abortPeers(ErrorKind kind, const std::string& message) override;
  void settleAbort() override;
  void edgeTraffic(std::vector<EdgeTraffic>* out) const override;  // incoming: the receiving end sees a payload cross

  // For tests and fuzzers (tests/native/fuzz): takes ownership of an already-connected
  // socket as the next free lane to `peer`, skipping the handshake. Throws
  // RcollError(kInvalidArgument), without taking the socket, if `peer` is this
  // rank, out of range or already connected.
  void adoptConnectedSocket(int peer, int fd);

 private:
  struct TcpRequest;
  struct Connection;
  struct PairMessages;

  // Per peer, each way: which lane the next message takes (lane_schedule.h).
  struct Lanes {
    LaneSchedule sends;
    LaneSchedule recvs;
  };
  // Several NICs: measures the peer's lanes (lane_probe.h) and weighs its schedules.
  void weighLanes(int peer, bool dialer, Deadline deadline);

  Request* post(TcpRequest* r);  // queues r on its lane, or fails it at once

  // Several networks (tcp_failover.cc): messages numbered per pair, sends
  // complete when the peer acknowledges them, receives are matched by number
  // on whichever socket their message comes, and a socket whose link fails
  // hands its messages to the others.
  void postNumbered(TcpRequest* r, Connection* any_lane);
  void deliverStashed(TcpRequest* r, const MessageStash::Message& m, Connection& any_lane);
  bool readNumbered(Connection& c, bool* finished);  // after a header: false to stop reading c for now
  bool wantsNumbered(const Connection& c) const;     // wantsRead() past a whole header
  bool peekNumbered(int peer, WireHeader* header) const;
  bool writeControl(Connection& c, bool* finished);  // at a message boundary: false to stop writing c for now
  void sentWhole(Connection& c, TcpRequest* r);
  void takeControl(Connection& c, bool* finished);
  // A socket error: the link under one of several sockets failed (laneDown),
  // or the peer is gone (failConnection).
  // `why`: for the WARN when only the link under it failed (else the errno's text).
  void loseSocket(Connection& c, int err, const std::string& message, const std::string& why = "");
  void laneDown(Connection& c, const std::string& why);
  void sendAgain(Connection& d, uint64_t peer_holds);
  Connection* liveSendLane(int peer);
  int liveLanes(int peer, const Connection* besides) const;
  void failNumbered(int peer, const TransportFailure& failure);
  bool peerStopped(Connection& c,
                   const TransportFailure& told);     // its abort on c: true if other sockets still bring acks
  bool sendDueAck(Connection& c, Deadline deadline);  // before our abort on c
  void queueAck(Connection& c);  // an acknowledgement of what c has read, behind its queued control frames
  // Adopts what the connector finished; true if a request failed. From
  // set-up's accept() (`setup_peer`): at most one peer of set-up, returned
  // there, the others kept for the next call.
  // Connections on demand: what the connector finished; true when a waiting request failed.
  bool adoptOnDemand();
  void adoptOutcome(OnDemandPeers<TcpRequest>::Outcome& outcome, bool* failed);
  void adopt(int peer, int lane, int fd);
  Connection* laneTo(int peer, int k) const { return connections_[static_cast<size_t>(peer * lanes_ + k)].get(); }
  bool driveAll(std::chrono::steady_clock::time_point now);           // true if any request completed or failed
  bool loseSilentSockets(std::chrono::steady_clock::time_point now);  // ack_watch_'s look: true if one was lost
  bool driveSends(Connection& c);
  bool driveRecvs(Connection& c);
  ssize_t readStream(Connection& c, char* dst, size_t want);
  enum class PayloadRead { kWhole, kWait, kLost };
  PayloadRead readPayload(Connection& c, char* data, size_t bytes, size_t* done);
  void stopMetering(Connection& c);  // a payload being read will not finish on c
  bool wantsRead(const Connection& c) const;
  bool lastOpenLane(const Connection& c) const;  // no other lane to c's peer can still bring a message
  // Every lane of c's peer. `peer_reported`: the peer told us why it failed (an
  // abort message), so it is not lost (Transport::lostPeers).
  void failConnection(Connection& c, ErrorKind kind, const std::string& message, bool peer_reported = false);
  void failLane(Connection& c, const TransportFailure& failure);
  void finish(TcpRequest* r, Request::State state, const TransportFailure* why);
  bool finishPartialSend(Connection& c, Deadline deadline);

  ConnectInfo info_;
  Config config_;
  int lanes_;  // sockets per peer
  std::unique_ptr<PeerListener> listener_;
  int wake_fd_ = -1;
  std::string listen_address_;
  std::vector<std::unique_ptr<Connection>> connections_;  // indexed by peer * lanes_ + lane
  std::vector<Lanes> schedules_;                          // indexed by peer
  int networks_;                     // networks the lanes to a peer spread over (Config::socket_networks)
  bool numbered_;                    // several networks and lanes: tcp_failover.cc's rules
  std::vector<PairMessages> pairs_;  // indexed by peer, where numbered_
  RequestLifecycle<TcpRequest> requests_;
  std::vector<pollfd> poll_fds_;  // progress() scratch
  bool aborted_ = false;
  bool settled_ = false;                 // settleAbort() ran
  OnDemandPeers<TcpRequest> on_demand_;  // not started when every peer connected at set-up
  EdgeMeter meter_;                      // large payloads read, per peer (Connection::metering)
  AckWatch ack_watch_;                   // RCOLL_PEER_TIMEOUT, judged here (the kernel's timer is off)
};

}  // namespace rcoll
