// Several transports driven as one: what a transport made of children needs
// to wait on all of them at once. Two kinds build on it: a composite
// (composite_transport.h: each child serves its own peers) and rails
// (rails_transport.h: every child serves the same peers, each a share of
// their messages).
//
// Waiting is the part that cannot simply be delegated: each child blocks in a
// poll() of its own (TCP: sockets; shm: a doorbell eventfd after a short spin;
// verbs: the completion channel), and one thread must wait on all of them at
// once. So progress() drives the children through the split interface
// (transport.h): a non-blocking pass over each, a sched_yield() spin of
// RCOLL_SPIN_US while bytes move (as shm does alone), then one poll() over
// every child's descriptors, each child having announced its sleep first
// (shm's sleep words, verbs' armed completion queue) so that no wake-up is
// lost, and finally each child handles what woke it. Abort reaches every
// child.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <vector>

#include "socket_util.h"
#include "transport.h"

namespace rcoll {

class TransportGroup : public Transport {
 public:
  ~TransportGroup() override;

  void progress(std::chrono::milliseconds timeout) override;
  Activity progressNow() override;
  bool prepareSleep(std::vector<pollfd>* fds) override;
  Activity finishSleep(const pollfd* fds, size_t count) override;
  std::chrono::milliseconds maxSleep() const override;
  void interrupt() override;
  void abortPeers(ErrorKind kind, const std::string& message) override;
  void settleAbort() override;
  std::vector<int> lostPeers() const override;                     // every child's, once each
  void edgeTraffic(std::vector<EdgeTraffic>* out) const override;  // every child's

 protected:
  // `spin`: how long progress() polls the children before it sleeps (RCOLL_SPIN_US).
  TransportGroup(const ConnectInfo& info, std::vector<std::unique_ptr<Transport>> children,
                 std::chrono::microseconds spin);

  ConnectInfo info_;
  std::vector<std::unique_ptr<Transport>> children_;

 private:
  bool sleep(Deadline deadline);  // true if interrupted
  void takeInterrupt();

  std::chrono::microseconds spin_;
  int wake_fd_ = -1;  // interrupt()
  std::atomic<bool> interrupted_{false};
  std::vector<pollfd> poll_fds_;   // sleep() scratch: wake_fd_, then each child's range
  std::vector<size_t> child_fds_;  // where each child's range starts in poll_fds_ (and ends: next start)
};

}  // namespace rcoll
