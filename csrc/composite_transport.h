// One transport made of several, each serving its own peers: shared memory to
// the ranks on this host, verbs or TCP to the others, in one ring.
//
// Every call that names a peer (connect, isend, irecv, connected) goes to the
// child that serves it; failure() and release() follow Request::peer. Memory
// registration goes to the one child that needs it (verbs): the executor
// registers each region once, without knowing which peers will touch it, and
// the other children need nothing. Abort and invalidation reach every child.
//
// Waiting on all children at once is the group's (transport_group.h). A rank
// whose peers all use one transport never builds a composite: that
// transport's own tuned progress() runs, unchanged.
//
// Accepting: each child has its own listener and accepts only its own peers
// (Transport::setPeers). accept() takes them child by child; since every rank
// dials its lower ranks in increasing order, a higher rank blocked on a child
// not yet accepting never holds up one that this rank accepts first (a rank
// only dials ranks below this one before dialing this one), so the mesh cannot
// deadlock.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "socket_util.h"
#include "transport.h"
#include "transport_group.h"

namespace rcoll {

class CompositeTransport : public TransportGroup {
 public:
  // `route[peer]` is the index in `children` of the child that serves `peer`
  // (-1 for this rank). Gives each child its share of peers (setPeers). At most
  // one child may need memory registration.
  // `spin`: how long progress() polls the children before it sleeps (RCOLL_SPIN_US).
  CompositeTransport(const ConnectInfo& info, std::vector<std::unique_ptr<Transport>> children, std::vector<int> route,
                     std::chrono::microseconds spin);

  const char* name() const override { return name_.c_str(); }  // "shm+tcp"
  // "kind=address kind=address": one listener per child (see listenAddresses()).
  std::string listenAddress() const override;
  // `address` is the peer's address for the kind of this edge (pickAddress()).
  void connect(int peer, const std::string& address, Deadline deadline) override;
  int accept(Deadline deadline) override;
  void closeListener() override;
  bool connected(int peer) const override;
  bool canConnectOnDemand(int peer) const override;
  void connectOnDemand(const std::vector<std::string>& addresses) override;
  const char* transportOf(int peer) const override;  // the serving child's name

  bool needsRegistration() const override { return registrar_ != nullptr; }
  MemoryHandle registerMemory(void* data, size_t bytes) override;
  // Never: a shared-memory or TCP edge would have the CPU touch device memory.
  MemoryHandle registerDeviceMemory(void* data, size_t bytes, int dmabuf_fd, uint64_t dmabuf_offset,
                                    std::string* why) override;
  void deregisterMemory(MemoryHandle handle) override;
  void invalidateMemory(const void* data, size_t bytes) override;

  Request* isend(int peer, const WireHeader& header, const void* data, size_t bytes) override;
  Request* irecv(int peer, const WireHeader& expected, void* data, size_t bytes) override;
  bool canPeek(int peer) const override;
  bool peekIncoming(int peer, WireHeader* header) override;
  TransportFailure failure(Request* request) const override;
  void release(Request* request) override;

 private:
  Transport& childOf(int peer) const;

  std::vector<int> route_;          // per peer: index into children_, -1 for this rank
  Transport* registrar_ = nullptr;  // the child that needs registered memory, if any
  std::string name_;
};

// What a rank publishes in the store: "kind=address" per listener it runs,
// separated by spaces (a composite: one per child).
std::string listenAddresses(const Transport& transport);
// The address for `kind` in a peer's published list; throws RcollError(kConfig)
// naming both ranks when the peer runs no listener of that kind (the two ranks
// disagree on this edge's transport).
std::string pickAddress(const std::string& published, const std::string& kind, int rank, int peer);

}  // namespace rcoll
