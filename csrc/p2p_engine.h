// Point-to-point messages (send / recv), outside the collective FIFO.
//
// A send or a recv must never wait behind a collective, nor a collective behind
// a large send: two ranks that each isend 32 MiB and then irecv would deadlock
// in a single in-order queue. So point-to-point traffic has its own transport
// instance (its own sockets) and its own thread, and every message is posted
// the moment it is issued. Order is kept where it matters: per peer and
// direction, messages match in issue order (like MPI's non-overtaking rule),
// and each carries a per-pair sequence number, its tag, dtype and count in the
// wire header, so that a send and a recv that disagree fail on both ranks by name.
//
// A receive from any source (recvFromAny, torch's recv without src) waits
// in the engine, not in the transport, until some peer's next unclaimed message
// carries its tag (Transport::peekIncoming); it then takes that peer's next
// sequence number and is posted like any receive, so the usual header check
// still compares dtype and count. Receives from a named peer claim that
// peer's next message at once; waiting receives from any source match in the
// order they were posted, and the engine rotates over the peers so that none
// is always served first. Every peer must be reachable by a transport that
// can peek (shared memory, TCP): verbs cannot, and the receive says so.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "dtype.h"
#include "flight_recorder.h"
#include "socket_util.h"
#include "timeline.h"
#include "transport.h"
#include "wire.h"
#include "work.h"

namespace rcoll {

class P2PEngine {
 public:
  // Called (from the engine's thread) when a message fails: the communicator
  // records the error and fails everything else with it.
  using FailureHandler = std::function<void(ErrorKind, const std::string&)>;

  P2PEngine(std::unique_ptr<Transport> transport, int rank, int size, uint64_t comm_id, FailureHandler on_failure);
  ~P2PEngine();
  P2PEngine(const P2PEngine&) = delete;
  P2PEngine& operator=(const P2PEngine&) = delete;

  // The tag of the communicator's own messages (Communicator::monitoredBarrier);
  // users' tags are >= 0.
  static constexpr int kMonitoredBarrierTag = -2;

  Transport& transport() { return *transport_; }
  void start();                                                   // after the transport's connections are up
  void setTimeline(Timeline* timeline) { timeline_ = timeline; }  // before start()
  void setTraceGroup(int group) { trace_group_ = group; }         // its communicator's, in the flight recorder

  // `timeout` bounds the message from the moment it is issued.
  std::shared_ptr<Work> send(const void* data, size_t count, DataType dtype, int peer, int tag,
                             std::chrono::milliseconds timeout);
  std::shared_ptr<Work> recv(void* data, size_t count, DataType dtype, int peer, int tag,
                             std::chrono::milliseconds timeout);
  // From whichever rank's next unclaimed message has `tag` first; Work::sourceRank() names it.
  std::shared_ptr<Work> recvFromAny(void* data, size_t count, DataType dtype, int tag,
                                    std::chrono::milliseconds timeout);

  // Thread-safe: fails every pending and later message with `message` and tells
  // the peers (from the engine's thread). Idempotent.
  void fail(ErrorKind kind, const std::string& message);
  // Stops the thread; pending messages fail with kAborted.
  void stop();

 private:
  static constexpr int kAnySource = -1;

  struct Message {
    bool is_send;
    int peer;     // kAnySource until such a receive has found its sender
    OpDesc desc;  // kind kPointToPoint; root = tag; seq = per-pair, per-direction number
    char* data;
    size_t bytes;
    Deadline deadline;
    Deadline issued;
    std::chrono::milliseconds timeout;
    std::shared_ptr<Work> work;
    Request* request = nullptr;
    uint64_t trace = FlightRecorder::kNoRecord;  // its flight recorder entry
  };

  // `any_source`: a receive whose peer (kAnySource) is found later.
  std::shared_ptr<Work> enqueue(bool is_send, char* data, size_t count, DataType dtype, int peer, int tag,
                                std::chrono::milliseconds timeout, bool any_source = false);
  void loop();
  void post(Message& m);  // hands m to the transport; it joins active_
  void matchAnySource();  // posts the waiting receives from any source whose sender has shown
  void failAll(ErrorKind kind, const std::string& message);
  std::string describe(const Message& m) const;

  std::unique_ptr<Transport> transport_;
  int rank_;
  int size_;
  uint64_t comm_id_;
  FailureHandler on_failure_;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Message> incoming_;         // issued, not yet posted to the transport
  std::vector<uint64_t> next_send_seq_;  // per peer
  std::vector<uint64_t> next_recv_seq_;
  bool stopping_ = false;
  bool failed_ = false;
  ErrorKind fail_kind_ = ErrorKind::kGeneric;
  std::string fail_message_;
  std::thread thread_;

  std::vector<Message> active_;     // engine thread only: posted, not finished
  std::deque<Message> any_source_;  // engine thread only: receives from any source without a sender yet
  int next_peer_to_try_ = 0;        // engine thread only: where matchAnySource starts (rotates)
  Timeline* timeline_ = nullptr;    // RCOLL_TIMELINE, owned by the communicator
  int trace_group_ = 0;
};

}  // namespace rcoll
