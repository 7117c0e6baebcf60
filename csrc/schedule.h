// A collective, as the algorithms describe it to the executor: two ordered
// lists of segment transfers and the dependencies between them.
//
// Algorithms (algorithms.h) build schedules from buffers, counts and ranks;
// the executor (pipeline_executor.h) runs them over a transport. Neither side
// knows the other's business: algorithms never see a socket, the executor never
// decides which block goes where.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "wire.h"

namespace rcoll {

struct SendStep {
  int peer;
  const char* data;
  uint64_t offset;  // element offset within the op's buffer (goes into the header)
  uint64_t count;   // elements
  int after_recv;   // index into Schedule::recvs that must complete first, or -1
  // Wait for every receive before `after_recv` too. Receives complete in any
  // order, so one done says nothing of those before it; a chain of zero-byte
  // messages that must carry "every earlier one arrived" (the dissemination
  // barrier's rounds) needs this, a send that forwards the data of one
  // receive does not.
  bool after_earlier_recvs = false;
};

struct RecvStep {
  int peer;
  uint64_t offset;
  uint64_t count;
  // Either the bytes land in `direct`, or they are staged and then reduced:
  // reduce_out[i] = reduce_in[i] (op) staged[i]. Neither set: a zero-byte message.
  char* direct;
  char* reduce_out;
  const char* reduce_in;
  bool divide_after;  // avg: divide reduce_out by the world size once reduced
  // The received operand comes first: reduce_out = staged (op) reduce_in. Lets
  // every rank combine partial results in one canonical order, so that results
  // are bit-identical across ranks even where (op) is not (min/max of +0 and -0).
  bool staged_first = false;
  // The reduction waits for this send (index into Schedule::sends) to finish,
  // when that send reads the memory the reduction overwrites. -1: none.
  int reduce_after_send = -1;
  // The reduction waits for this receive (index into Schedule::recvs) to be
  // done, when that receive wrote `reduce_in` (an earlier phase's result, as in
  // the hierarchical allreduce). -1: none. Always an earlier receive, so it
  // holds its slot already and cannot wait on this one.
  int reduce_after_recv = -1;
};

struct Schedule {
  OpDesc op;
  const char* algorithm = "";  // what built it, for the timeline ("ring", "hierarchical", ...)
  size_t elem_size = 1;
  std::vector<SendStep> sends;
  std::vector<RecvStep> recvs;
  // alltoall only (empty otherwise): the header `count` of every message to
  // peer p is send_pair_count[p], of every message from p recv_pair_count[p]
  // (wire.h). Empty: op.count.
  std::vector<uint64_t> send_pair_count;
  std::vector<uint64_t> recv_pair_count;

  void reset(const OpDesc& desc, size_t element_size) {
    op = desc;
    elem_size = element_size;
    algorithm = "";
    sends.clear();  // keeps capacity: no allocation on the hot path after warm-up
    recvs.clear();
    send_pair_count.clear();
    recv_pair_count.clear();
  }
};

// Which receives of a running schedule are done, and whether a send may
// leave (SendStep::after_recv, after_earlier_recvs). Both executors keep one.
class RecvProgress {
 public:
  void reset(size_t recvs) {
    done_.assign(recvs, 0);
    prefix_ = 0;
  }
  void markDone(size_t index) {
    done_[index] = 1;
    while (prefix_ < done_.size() && done_[prefix_] != 0) ++prefix_;
  }
  bool done(int index) const { return done_[static_cast<size_t>(index)] != 0; }
  bool sendReady(const SendStep& step) const {
    if (step.after_recv < 0) return true;
    return step.after_earlier_recvs ? prefix_ > static_cast<size_t>(step.after_recv) : done(step.after_recv);
  }

 private:
  std::vector<uint8_t> done_;
  size_t prefix_ = 0;  // receives [0, prefix_) are all done
};

// The executors' send window. Sends wait in one queue per peer and at most
// kSendWindow are in flight in all, which keeps the request pool small for
// long schedules; but a peer with none in flight may always take its next
// send. Without that exception, sends to one peer that wait on a busy
// receiver can fill the window and starve another peer whose receiver waits
// for exactly that send, and every rank stalls (the hierarchical allreduce
// with more than a window of segments per block did).
constexpr size_t kSendWindow = 64;
inline bool sendWindowOpen(size_t in_flight, size_t in_flight_to_peer, size_t window = kSendWindow) {
  return in_flight_to_peer == 0 || in_flight < window;
}

}  // namespace rcoll
