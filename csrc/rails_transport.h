// One transport made of several alike, each reaching every peer over a port
// of its own ("rails": RCOLL_IB_HCA naming several RDMA ports), a pair's
// messages spread over them.
//
// Each message to a peer goes on the rail that has carried the fewest bytes
// to it so far for its weight, and the receive posted for it reads that same
// rail (the receiver counts the same sizes in the same order, with the same
// weights), so both ends agree without a word, the rails carry bytes in
// proportion to their weights whatever the pattern of sizes, and the per-pair
// order that the interface promises holds (completions may come out of order
// across rails; callers test each request). The weights are measured when
// the pair connects at set-up (rails_probe.h); peers connected on first use
// keep equal ones. Ranks that disagree on a message's size (a mismatched op)
// may then look on different rails: the first header either side checks, or
// the op's timeout, still reports it. Every rail is a
// whole transport of its own (the verbs transport on one port: its device
// context, protection domain, completion queue, registrations and queue
// pairs); this one only deals the messages out, registers memory with every
// rail, and waits on all of them at once (transport_group.h).
//
// Set-up: each rail has its own listener; the published address lists them
// in rail order, separated by '|'. A dialer connects rail by rail; accept()
// completes one peer on every rail before it returns it (rail 0's order), so
// the mesh's ordering argument (composite_transport.h) holds for each rail.
// Ranks agree on the number of rails before they build them (mesh.cc).
//
// A rail whose link fails to a peer (rails_failover.cc) takes no message
// with it: the pair's messages on it go again, and from then on, over a rail
// that works. So the requests handed to callers are this transport's own,
// each carried by a child's request that may change.
#pragma once

#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "rail_endpoint.h"
#include "request_lifecycle.h"
#include "transport_group.h"

namespace rcoll {

class RailsTransport : public TransportGroup {
 public:
  RailsTransport(const ConnectInfo& info, std::vector<std::unique_ptr<Transport>> rails,
                 std::chrono::microseconds spin);
  ~RailsTransport() override;

  const char* name() const override { return children_.front()->name(); }
  std::string listenAddress() const override;  // "address|address|..."
  void connect(int peer, const std::string& address, Deadline deadline) override;
  int accept(Deadline deadline) override;
  void closeListener() override;
  bool connected(int peer) const override;
  bool canConnectOnDemand(int peer) const override { return children_.front()->canConnectOnDemand(peer); }
  void connectOnDemand(const std::vector<std::string>& addresses) override;
  void setPeers(std::vector<bool> served) override;

  bool needsRegistration() const override { return children_.front()->needsRegistration(); }
  MemoryHandle registerMemory(void* data, size_t bytes) override;
  MemoryHandle registerDeviceMemory(void* data, size_t bytes, int dmabuf_fd, uint64_t dmabuf_offset,
                                    std::string* why) override;
  void deregisterMemory(MemoryHandle handle) override;
  void invalidateMemory(const void* data, size_t bytes) override;

  Request* isend(int peer, const WireHeader& header, const void* data, size_t bytes) override;
  Request* irecv(int peer, const WireHeader& expected, void* data, size_t bytes) override;
  bool canPeek(int peer) const override { return children_.front()->canPeek(peer); }
  bool peekIncoming(int peer, WireHeader* header) override;
  TransportFailure failure(Request* request) const override;
  void release(Request* request) override;

  Activity progressNow() override;
  Activity finishSleep(const pollfd* fds, size_t count) override;
  std::vector<int> lostPeers() const override;

 private:
  // A caller's request, carried by a child's (`child`, on rail `carrier`).
  struct RailRequest : MessageRequest {
    int home = 0;         // the rail railFor() gave it
    uint64_t number = 0;  // its place among the pair's messages of `home`, this way, from 0
    int carrier = 0;
    Request* child = nullptr;
  };
  // The messages a pair's schedule gives one rail (their "home"), each way,
  // and the rail that carries them (rails_failover.cc): the home itself on
  // stream 0 until its link fails, then a rail that works, on stream 1 + home,
  // and the next one if that one's link fails in turn.
  struct HomeRail {
    int carrier = 0;
    bool given_up = false;  // no rail was left to take them: their requests fail
    // This end's count of the peer's messages that arrived (rails_failover.cc:
    // countArrived) is recv_base + the carrier stream's count - stream_base.
    uint64_t recv_base = 0;
    uint64_t stream_base = 0;
    // The peer's latest note (RailNote): where it put them, and how many of ours had arrived there.
    uint32_t peer_note = 0;  // its number (0: none yet)
    uint64_t peer_has = 0;
    int peer_carrier = -1;
    std::deque<RailRequest*> waiting;  // sends that wait for the peer's note of the same carrier, in order
    uint64_t sends_done = 0;           // past the last send that completed
  };
  struct Pair {
    std::vector<uint64_t> sent, received;  // per home: messages given to it, each way (the next `number`)
    uint64_t lost = 0;                     // bit r: rail r's link to the peer failed here (and was counted)
    uint64_t taken_down = 0;               // bit r: the peer could not use rail r (its note), so nor does this end
    uint32_t notes_sent = 0;               // RailNote::number
    bool rails_asked = false;              // every rail was asked to connect (RailEndpoint::connectAhead)
    std::vector<HomeRail> homes;
  };

  size_t railFor(std::vector<std::vector<uint64_t>>* load, int peer, size_t bytes) const;
  void weighRails(int peer, bool dialer, Deadline deadline);
  Request* post(RailRequest* w);
  void carry(RailRequest* w, int rail, int stream);                                // hands `w` to a child's request
  void settle(RailRequest* w, Request::State state, const TransportFailure* why);  // sets settled_
  void settleRequests();                // the carried requests whose child finished
  Activity afterRails(Activity rails);  // what progressNow() and finishSleep() do after the rails'
  // rails_failover.cc.
  void takeFailures();
  void railFailed(int peer, int rail, const TransportFailure& why);
  uint64_t countArrived(int peer, int home) const;
  int streamOn(int home, int carrier) const { return carrier == home ? 0 : 1 + home; }
  int nextCarrier(int peer, uint64_t unusable, uint64_t* lost) const;
  void onNote(const RailNote& note);
  void afterNote(int peer, int home);
  void resendWaiting(int peer, int home);
  void giveUp(int peer, int home, const TransportFailure& why);
  bool mayReplace(int peer, int home) const;
  void failWaiting();  // requests that wait for a note the peer can no longer send, or for no rail
  void failWaitingRequests(HomeRail& h, const TransportFailure& why);

  std::vector<std::vector<uint64_t>> sends_;  // per peer, per rail: bytes given to it so far, each way
  std::vector<std::vector<uint64_t>> recvs_;
  std::vector<std::vector<int>> weights_;  // per peer, per rail: its share (rails_probe.h)
  std::vector<char> probe_scratch_;        // what the probes' messages read and write, until closeListener()

  std::vector<RailEndpoint*> endpoints_;  // the children as rails (rail_endpoint.h); empty: no failover
  std::vector<Pair> pairs_;               // per peer
  std::vector<RailRequest*> open_;        // carried by a child's request that is not final yet
  RequestLifecycle<RailRequest> requests_;
  int waiting_ = 0;                      // sends in HomeRail::waiting, over every pair
  bool settled_ = false;                 // a caller's request finished since afterRails() began
  mutable std::mutex unreplaced_mutex_;  // lostPeers() runs on other threads
  std::vector<int> unreplaced_;          // peers with a rail whose link failed and could not be replaced
};

}  // namespace rcoll
