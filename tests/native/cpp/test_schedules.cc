// The allreduce, allgather and reduce-scatter schedules of every rank, run
// together by a small interpreter in one thread: the rings (in host order) and
// the hierarchical algorithms (csrc/hierarchical.cc) over many placements,
// counts and segment sizes. The interpreter keeps the executors' contract (schedule.h)
// and their limits: both executors' sends go out in schedule order per peer, the host
// executor's within the send window, the device executor's each in a send slot (the last
// free one only for the earliest unposted send in schedule order); receives are
// posted in schedule order as the staging slots allow; the k-th receive from a peer takes the
// k-th message that peer sent here, and a send finishes only then; a reduction waits
// for the receive and the send it names. Everything else happens in a random
// order, seeded, many times over, so a dependency that a schedule forgot to
// state shows up as a wrong result, and a cycle through the windows and slots as a
// stuck rank, rather than as a rare race or hang on a busy machine. Checks: every rank's result equals the reference,
// bit for bit alike on every rank, headers agree, and the bytes that cross
// between hosts are what the algorithm must move. Exit status nonzero on failure.

#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "algorithms.h"
#include "reduce_kernels.h"
#include "schedule.h"
#include "topology.h"

using namespace rcoll;

namespace {

int gFailures = 0;

void check(bool ok, const std::string& what) {
  if (!ok) {
    ++gFailures;
    if (gFailures <= 20) std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  }
}

// How an executor posts its work. Both keep the contract of schedule.h; they
// differ in the order of their sends and in what bounds them.
struct ExecutorModel {
  // Both post each peer's sends in schedule order (send_queues.h).
  // PipelineExecutor (host): bounded by sendWindowOpen(); receives that
  // reduce take a staging slot. DeviceStagingExecutor (false): each send
  // with bytes holds a send slot until it is delivered, and the last free slot
  // goes only to the earliest unposted send in schedule order; every receive
  // with bytes takes a receive slot.
  bool per_peer_sends;
  size_t window;  // the send window (per_peer_sends)
  int slots;      // staging slots (each pool)
  std::string name() const {
    return (per_peer_sends ? "host executor, window " + std::to_string(window) : std::string("device executor")) +
           ", " + std::to_string(slots) + " slot(s)";
  }
};

// The host executor's bound on receives that land in place (pipeline_executor.cc).
constexpr size_t kDirectRecvsInFlight = 64;

struct Message {
  int send_index;
  bool read;  // the bytes were read when the send was posted; else they are read when delivered
  std::vector<char> bytes;
};

// The receives [first, end) a send waits for (schedule.h's contract, read
// here apart from the executors' RecvProgress so that the two can disagree).
std::pair<size_t, size_t> recvsWaitedFor(const SendStep& step) {
  if (step.after_recv < 0) return {0, 0};
  const size_t last = static_cast<size_t>(step.after_recv);
  return {step.after_earlier_recvs ? 0 : last, last + 1};
}

// Runs the schedules of every rank to completion as the executor `model`
// would, over a transport that buffers nothing: a send finishes only when the
// receive it matches has been posted and takes it (the worst case; real
// transports buffer some). A send's data is read at its posting or at its
// delivery, at random, as a transport may read it anywhere in between. Returns
// false (and reports) when they cannot finish: a dependency that never comes,
// a window or a slot that never frees, a message no receive takes.
// `crossing[h]` counts the bytes host h sends to other hosts.
bool interpret(std::vector<Schedule>& schedules, const Topology& t, const ExecutorModel& model, std::mt19937& rng,
               std::vector<uint64_t>& crossing, const std::string& what) {
  const int P = static_cast<int>(schedules.size());
  const size_t Pz = static_cast<size_t>(P);
  // Per rank and peer: the sends to that peer in schedule order, how many were
  // posted and how many delivered; the messages posted and not yet delivered.
  std::vector<std::vector<std::vector<int>>> to(Pz, std::vector<std::vector<int>>(Pz));
  std::vector<std::vector<size_t>> posted(Pz, std::vector<size_t>(Pz, 0)), delivered(Pz, std::vector<size_t>(Pz, 0));
  std::vector<std::vector<std::deque<Message>>> wire(Pz, std::vector<std::deque<Message>>(Pz));  // [src][dst]
  // Per rank and peer: the receives from that peer in schedule order, and how many were posted.
  std::vector<std::vector<std::vector<int>>> from(Pz, std::vector<std::vector<int>>(Pz));
  std::vector<std::vector<size_t>> recvs_posted_from(Pz, std::vector<size_t>(Pz, 0));
  std::vector<std::vector<uint8_t>> recv_done(Pz), send_done(Pz);
  // Per rank: the next receive to post in schedule order, sends and direct
  // receives in flight, free slots.
  std::vector<size_t> next_recv(Pz, 0), sends_in_flight(Pz, 0), direct_in_flight(Pz, 0);
  std::vector<int> free_send_slots(Pz, model.slots), free_recv_slots(Pz, model.slots);
  // Per rank: receives whose message arrived, waiting to complete (reduce or copy).
  std::vector<std::vector<std::pair<int, std::vector<char>>>> arrived(Pz);
  for (size_t r = 0; r < Pz; ++r) {
    recv_done[r].assign(schedules[r].recvs.size(), 0);
    send_done[r].assign(schedules[r].sends.size(), 0);
    for (size_t i = 0; i < schedules[r].recvs.size(); ++i)
      from[r][static_cast<size_t>(schedules[r].recvs[i].peer)].push_back(static_cast<int>(i));
    for (size_t i = 0; i < schedules[r].sends.size(); ++i)
      to[r][static_cast<size_t>(schedules[r].sends[i].peer)].push_back(static_cast<int>(i));
  }
  auto recv_takes_slot = [&](const RecvStep& step, size_t es) {
    return model.per_peer_sends ? step.reduce_out != nullptr : step.count * es > 0;
  };
  crossing.assign(static_cast<size_t>(t.hosts()), 0);
  enum Kind { kPostSend, kPostRecv, kDeliver, kComplete };
  struct Action {
    Kind kind;
    int rank;
    int peer_or_index;
  };
  std::vector<Action> actions;
  for (;;) {
    // Every action possible now; one of them, at random, happens.
    actions.clear();
    for (int r = 0; r < P; ++r) {
      const size_t rz = static_cast<size_t>(r);
      const Schedule& s = schedules[rz];
      auto ready = [&](int index) {
        const auto [first, end] = recvsWaitedFor(s.sends[static_cast<size_t>(index)]);
        for (size_t j = first; j < end; ++j) {
          if (!recv_done[rz][j]) return false;
        }
        return true;
      };
      int earliest = -1;  // the earliest unposted send in schedule order
      for (size_t p = 0; p < Pz; ++p) {
        if (posted[rz][p] < to[rz][p].size() && (earliest < 0 || to[rz][p][posted[rz][p]] < earliest))
          earliest = to[rz][p][posted[rz][p]];
      }
      for (size_t p = 0; p < Pz; ++p) {
        if (posted[rz][p] == to[rz][p].size()) continue;
        const int index = to[rz][p][posted[rz][p]];
        if (!ready(index)) continue;
        const bool can = model.per_peer_sends
                             ? sendWindowOpen(sends_in_flight[rz], posted[rz][p] - delivered[rz][p], model.window)
                             : s.sends[static_cast<size_t>(index)].count == 0 || free_send_slots[rz] > 1 ||
                                   (free_send_slots[rz] == 1 && index == earliest);
        if (can) actions.push_back({kPostSend, r, static_cast<int>(p)});
      }
      if (next_recv[rz] < s.recvs.size()) {
        const RecvStep& step = s.recvs[next_recv[rz]];
        const bool can = recv_takes_slot(step, s.elem_size)
                             ? free_recv_slots[rz] > 0
                             : !model.per_peer_sends || direct_in_flight[rz] < kDirectRecvsInFlight;
        if (can) actions.push_back({kPostRecv, r, 0});
      }
      for (size_t p = 0; p < Pz; ++p) {  // the oldest message from p, once its receive is posted
        if (delivered[p][rz] < posted[p][rz] && delivered[p][rz] < recvs_posted_from[rz][p])
          actions.push_back({kDeliver, r, static_cast<int>(p)});
      }
      for (size_t i = 0; i < arrived[rz].size(); ++i) {
        const RecvStep& step = s.recvs[static_cast<size_t>(arrived[rz][i].first)];
        const bool wait_recv =
            step.reduce_after_recv >= 0 && !recv_done[rz][static_cast<size_t>(step.reduce_after_recv)];
        const bool wait_send =
            step.reduce_after_send >= 0 && !send_done[rz][static_cast<size_t>(step.reduce_after_send)];
        if (!(step.reduce_out != nullptr && (wait_recv || wait_send)))
          actions.push_back({kComplete, r, static_cast<int>(i)});
      }
    }
    if (actions.empty()) break;
    const Action a = actions[std::uniform_int_distribution<size_t>(0, actions.size() - 1)(rng)];
    const size_t rz = static_cast<size_t>(a.rank);
    Schedule& s = schedules[rz];
    if (a.kind == kPostSend) {
      const size_t p = static_cast<size_t>(a.peer_or_index);
      const int index = to[rz][p][posted[rz][p]];
      const SendStep& step = s.sends[static_cast<size_t>(index)];
      // The device executor copies the data into its send slot at posting.
      Message m{index, !model.per_peer_sends || (rng() & 1) != 0, {}};
      if (m.read) m.bytes.assign(step.data, step.data + step.count * s.elem_size);
      if (!model.per_peer_sends && step.count > 0) --free_send_slots[rz];
      wire[rz][p].push_back(std::move(m));
      ++posted[rz][p];
      ++sends_in_flight[rz];
    } else if (a.kind == kPostRecv) {
      const RecvStep& step = s.recvs[next_recv[rz]++];
      if (recv_takes_slot(step, s.elem_size)) {
        --free_recv_slots[rz];
      } else {
        ++direct_in_flight[rz];
      }
      ++recvs_posted_from[rz][static_cast<size_t>(step.peer)];
    } else if (a.kind == kDeliver) {
      const size_t p = static_cast<size_t>(a.peer_or_index);
      Message m = std::move(wire[p][rz].front());
      wire[p][rz].pop_front();
      const Schedule& sender = schedules[p];
      const SendStep& sent = sender.sends[static_cast<size_t>(m.send_index)];
      if (!m.read) m.bytes.assign(sent.data, sent.data + sent.count * sender.elem_size);
      const size_t k = delivered[p][rz]++;
      --sends_in_flight[p];
      send_done[p][static_cast<size_t>(m.send_index)] = 1;
      if (!model.per_peer_sends && sent.count > 0) ++free_send_slots[p];
      if (t.host_of[p] != t.host_of[rz]) crossing[static_cast<size_t>(t.host_of[p])] += m.bytes.size();
      const int index = from[rz][p][k];
      const RecvStep& step = s.recvs[static_cast<size_t>(index)];
      if (sent.offset != step.offset || sent.count != step.count) {
        check(false, what + ": rank " + std::to_string(a.rank) + " expected offset " + std::to_string(step.offset) +
                         " count " + std::to_string(step.count) + " from rank " + std::to_string(p) + ", got " +
                         std::to_string(sent.offset) + "/" + std::to_string(sent.count));
        return false;
      }
      arrived[rz].emplace_back(index, std::move(m.bytes));
    } else {
      auto& entry = arrived[rz][static_cast<size_t>(a.peer_or_index)];
      const RecvStep& step = s.recvs[static_cast<size_t>(entry.first)];
      std::vector<char>& staged = entry.second;
      if (step.reduce_out != nullptr) {  // as PipelineExecutor::harvest
        if (step.staged_first) {
          reduceInto(staged.data(), staged.data(), step.reduce_in, step.count, s.op.dtype, s.op.reduce_op);
          std::memcpy(step.reduce_out, staged.data(), staged.size());
        } else {
          reduceInto(step.reduce_out, step.reduce_in, staged.data(), step.count, s.op.dtype, s.op.reduce_op);
        }
        if (step.divide_after) scaleDivide(step.reduce_out, step.count, s.op.dtype, Pz);
      } else if (step.count > 0) {
        std::memcpy(step.direct, staged.data(), staged.size());
      }
      if (recv_takes_slot(step, s.elem_size)) {
        ++free_recv_slots[rz];
      } else {
        --direct_in_flight[rz];
      }
      recv_done[rz][static_cast<size_t>(entry.first)] = 1;
      entry = std::move(arrived[rz].back());
      arrived[rz].pop_back();
    }
  }
  bool finished = true;
  for (size_t r = 0; r < Pz; ++r) {
    size_t recvs = 0, sends = 0;
    for (uint8_t d : recv_done[r]) recvs += d;
    for (uint8_t d : send_done[r]) sends += d;
    if (sends != schedules[r].sends.size() || recvs != recv_done[r].size()) {
      check(false, what + " (" + model.name() + "): rank " + std::to_string(r) + " is stuck (" + std::to_string(sends) +
                       "/" + std::to_string(schedules[r].sends.size()) + " sends delivered, " + std::to_string(recvs) +
                       "/" + std::to_string(recv_done[r].size()) + " receives done)");
      finished = false;
    }
  }
  return finished;
}

std::vector<HostEntry> hostsOf(const std::string& layout) {  // "AABB": rank r on host layout[r]
  std::vector<HostEntry> hosts;
  for (char c : layout) hosts.push_back(HostEntry{std::string(1, c), true, {}});
  return hosts;
}

enum class Algorithm { kRing, kHierarchical, kBruck };  // kBruck: allgather only

// Inputs whose sum, max and avg are exact in float32: small integers, multiples of P for avg.
int32_t inputValue(int rank, size_t i, int P) {
  return static_cast<int32_t>(((static_cast<size_t>(rank) * 7 + i * 13) % 11) * static_cast<size_t>(P)) -
         3 * static_cast<int32_t>(P);
}

void store(char* at, int64_t v, DataType dtype) {
  if (dtype == DataType::kFloat32) {
    const float f = static_cast<float>(v);
    std::memcpy(at, &f, sizeof f);
  } else {
    const int32_t i = static_cast<int32_t>(v);
    std::memcpy(at, &i, sizeof i);
  }
}

// One collective (allreduce of `count` elements, allgather or reduce-scatter
// of `count` per rank) of float32 or int32 on the placement `layout`, `trials`
// times in random orders.
// Each trial runs under one executor model: `fixed`, or one drawn from the
// executors' defaults and their tightest settings (one slot, a window of one).
void runCase(const std::string& layout, OpKind kind, Algorithm algorithm, DataType dtype, ReduceOp op, size_t count,
             Segmenter seg, int trials, bool in_place, const ExecutorModel* fixed = nullptr) {
  static const std::vector<ExecutorModel> kModels = {{true, kSendWindow, 8}, {true, 1, 1},  {true, 3, 2},
                                                     {false, 0, 1},          {false, 0, 3}, {false, 0, 8}};
  const Topology t = computeTopology(hostsOf(layout));
  const int P = static_cast<int>(layout.size());
  const size_t es = elementSize(dtype), Pz = static_cast<size_t>(P);
  const std::string what = layout + " " + opKindName(kind) +
                           (algorithm == Algorithm::kRing           ? " ring"
                            : algorithm == Algorithm::kHierarchical ? " hierarchical"
                                                                    : " bruck") +
                           " count " + std::to_string(count) + " seg " + std::to_string(seg.max_elems) + " op " +
                           std::to_string(static_cast<int>(op)) + (in_place ? " in place" : "");
  // Input and output lengths per rank, in elements.
  const size_t in_len = kind == OpKind::kAllgather ? count : kind == OpKind::kReduceScatter ? Pz * count : count;
  const size_t out_len = kind == OpKind::kAllgather ? Pz * count : count;
  auto reduced = [&](size_t i) {  // element i of the reduction over ranks of the inputs
    int64_t acc = inputValue(0, i, P);
    for (int r = 1; r < P; ++r) {
      const int32_t v = inputValue(r, i, P);
      acc = op == ReduceOp::kMax ? std::max<int64_t>(acc, v) : op == ReduceOp::kBxor ? (acc ^ v) : acc + v;
    }
    return op == ReduceOp::kAvg ? acc / P : acc;
  };
  std::vector<std::vector<char>> expected(P, std::vector<char>(out_len * es));
  for (int r = 0; r < P; ++r) {
    for (size_t i = 0; i < out_len; ++i) {
      const int64_t v = kind == OpKind::kAllgather       ? inputValue(static_cast<int>(i / count), i % count, P)
                        : kind == OpKind::kReduceScatter ? reduced(static_cast<size_t>(r) * count + i)
                                                         : reduced(i);
      store(&expected[r][i * es], v, dtype);
    }
  }
  std::mt19937 rng(static_cast<uint32_t>(count * 131 + Pz * 7 + static_cast<size_t>(op) + static_cast<size_t>(kind)));
  for (int trial = 0; trial < trials; ++trial) {
    std::vector<std::vector<char>> send(P, std::vector<char>(in_len * es)), recv(P, std::vector<char>(out_len * es)),
        scratch(P, std::vector<char>(Pz * count * es));
    for (int r = 0; r < P; ++r) {
      for (size_t i = 0; i < in_len; ++i) store(&send[r][i * es], inputValue(r, i, P), dtype);
      if (kind == OpKind::kAllgather && count > 0) {  // the op table's local step
        std::memcpy(recv[r].data() + static_cast<size_t>(r) * count * es, send[r].data(), count * es);
      } else if (in_place && kind == OpKind::kAllreduce) {
        recv[r] = send[r];
      }
    }
    std::vector<Schedule> schedules(P);
    for (int r = 0; r < P; ++r) {
      AlgorithmContext ctx{r, P, seg};
      ctx.ring_order = t.host_order.data();
      ctx.ring_position = t.position.data();
      ctx.topology = &t;
      OpDesc d;
      d.kind = kind;
      d.dtype = dtype;
      d.reduce_op = op;
      d.count = count;
      schedules[r].reset(d, es);
      Schedule& s = schedules[r];
      const char* in = in_place && kind == OpKind::kAllreduce ? recv[r].data() : send[r].data();
      const bool ring = algorithm != Algorithm::kHierarchical;  // any peer, not the hierarchical ones only
      if (algorithm == Algorithm::kBruck) {
        buildBruckAllgather(s, ctx, recv[r].data(), count);
      } else if (kind == OpKind::kAllreduce) {
        ring ? buildRingAllreduce(s, ctx, in, recv[r].data(), count)
             : buildHierarchicalAllreduce(s, ctx, in, recv[r].data(), count);
      } else if (kind == OpKind::kAllgather) {
        ring ? buildRingAllgather(s, ctx, recv[r].data(), count)
             : buildHierarchicalAllgather(s, ctx, recv[r].data(), count);
      } else {
        ring ? buildRingReduceScatter(s, ctx, in, recv[r].data(), scratch[r].data(), count)
             : buildHierarchicalReduceScatter(s, ctx, in, recv[r].data(), scratch[r].data(), count);
      }
      // Who each rank talks to: the ring's neighbours, or its host ring's and its local index's ring's.
      for (const SendStep& step : s.sends) {
        const bool same_host = t.host_of[step.peer] == t.host_of[r];
        const bool same_local = t.local_rank[step.peer] == t.local_rank[r];
        check(ring || same_host != same_local,
              what + ": rank " + std::to_string(r) + " sends to rank " + std::to_string(step.peer));
      }
    }
    std::vector<uint64_t> crossing;
    const ExecutorModel& model =
        fixed != nullptr ? *fixed : kModels[std::uniform_int_distribution<size_t>(0, kModels.size() - 1)(rng)];
    if (!interpret(schedules, t, model, rng, crossing, what + " trial " + std::to_string(trial))) return;
    for (int r = 0; r < P; ++r) {
      check(recv[r] == expected[r],
            what + " trial " + std::to_string(trial) + ": rank " + std::to_string(r) + " has a wrong result");
    }
    // Bytes each host sends to the others, as a share of the buffer (N: the
    // allreduce's, the gathered one): hierarchical 2(H-1)/H N for allreduce,
    // (H-1)/H N for the others; the ring (one edge leaves each host) 2(P-1)/P N
    // and (P-1)/P N. Give or take the uneven cut (blocks differ by an element).
    if (algorithm == Algorithm::kBruck) continue;  // it trades bytes across hosts for fewer steps
    const size_t H = static_cast<size_t>(t.hosts()), L = Pz / H;
    const double steps = kind == OpKind::kAllreduce ? 2.0 : 1.0;
    const double share = algorithm == Algorithm::kHierarchical ? steps * static_cast<double>(H - 1) / H
                                                               : steps * static_cast<double>(P - 1) / P;
    const double buffer = static_cast<double>((kind == OpKind::kAllreduce ? count : Pz * count) * es);
    const double slack = static_cast<double>(2 * H * L * es);
    for (size_t h = 0; h < H; ++h) {
      check(std::abs(static_cast<double>(crossing[h]) - share * buffer) <= slack,
            what + ": host " + std::to_string(h) + " sent " + std::to_string(crossing[h]) + " bytes across, not ~" +
                std::to_string(share * buffer));
    }
  }
}

void testHierarchicalCollectives() {
  const std::vector<std::string> layouts = {"AABB", "ABAB", "AAABBB", "ABCABC", "AABBCC", "AAAABBBB", "ABBA"};
  const std::vector<size_t> counts = {0, 1, 3, 5, 17, 64, 257, 1000};
  const OpKind A = OpKind::kAllreduce, G = OpKind::kAllgather, RS = OpKind::kReduceScatter;
  const Algorithm H = Algorithm::kHierarchical, R = Algorithm::kRing;
  const DataType F = DataType::kFloat32, I = DataType::kInt32;
  for (const std::string& layout : layouts) {
    std::string why;
    check(hierarchicalFits(computeTopology(hostsOf(layout)), &why), layout + " fits the hierarchical algorithms");
    for (size_t count : counts) {
      for (const Segmenter seg : {Segmenter{1024, 1}, Segmenter{3, 1}}) {
        runCase(layout, A, H, F, ReduceOp::kSum, count, seg, 4, false);
        runCase(layout, G, H, F, ReduceOp::kSum, count / 4, seg, 3, false);
        runCase(layout, RS, H, F, ReduceOp::kSum, count / 4, seg, 3, false);
      }
      runCase(layout, A, H, F, ReduceOp::kAvg, count, Segmenter{4, 1}, 2, true);
      runCase(layout, A, H, F, ReduceOp::kMax, count, Segmenter{5, 2}, 2, false);
      runCase(layout, A, H, I, ReduceOp::kBxor, count, Segmenter{2, 1}, 2, true);
      runCase(layout, RS, H, F, ReduceOp::kAvg, count / 4, Segmenter{2, 1}, 2, false);
      runCase(layout, RS, H, I, ReduceOp::kBxor, count / 4, Segmenter{3, 2}, 2, false);
      runCase(layout, A, R, F, ReduceOp::kSum, count, Segmenter{3, 1}, 2, false);
      runCase(layout, G, R, F, ReduceOp::kSum, count / 4, Segmenter{3, 1}, 2, false);
      runCase(layout, RS, R, F, ReduceOp::kSum, count / 4, Segmenter{3, 1}, 2, false);
    }
  }
  std::string why;
  check(
      !hierarchicalFits(computeTopology(hostsOf("AAABB")), &why) && why.find("different numbers") != std::string::npos,
      "3 + 2 ranks: no hierarchical algorithms (" + why + ")");
  check(!hierarchicalFits(computeTopology(hostsOf("ABCD")), &why) && why.find("one rank") != std::string::npos,
        "one rank per host: the ring (" + why + ")");
  check(!hierarchicalFits(computeTopology(hostsOf("AAAA")), &why) && why.find("one host") != std::string::npos,
        "one host: the ring (" + why + ")");
}

// Bruck's allgather at every world size from 2 to 17, on one host and on
// several: the blocks that take several steps to arrive, forwarded in turn,
// under every executor model; a step count of ceil(log2 P).
void testBruckAllgather() {
  const std::string hosts = "ABCDEFGHIJKLMNOPQ";
  std::vector<std::string> layouts = {"AABB", "ABAB", "AAABBB", "AAAABBBB", "AAAAAAAA"};
  for (size_t P = 2; P <= hosts.size(); ++P) layouts.push_back(hosts.substr(0, P));
  for (const std::string& layout : layouts) {
    for (size_t count : {1, 3, 17}) {
      runCase(layout, OpKind::kAllgather, Algorithm::kBruck, DataType::kFloat32, ReduceOp::kSum, count,
              Segmenter{1024, 1}, 4, false);
      runCase(layout, OpKind::kAllgather, Algorithm::kBruck, DataType::kInt32, ReduceOp::kSum, count,
              Segmenter{1024, 1}, 2, false);
    }
    const int P = static_cast<int>(layout.size());
    Schedule s;
    OpDesc d;
    d.kind = OpKind::kAllgather;
    d.count = 1;
    s.reset(d, 4);
    std::vector<char> recv(layout.size() * 4);
    buildBruckAllgather(s, AlgorithmContext{0, P, Segmenter{1024, 1}}, recv.data(), 1);
    int steps = 0, peers = 0;
    for (int d2 = 1; d2 < P; d2 *= 2) ++steps;
    int last_peer = -1;
    for (const SendStep& step : s.sends) {
      peers += step.peer != last_peer;
      last_peer = step.peer;
    }
    check(peers == steps && s.recvs.size() == layout.size() - 1,
          layout + ": bruck takes ceil(log2 P) steps and receives P-1 blocks");
  }
}

// More segments per block than the send window holds, under the host
// executor's defaults: sends to a local peer that wait on its receiver must
// not take the whole window from the sends to the other host (schedule.h,
// sendWindowOpen). Before that rule, every rank stalled here.
void testLongSchedulesUnderTheSendWindow() {
  const ExecutorModel defaults{true, kSendWindow, 8};
  const ExecutorModel tight{true, 2, 1};
  const Algorithm H = Algorithm::kHierarchical;
  for (const char* layout : {"AABB", "AAAABBBB"}) {
    runCase(layout, OpKind::kAllreduce, H, DataType::kFloat32, ReduceOp::kSum, 6000, Segmenter{8, 8}, 2, false,
            &defaults);
    runCase(layout, OpKind::kAllreduce, H, DataType::kFloat32, ReduceOp::kSum, 600, Segmenter{4, 4}, 2, false, &tight);
    runCase(layout, OpKind::kReduceScatter, H, DataType::kFloat32, ReduceOp::kSum, 1500, Segmenter{8, 8}, 1, false,
            &defaults);
    runCase(layout, OpKind::kAllgather, H, DataType::kFloat32, ReduceOp::kSum, 1500, Segmenter{8, 8}, 1, false,
            &defaults);
  }
}

// A barrier must not let a rank out before every rank came in: whatever
// order the messages arrive in, each rank's last receive must be preceded,
// through the dependencies the executors honour (a send waits only for what
// its after_recv and after_earlier_recvs name), by a message of every other
// rank. Computed as what each message "knows" (the ranks it transitively
// heard from) at its fixed point, for every world size up to 64.
void testTheBarrierHearsFromEveryRank() {
  for (int P = 1; P <= 64; ++P) {
    const size_t Pz = static_cast<size_t>(P);
    std::vector<Schedule> schedules(Pz);
    for (int r = 0; r < P; ++r) {
      OpDesc d;
      d.kind = OpKind::kBarrier;
      schedules[static_cast<size_t>(r)].reset(d, 1);
      buildDisseminationBarrier(schedules[static_cast<size_t>(r)], AlgorithmContext{r, P, Segmenter{1, 1}});
    }
    // matched_send[r][j]: (peer, index) of the send that rank r's receive j takes
    // (the k-th receive from a peer takes the k-th message it sent here).
    std::vector<std::vector<std::pair<int, size_t>>> matched_send(Pz);
    for (int r = 0; r < P; ++r) {
      std::vector<size_t> taken(Pz, 0);
      for (const RecvStep& recv : schedules[static_cast<size_t>(r)].recvs) {
        const auto& sends = schedules[static_cast<size_t>(recv.peer)].sends;
        size_t seen = 0, index = sends.size();
        for (size_t i = 0; i < sends.size() && index == sends.size(); ++i) {
          if (sends[i].peer == r && seen++ == taken[static_cast<size_t>(recv.peer)]) index = i;
        }
        check(index < sends.size(), "barrier at P=" + std::to_string(P) + ": a receive no send matches");
        if (index == sends.size()) return;
        ++taken[static_cast<size_t>(recv.peer)];
        matched_send[static_cast<size_t>(r)].push_back({recv.peer, index});
      }
    }
    std::vector<std::vector<uint64_t>> knows(Pz);  // per send, the ranks it heard from
    for (int r = 0; r < P; ++r)
      knows[static_cast<size_t>(r)].assign(schedules[static_cast<size_t>(r)].sends.size(), 1ull << r);
    auto recvKnows = [&](int r, size_t j) {
      const auto& [peer, index] = matched_send[static_cast<size_t>(r)][j];
      return knows[static_cast<size_t>(peer)][index];
    };
    for (bool changed = true; changed;) {
      changed = false;
      for (int r = 0; r < P; ++r) {
        const Schedule& s = schedules[static_cast<size_t>(r)];
        for (size_t i = 0; i < s.sends.size(); ++i) {
          uint64_t k = knows[static_cast<size_t>(r)][i];
          const auto [first, end] = recvsWaitedFor(s.sends[i]);
          for (size_t j = first; j < end; ++j) k |= recvKnows(r, j);
          changed = changed || k != knows[static_cast<size_t>(r)][i];
          knows[static_cast<size_t>(r)][i] = k;
        }
      }
    }
    const uint64_t everyone = P == 64 ? ~0ull : (1ull << P) - 1;
    for (int r = 0; r < P; ++r) {
      uint64_t heard = 1ull << r;
      for (size_t j = 0; j < schedules[static_cast<size_t>(r)].recvs.size(); ++j) heard |= recvKnows(r, j);
      check(heard == everyone, "barrier at P=" + std::to_string(P) + ": rank " + std::to_string(r) +
                                   " may leave before some rank entered");
    }
  }
}

}  // namespace

int main() {
  try {
    testTheBarrierHearsFromEveryRank();
    testLongSchedulesUnderTheSendWindow();
    testBruckAllgather();
    testHierarchicalCollectives();
  } catch (const std::exception& e) {
    check(false, std::string("unexpected exception: ") + e.what());
  }
  if (gFailures) {
    std::fprintf(stderr, "test_schedules: %d failure(s)\n", gFailures);
    return 1;
  }
  std::printf("test_schedules: ok\n");
  return 0;
}
