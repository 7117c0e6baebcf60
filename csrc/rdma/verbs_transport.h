// ibverbs implementation of the transport interface (RC queue pairs).
//
// Protocol, per pair of ranks (one RC queue pair each way, plus the TCP socket
// of the handshake, kept as a side channel):
//   - The receiver owns the destination. irecv() registers the destination
//     (through the registration cache) and sends the sender a *credit*: a small
//     control message with the sequence number, address, rkey, length and the
//     wire header it expects.
//   - The sender matches credits to its isend()s in order, compares the
//     expected header with its own, and only then RDMA-WRITEs the payload
//     straight into the destination; the last write carries the sequence
//     number as immediate data, which completes the receive. So, as on TCP, a
//     mismatched op is caught before one payload byte lands in a user buffer:
//     the sender answers a bad credit with a mismatch message instead.
//   - A connection carries independently ordered streams of messages each way
//     (stream 0 for isend/irecv, others for a rails transport that moves a
//     failed port's messages here: rail_endpoint.h); credits and immediates
//     name their stream.
//   - Zero-byte messages (the "go" of rooted ops, empty alltoall pairs) are a
//     control message instead of a zero-length write, which not every provider
//     handles alike.
//   - Control messages are SENDs into small pre-posted receive slots; RNR retry
//     is infinite, so a burst of credits waits for slots instead of failing.
//   - The side channel sees a dead peer at once (EOF) and carries abort
//     messages of any length; RC retries catch a dead peer while sending.
//   - Peers that set-up does not connect (transport.h, connections on demand)
//     connect on first use: the OnDemandConnector delivers the socket, and this
//     transport's thread swaps queue pairs over it in steps (Handshake), never
//     waiting on the peer; the requests wait for it in order.
// Device limits (max_qp_wr, max_cqe, max_msg_sz, max_mr_size, active MTU) are
// read from the device and respected: PVRDMA, rxe and mlx5 differ a lot.
#pragma once

#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "config.h"
#include "edge_meter.h"
#include "on_demand_peers.h"
#include "peer_listener.h"
#include "rail_endpoint.h"
#include "rdma/ib_device.h"
#include "request_lifecycle.h"
#include "side_channel.h"
#include "transport.h"

namespace rcoll {

// The verbs objects (rdma/verbs_abi.h), named only by pointer here.
struct ibv_context;
struct ibv_pd;
struct ibv_cq;
struct ibv_comp_channel;
struct ibv_mr;
struct ibv_qp;
struct ibv_wc;

class MrCache;
struct IbvApi;

class VerbsTransport : public Transport, public RailEndpoint {
 public:
  // Opens `port` (from chooseIbPort) and listens for handshakes on `bind_host`.
  VerbsTransport(const ConnectInfo& info, const Config& config, const std::string& bind_host, const IbPortChoice& port);
  ~VerbsTransport() override;

  const char* name() const override { return "ib"; }
  std::string listenAddress() const override { return listen_address_; }
  void connect(int peer, const std::string& address, Deadline deadline) override;
  int accept(Deadline deadline) override;
  void closeListener() override {
    if (listener_) listener_->close();
  }
  bool connected(int peer) const override;
  bool canConnectOnDemand(int) const override { return true; }
  void connectOnDemand(const std::vector<std::string>& addresses) override;

  bool needsRegistration() const override { return true; }
  MemoryHandle registerMemory(void* data, size_t bytes) override;
  MemoryHandle registerDeviceMemory(void* data, size_t bytes, int dmabuf_fd, uint64_t dmabuf_offset,
                                    std::string* why) override;
  void deregisterMemory(MemoryHandle handle) override;
  void invalidateMemory(const void* data, size_t bytes) override;

  Request* isend(int peer, const WireHeader& header, const void* data, size_t bytes) override;
  Request* irecv(int peer, const WireHeader& expected, void* data, size_t bytes) override;
  void progress(std::chrono::milliseconds timeout) override;
  Activity progressNow() override;
  bool prepareSleep(std::vector<pollfd>* fds) override;
  Activity finishSleep(const pollfd* fds, size_t count) override;
  std::chrono::milliseconds maxSleep() const override;  // a link failure's drain has a deadline
  TransportFailure failure(Request* request) const override;
  void release(Request* request) override;
  void interrupt() override;
  void abortPeers(ErrorKind kind, const std::string& message) override;
  // Outgoing: the sender sees an RDMA write's last completion, the receiver only its immediate.
  void edgeTraffic(std::vector<EdgeTraffic>* out) const override;

  // RailEndpoint (rail_endpoint.h), for a rails transport; verbs_failure.cc.
  void joinRails() override { in_rails_ = true; }
  Request* isendOn(int stream, int peer, const WireHeader& header, const void* data, size_t bytes) override;
  Request* irecvOn(int stream, int peer, const WireHeader& expected, void* data, size_t bytes) override;
  std::vector<int> takeLinkFailures() override;
  uint64_t arrived(int peer, int stream) const override;
  void connectAhead(int peer) override;
  void failLink(int peer, const std::string& why) override;
  bool connectionFailed(int peer, TransportFailure* why) const override;
  bool usable(int peer) const override;
  bool sendNote(const RailNote& note) override;
  std::vector<RailNote> takeNotes() override;
  std::string portName() const override;

 private:
  struct WrOwner;
  struct CtrlSlot;
  struct VerbsRequest;
  struct Outgoing;
  struct Stream;
  struct Connection;
  struct QpInfo;
  struct Handshake;

