#include "rails_probe.h"

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <string>

#include "error.h"
#include "lane_probe.h"
#include "wire.h"

namespace rcoll {

namespace {

using Clock = std::chrono::steady_clock;

// The probe's messages: point-to-point, op number 0 (ops count from 1, so no
// op of the job can take them for its own).
WireHeader probeHeader(const ConnectInfo& info, int from, uint64_t bytes) {
  OpDesc op;
  op.kind = OpKind::kPointToPoint;
  op.dtype = DataType::kUInt8;
  op.count = bytes;
  op.seq = 0;
  return makeHeader(op, info.comm_id, static_cast<uint32_t>(from), 0, bytes);
}

// One rail's requests, completed in order (a pair's messages on one rail are).
struct RailRequests {
  Transport* rail = nullptr;
  std::vector<Request*> requests;
  size_t done = 0;  // requests[0, done) are done
};

// The scratch memory: the acceptor's receives, rail by rail (the dialer
// sends from the start), then the weights.
size_t probeWeightsAt(size_t rails) { return rails * kRailProbeMessages * kRailProbeBytes; }

class Probe {
 public:
  Probe(Transport& group, const ConnectInfo& info, int peer, Deadline deadline)
      : group_(group), info_(info), peer_(peer), deadline_(deadline) {}
  ~Probe() {
    for (RailRequests& r : rails_) {
      for (Request* q : r.requests) r.rail->release(q);
    }
  }

  RailRequests& add(Transport* rail) {
    rails_.push_back(RailRequests{rail, {}, 0});
    return rails_.back();
  }

  // Moves each rail's count of done requests on; throws on a failed one.
  void look() {
    for (RailRequests& r : rails_) {
      while (r.done < r.requests.size() && r.requests[r.done]->state != Request::State::kPending) {
        Request* q = r.requests[r.done];
        if (q->state == Request::State::kFailed) {
          const TransportFailure why = r.rail->failure(q);
          throwError(why.kind, strFormat("rank %d: measuring the RDMA ports to rank %d: %s", info_.rank, peer_,
                                         why.message.c_str()));
        }
        ++r.done;
      }
    }
  }

  bool railDone(const RailRequests& r) const { return r.done == r.requests.size(); }
  bool allDone() const {
    return std::all_of(rails_.begin(), rails_.end(), [&](const RailRequests& r) { return railDone(r); });
  }

  // Drives the rails until something completes (or a little time passed).
  void step() {
    const auto left = deadline_ - Clock::now();
    if (left <= Clock::duration::zero()) {
      throwError(ErrorKind::kTimeout,
                 strFormat("rank %d: measuring the RDMA ports to rank %d: no answer within the connect timeout "
                           "(RCOLL_CONNECT_TIMEOUT)",
                           info_.rank, peer_));
    }
    group_.progress(std::min(std::chrono::duration_cast<std::chrono::milliseconds>(left) + std::chrono::milliseconds(1),
                             std::chrono::milliseconds(100)));
    look();
  }

  // Drives the rails until every request is done.
  void waitAll() {
    look();
    while (!allDone()) step();
  }

  std::deque<RailRequests>& rails() { return rails_; }

