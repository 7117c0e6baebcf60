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
#pragma once

#include <memory>
#include <string>
#include <vector>

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

 private:
  size_t railFor(std::vector<std::vector<uint64_t>>* load, int peer, size_t bytes) const;
  void weighRails(int peer, bool dialer, Deadline deadline);

  std::vector<std::vector<uint64_t>> sends_;  // per peer, per rail: bytes given to it so far, each way
  std::vector<std::vector<uint64_t>> recvs_;
  std::vector<std::vector<int>> weights_;  // per peer, per rail: its share (rails_probe.h)
  std::vector<char> probe_scratch_;        // what the probes' messages read and write, until closeListener()
};

}  // namespace rcoll