  // The types are in verbs_transport_internal.h; the methods below are grouped
  // by the file that implements them.

  // verbs_connect.cc. Queue pairs are set up in steps that set-up's blocking
  // exchange (setUpConnection) and the exchange on first use (Handshake) share.
  void setUpConnection(int peer, int fd, Deadline deadline);
  std::unique_ptr<Connection> createQp(int peer, int fd, std::string* why);  // INIT, receive slots posted
  QpInfo describeQp(const Connection& c) const;
  bool connectQp(Connection& c, const QpInfo& theirs, std::string* why);  // RTR, RTS
  // verbs_on_demand.cc: connections on demand.
  void serviceOnDemand();
  void adoptOutcome(OnDemandPeers<VerbsRequest>::Outcome& outcome);
  std::optional<std::string> stepHandshake(Handshake& handshake);
  void endHandshake(size_t index, const std::string& failure);  // "" when connected

  // verbs_transport.cc: the requests' ends.
  void finish(VerbsRequest* r, Request::State state, const TransportFailure* why);
  void maybeRecycle(VerbsRequest* r);  // after a work request completed (holds dropped)

  // verbs_registration.cc.
  std::unique_ptr<MrCache> makeMrCache();     // registering through this transport's protection domain
  void releaseRegistration(VerbsRequest* r);  // once the request is final and no work request is left
  bool acquireMemory(VerbsRequest* r, bool writable);

  // verbs_data_path.cc.
  Request* post(VerbsRequest* r);
  void matchCredits(Connection& c, uint32_t stream);
  void flush(Connection& c);
  bool postCtrl(Connection& c, const Outgoing& item);
  bool postData(Connection& c, VerbsRequest* r);
  void postRecvSlot(Connection& c, CtrlSlot& slot);

  // verbs_completions.cc.
  int pollCompletions();
  void onCompletion(const ibv_wc& wc);
  void onControl(Connection& c, const char* message);
  void onData(Connection& c, uint32_t stream, uint64_t seq);
  std::string completionError(const Connection& c, const ibv_wc& wc, bool port_active) const;
  void failOnCompletion(Connection& c, const ibv_wc& wc);
  bool portActive() const;

  // verbs_failure.cc.
  void serviceAsyncEvents();
  void serviceSideChannel(Connection& c);
  bool handshaking(int peer) const;  // swapping queue pairs with `peer` (on first use)
  void peerClosed(Connection& c);
  // `peer_reported`: the peer told us why it failed (an abort), or nothing needed the connection (one made
  // ahead, connectAhead), so the peer is not lost (Transport::lostPeers).
  // `link`: the path may be what failed (TransportFailure::link): the requests
  // wait until what had arrived is counted (Connection::draining).
  void failConnection(Connection& c, ErrorKind kind, const std::string& message, bool peer_reported = false,
                      bool link = false);
  void failRequests(Connection& c);    // the end of failConnection(), after any drain
  void failQueued(Connection& c);      // what failRequests() fails but the writes in flight
  void endLinkFailure(Connection& c);  // a link failure's requests fail once what arrived is counted
  void checkDrains();                  // a drain whose flushes never came ends at its deadline

  const IbvApi& api_;
  ConnectInfo info_;
  Config config_;
  IbPortChoice port_;
  std::unique_ptr<PeerListener> listener_;  // moved into the connector when some peers connect on demand
  std::string listen_address_;
  ibv_context* context_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* cq_ = nullptr;
  unsigned unacked_cq_events_ = 0;
  char* ctrl_memory_ = nullptr;  // every connection's control slots, registered once
  ibv_mr* ctrl_mr_ = nullptr;
  std::unique_ptr<MrCache> mr_cache_;
  int wake_fd_ = -1;

  // From the device and port.
  int active_mtu_ = 0;  // ibv_mtu enum value
  uint16_t lid_ = 0;
  uint8_t gid_[16] = {};
  uint64_t max_msg_bytes_ = 0;  // largest single RDMA write
  uint64_t max_mr_bytes_ = 0;
  int sq_depth_ = 0;
  int recv_slots_ = 0;
  int send_slots_ = 0;

  std::vector<std::unique_ptr<Connection>> connections_;  // indexed by peer rank
  EdgeMeter meter_;                                       // large sends, per peer (VerbsRequest::metered)
  OnDemandPeers<VerbsRequest> on_demand_;                 // not started when set-up connects every peer
  std::vector<std::unique_ptr<Handshake>> handshakes_;    // peers on demand swapping queue pairs (few at a time)
  RequestLifecycle<VerbsRequest> requests_{[this](VerbsRequest* r) { releaseRegistration(r); }};
  std::vector<pollfd> poll_fds_;         // progress() scratch
  std::vector<Connection*> poll_peers_;  // whose side channels prepareSleep() appended, in order
  size_t poll_on_demand_ = 0;            // fds prepareSleep() appended after them: the connector's, handshakes
  bool aborted_ = false;
  bool progressed_ = false;         // a request finished since progress() started
  int draining_ = 0;                // connections draining after a link failure
  bool in_rails_ = false;           // joinRails()
  bool async_broken_ = false;       // the async event fd failed: no longer polled
  std::vector<int> link_failures_;  // takeLinkFailures()
  std::vector<RailNote> notes_;     // takeNotes()
};

}  // namespace rcoll
