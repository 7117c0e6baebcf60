// Standalone tests of connections on demand (csrc/on_demand_connector.cc)
// with several sockets per peer: rank 0's connector in this process, rank 1
// played by hand with PendingDial. What they pin down: a peer is delivered
// once every lane of it is connected; a peer that closes a lane before the
// others are connected (its dial of another lane failed, or it exited) fails
// at once instead of when a note times out; a peer of set-up that does the
// same is dropped without a failure and may connect again. Built and run by
// tests/native/test_cpp.py under ASan + UBSan and TSan (the connector is a thread).
// Exit status is nonzero on any failure.

#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "on_demand_connector.h"
#include "peer_listener.h"
#include "unit_check.h"

using namespace rcoll;
using Clock = std::chrono::steady_clock;

namespace {

using unit::check;

constexpr int kLanes = 2;
// Long enough that a failure seen within kPrompt cannot be a timed-out note.
constexpr auto kDialTimeout = std::chrono::seconds(30);
constexpr auto kPrompt = std::chrono::seconds(5);

ConnectInfo infoOf(int rank) {
  ConnectInfo info;
  info.comm_id = 0x5eed;
  for (size_t i = 0; i < sizeof(info.token); ++i) info.token[i] = static_cast<uint8_t>(i * 7 + 1);
  info.rank = rank;
  info.size = 2;
  return info;
}

// Rank 1 connects lane `lane` of kLanes to rank 0 at `address`: a connected socket, or -1.
int dialLane(const std::string& address, int lane) {
  PendingDial dial(infoOf(1), 0, address, SocketOptions{}, lane, kLanes, /*note=*/false, Clock::now() + kPrompt);
  short revents = 0;
  while (dial.step(revents) == PendingDial::State::kRunning) {
    pollfd p = dial.pollFd();
    revents = ::poll(&p, 1, 50) > 0 ? p.revents : 0;
  }
  if (dial.state() != PendingDial::State::kDone) {
    std::fprintf(stderr, "dialing lane %d: %s\n", lane, dial.failure().message.c_str());
    return -1;
  }
  return dial.takeFd();
}

// What the connector delivers within kPrompt (an outcome with peer -1: nothing).
OnDemandConnector::Outcome awaitOutcome(OnDemandConnector& connector) {
  const auto deadline = Clock::now() + kPrompt;
  while (Clock::now() < deadline) {
    std::vector<OnDemandConnector::Outcome> taken = connector.take();
    if (!taken.empty()) return std::move(taken.front());
    pollfd p{connector.readyFd(), POLLIN, 0};
    ::poll(&p, 1, 50);
  }
  return {};
}

// Closes what a test opened: the delivered lanes and rank 1's own ends (-1: none).
void closeAll(const std::vector<int>& delivered, std::initializer_list<int> own) {
  for (int fd : delivered) ::close(fd);
  for (int fd : own) {
    if (fd >= 0) ::close(fd);
  }
}

struct RankZero {
  std::string address;
  std::unique_ptr<OnDemandConnector> connector;
};

// Rank 0's connector; rank 1 is connected on demand where `rank_one_at` is
// its address, else it is a peer of set-up.
RankZero startRankZero(const std::string& rank_one_at) {
  auto listener = std::make_unique<PeerListener>(infoOf(0), "127.0.0.1", SocketOptions{}, kLanes);
  RankZero zero;
  zero.address = listener->address();
  zero.connector = std::make_unique<OnDemandConnector>(
      infoOf(0), std::move(listener), std::vector<std::string>{"", rank_one_at}, SocketOptions{}, kLanes, kDialTimeout);
  return zero;
}

// Rank 0 asks rank 1 to dial (a note to rank 1's listener, which nobody
// serves here: the kernel takes the note); rank 1 dials every lane.
void testEveryLaneDelivers() {
  PeerListener rank_one(infoOf(1), "127.0.0.1", SocketOptions{}, kLanes);
  RankZero zero = startRankZero(rank_one.address());
  zero.connector->want(1);
  const int lane0 = dialLane(zero.address, 0), lane1 = dialLane(zero.address, 1);
  check(lane0 >= 0 && lane1 >= 0, "rank 1 connects both lanes");
  OnDemandConnector::Outcome o = awaitOutcome(*zero.connector);
  check(o.peer == 1 && o.fds.size() == static_cast<size_t>(kLanes), "rank 1 delivered with both lanes");
  closeAll(o.fds, {lane0, lane1});
}

// Rank 1 connects lane 0, then gives up (as when its dial of lane 1 fails)
// and closes it: rank 0, which asked for rank 1, fails it at once.
void testLaneClosedEarlyFailsThePeer() {
  PeerListener rank_one(infoOf(1), "127.0.0.1", SocketOptions{}, kLanes);
  RankZero zero = startRankZero(rank_one.address());
  zero.connector->want(1);
  const auto start = Clock::now();
  const int lane0 = dialLane(zero.address, 0);
  check(lane0 >= 0, "rank 1 connects lane 0");
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // rank 0 holds lane 0, waits for lane 1
  if (lane0 >= 0) ::close(lane0);
  OnDemandConnector::Outcome o = awaitOutcome(*zero.connector);
  check(o.peer == 1 && o.fds.empty(), "rank 1 fails when it closes its lane early");
  check(o.failure.kind == ErrorKind::kPeer, "a peer failure");
  check(o.failure.message.find("rank 0: rank 1 closed a connection to this rank before all 2 sockets") == 0,
        "the failure says what happened: " + o.failure.message);
  check(Clock::now() - start < kPrompt, "at once, not when the note times out");
}

// The same from a peer of set-up: its lane is dropped, nothing is delivered,
// and it may connect every lane afterwards.
void testSetupPeerMayConnectAgain() {
  RankZero zero = startRankZero("");
  const int early = dialLane(zero.address, 0);
  check(early >= 0, "set-up peer connects lane 0");
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (early >= 0) ::close(early);
  // Lane 0 again, once rank 0 has seen the close (until then it refuses lane 0
  // as connected). Before rank 0 watched early lanes, the closed lane stayed
  // taken for good, and lane 1 delivered the peer with the dead socket.
  int lane0 = -1;
  for (const auto until = Clock::now() + kPrompt; lane0 < 0 && Clock::now() < until;) {
    lane0 = dialLane(zero.address, 0);
    if (lane0 < 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  check(zero.connector->take().empty(), "no outcome for a set-up peer's early close");
  const int lane1 = dialLane(zero.address, 1);
  check(lane0 >= 0 && lane1 >= 0, "set-up peer connects both lanes again");
  OnDemandConnector::Outcome o = awaitOutcome(*zero.connector);
  check(o.peer == 1 && o.fds.size() == static_cast<size_t>(kLanes), "set-up peer delivered once both lanes connect");
  closeAll(o.fds, {lane0, lane1});
}

}  // namespace

int main() {
  try {
    testEveryLaneDelivers();
    testLaneClosedEarlyFailsThePeer();
    testSetupPeerMayConnectAgain();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "FAIL: unexpected exception: %s\n", e.what());
    return 1;
  }
  return unit::finishUnit("test_on_demand_connector");
}