 private:
  Transport& group_;
  const ConnectInfo& info_;
  int peer_;
  Deadline deadline_;
  std::deque<RailRequests> rails_;  // add() hands out references that later adds keep valid
};

std::vector<int> probeAsDialer(Transport& group, const std::vector<Transport*>& rails, const ConnectInfo& info,
                               int peer, Deadline deadline, char* scratch) {
  uint32_t* weights = reinterpret_cast<uint32_t*>(scratch + probeWeightsAt(rails.size()));
  const size_t weight_bytes = rails.size() * sizeof(uint32_t);
  Probe probe(group, info, peer, deadline);
  RailRequests& answer = probe.add(rails[0]);
  answer.requests.push_back(rails[0]->irecv(peer, probeHeader(info, peer, weight_bytes), weights, weight_bytes));
  std::vector<RailRequests*> sends;
  for (Transport* rail : rails) sends.push_back(&probe.add(rail));
  for (int m = 0; m < kRailProbeMessages; ++m) {  // rail by rail in turn, so that none starts ahead
    for (size_t i = 0; i < rails.size(); ++i) {
      sends[i]->requests.push_back(
          rails[i]->isend(peer, probeHeader(info, info.rank, kRailProbeBytes), scratch, kRailProbeBytes));
    }
  }
  probe.waitAll();
  return std::vector<int>(weights, weights + rails.size());
}

std::vector<int> probeAsAcceptor(Transport& group, const std::vector<Transport*>& rails, const ConnectInfo& info,
                                 int peer, Deadline deadline, char* scratch, std::vector<double>* rates) {
  uint32_t* weights = reinterpret_cast<uint32_t*>(scratch + probeWeightsAt(rails.size()));
  const size_t weight_bytes = rails.size() * sizeof(uint32_t);
  {
    Probe probe(group, info, peer, deadline);
    std::vector<RailRequests*> recvs;
    for (Transport* rail : rails) recvs.push_back(&probe.add(rail));
    for (int m = 0; m < kRailProbeMessages; ++m) {  // rail by rail in turn, as the dialer sends
      for (size_t i = 0; i < rails.size(); ++i) {
        char* at = scratch + (i * kRailProbeMessages + static_cast<size_t>(m)) * kRailProbeBytes;
        recvs[i]->requests.push_back(
            rails[i]->irecv(peer, probeHeader(info, peer, kRailProbeBytes), at, kRailProbeBytes));
      }
    }
    // From the first message on any rail (credits and queue pairs warmed
    // up) to the first rail that has all of its own: what each brought.
    std::vector<size_t> at_start;
    std::vector<size_t> at_end;
    Clock::time_point started{};
    Clock::time_point ended{};
    auto counts = [&] {
      std::vector<size_t> c;
      for (const RailRequests& r : probe.rails()) c.push_back(r.done);
      return c;
    };
    probe.look();
    for (;;) {
      const auto& rails_now = probe.rails();
      if (at_start.empty() &&
          std::any_of(rails_now.begin(), rails_now.end(), [](const RailRequests& r) { return r.done > 0; })) {
        started = Clock::now();
        at_start = counts();
      }
      if (at_end.empty() &&
          std::any_of(rails_now.begin(), rails_now.end(), [&](const RailRequests& r) { return probe.railDone(r); })) {
        ended = Clock::now();
        at_end = counts();
      }
      if (probe.allDone()) break;
      probe.step();
    }
    const double seconds = std::max(1e-9, std::chrono::duration<double>(ended - started).count());
    rates->clear();
    for (size_t i = 0; i < at_end.size(); ++i) {
      rates->push_back(static_cast<double>((at_end[i] - at_start[i]) * kRailProbeBytes) / seconds);
    }
    if (std::all_of(rates->begin(), rates->end(), [](double r) { return r == 0; })) {
      rates->assign(at_end.size(), 1.0);  // every rail's messages came at once: nothing to tell them apart
    }
  }
  const std::vector<int> measured = weightsFromRates(*rates);
  std::copy(measured.begin(), measured.end(), weights);
  Probe probe(group, info, peer, deadline);
  probe.add(rails[0]).requests.push_back(
      rails[0]->isend(peer, probeHeader(info, info.rank, weight_bytes), weights, weight_bytes));
  probe.waitAll();
  return measured;
}

}  // namespace

size_t railProbeScratchBytes(size_t rails) { return probeWeightsAt(rails) + rails * sizeof(uint32_t); }

std::vector<int> probeRails(Transport& group, const std::vector<Transport*>& rails, const ConnectInfo& info, int peer,
                            bool dialer, Deadline deadline, char* scratch, std::vector<double>* rates) {
  std::vector<int> weights = dialer ? probeAsDialer(group, rails, info, peer, deadline, scratch)
                                    : probeAsAcceptor(group, rails, info, peer, deadline, scratch, rates);
  if (weights.size() != rails.size() ||
      std::any_of(weights.begin(), weights.end(), [](int w) { return w < 1 || w > kMaxWeight; })) {
    throwError(ErrorKind::kPeer, strFormat("rank %d: rank %d answered the RDMA ports' measurement with shares out of "
                                           "range (protocol error)",
                                           info.rank, peer));
  }
  return weights;
}

}  // namespace rcoll
