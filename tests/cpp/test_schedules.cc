// The allreduce, allgather and reduce-scatter schedules of every rank, run
// together by a small interpreter in one thread: the rings (in host order) and
// the hierarchical algorithms (csrc/hierarchical.cc) over many placements,
// counts and segment sizes. The interpreter keeps the executor's contract (pipeline_executor.h):
// each peer's sends go out in schedule order once the receive they name is done, the k-th
// receive from a peer takes the k-th message that peer sent here, and a
// reduction waits for the receive and the send it names. Everything else
// happens in a random order, seeded, many times over, so a dependency that a
// schedule forgot to state shows up as a wrong result rather than as a rare
// race on a busy machine. Checks: every rank's result equals the reference,
// bit for bit alike on every rank, headers agree, and the bytes that cross
// between hosts are what the algorithm must move. Exit status nonzero on failure.

#include <cstdio>
#include <cstring>
#include <deque>
#include <exception>
#include <random>
#include <string>
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

struct Message {
  uint64_t offset;
  uint64_t count;
  std::vector<char> bytes;
};

// Runs the schedules of every rank to completion. Returns false (and reports)
// when they cannot finish: a dependency that never comes, or a message no
// receive takes. `crossing[h]` counts the bytes host h sends to other hosts.
bool interpret(std::vector<Schedule>& schedules, const Topology& t, std::mt19937& rng, std::vector<uint64_t>& crossing,
               const std::string& what) {
  const int P = static_cast<int>(schedules.size());
  std::vector<std::vector<std::deque<Message>>> wire(P, std::vector<std::deque<Message>>(P));  // [src][dst]
  // Per rank and peer: the sends to that peer in schedule order, and how many went out.
  std::vector<std::vector<std::vector<int>>> to(P, std::vector<std::vector<int>>(P));
  std::vector<std::vector<size_t>> sent(P, std::vector<size_t>(P, 0));
  std::vector<std::vector<uint8_t>> recv_done(P), send_done(P);
  // Per rank and peer: the receives from that peer in schedule order, and how many took their message.
  std::vector<std::vector<std::vector<int>>> from(P, std::vector<std::vector<int>>(P));
  std::vector<std::vector<size_t>> taken(P, std::vector<size_t>(P, 0));
  // Per rank: receives whose message arrived, waiting to complete.
  std::vector<std::vector<std::pair<int, Message>>> arrived(P);
  for (int r = 0; r < P; ++r) {
    recv_done[r].assign(schedules[r].recvs.size(), 0);
    send_done[r].assign(schedules[r].sends.size(), 0);
    for (size_t i = 0; i < schedules[r].recvs.size(); ++i)
      from[r][schedules[r].recvs[i].peer].push_back(static_cast<int>(i));
    for (size_t i = 0; i < schedules[r].sends.size(); ++i)
      to[r][schedules[r].sends[i].peer].push_back(static_cast<int>(i));
  }
  crossing.assign(static_cast<size_t>(t.hosts()), 0);
  for (;;) {
    // Every action possible now; one of them, at random, happens.
    struct Action {
      int kind;  // 0: post rank's next send to a peer, 1: a message is taken by its receive, 2: a reduction/copy
                 // completes
      int rank;
      int peer_or_index;
    };
    std::vector<Action> actions;
    for (int r = 0; r < P; ++r) {
      const Schedule& s = schedules[r];
      for (int p = 0; p < P; ++p) {
        if (sent[r][p] < to[r][p].size()) {
          const SendStep& step = s.sends[static_cast<size_t>(to[r][p][sent[r][p]])];
          if (step.after_recv < 0 || recv_done[r][static_cast<size_t>(step.after_recv)]) actions.push_back({0, r, p});
        }
        if (!wire[p][r].empty()) actions.push_back({1, r, p});
      }
      for (size_t i = 0; i < arrived[r].size(); ++i) {
        const RecvStep& step = s.recvs[static_cast<size_t>(arrived[r][i].first)];
        const bool wait_recv =
            step.reduce_after_recv >= 0 && !recv_done[r][static_cast<size_t>(step.reduce_after_recv)];
        const bool wait_send =
            step.reduce_after_send >= 0 && !send_done[r][static_cast<size_t>(step.reduce_after_send)];
        if (!(step.reduce_out != nullptr && (wait_recv || wait_send))) actions.push_back({2, r, static_cast<int>(i)});
      }
    }
    if (actions.empty()) break;
    const Action a = actions[std::uniform_int_distribution<size_t>(0, actions.size() - 1)(rng)];
    Schedule& s = schedules[a.rank];
    if (a.kind == 0) {  // the data is read when the send is posted: the earliest a transport may read it
      const int index = to[a.rank][a.peer_or_index][sent[a.rank][a.peer_or_index]++];
      const SendStep& step = s.sends[static_cast<size_t>(index)];
      Message m{step.offset, step.count, std::vector<char>(step.data, step.data + step.count * s.elem_size)};
      if (t.host_of[a.rank] != t.host_of[step.peer]) crossing[t.host_of[a.rank]] += m.bytes.size();
      wire[a.rank][step.peer].push_back(std::move(m));
      send_done[a.rank][static_cast<size_t>(index)] = 1;
    } else if (a.kind == 1) {
      const int p = a.peer_or_index;
      if (taken[a.rank][p] >= from[a.rank][p].size()) {
        check(false, what + ": rank " + std::to_string(p) + " sent rank " + std::to_string(a.rank) +
                         " a message no receive takes");
        return false;
      }
      const int index = from[a.rank][p][taken[a.rank][p]++];
      const RecvStep& step = s.recvs[static_cast<size_t>(index)];
      Message m = std::move(wire[p][a.rank].front());
      wire[p][a.rank].pop_front();
      if (m.offset != step.offset || m.count != step.count) {
        check(false, what + ": rank " + std::to_string(a.rank) + " expected offset " + std::to_string(step.offset) +
                         " count " + std::to_string(step.count) + " from rank " + std::to_string(p) + ", got " +
                         std::to_string(m.offset) + "/" + std::to_string(m.count));
        return false;
      }
      arrived[a.rank].emplace_back(index, std::move(m));
    } else {
      auto& entry = arrived[a.rank][static_cast<size_t>(a.peer_or_index)];
      const RecvStep& step = s.recvs[static_cast<size_t>(entry.first)];
      std::vector<char>& staged = entry.second.bytes;
      if (step.reduce_out != nullptr) {  // as PipelineExecutor::harvest
        if (step.staged_first) {
          reduceInto(staged.data(), staged.data(), step.reduce_in, step.count, s.op.dtype, s.op.reduce_op);
          std::memcpy(step.reduce_out, staged.data(), staged.size());
        } else {
          reduceInto(step.reduce_out, step.reduce_in, staged.data(), step.count, s.op.dtype, s.op.reduce_op);
        }
        if (step.divide_after) scaleDivide(step.reduce_out, step.count, s.op.dtype, static_cast<size_t>(P));
      } else if (step.count > 0) {
        std::memcpy(step.direct, staged.data(), staged.size());
      }
      recv_done[a.rank][static_cast<size_t>(entry.first)] = 1;
      entry = std::move(arrived[a.rank].back());
      arrived[a.rank].pop_back();
    }
  }
  bool finished = true;
  for (int r = 0; r < P; ++r) {
    size_t done = 0, posted = 0;
    for (uint8_t d : recv_done[r]) done += d;
    for (uint8_t d : send_done[r]) posted += d;
    if (posted != schedules[r].sends.size() || done != recv_done[r].size()) {
      check(false, what + ": rank " + std::to_string(r) + " is stuck (" + std::to_string(posted) + "/" +
                       std::to_string(schedules[r].sends.size()) + " sends posted, " + std::to_string(done) + "/" +
                       std::to_string(recv_done[r].size()) + " receives done)");
      finished = false;
    }
  }
  return finished;
}

std::vector<HostEntry> hostsOf(const std::string& layout) {  // "AABB": rank r on host layout[r]
  std::vector<HostEntry> hosts;
  for (char c : layout) hosts.push_back(HostEntry{std::string(1, c), true});
  return hosts;
}

enum class Algorithm { kRing, kHierarchical };

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
void runCase(const std::string& layout, OpKind kind, Algorithm algorithm, DataType dtype, ReduceOp op, size_t count,
             Segmenter seg, int trials, bool in_place) {
  const Topology t = computeTopology(hostsOf(layout));
  const int P = static_cast<int>(layout.size());
  const size_t es = elementSize(dtype), Pz = static_cast<size_t>(P);
  const std::string what = layout + " " + opKindName(kind) +
                           (algorithm == Algorithm::kRing ? " ring" : " hierarchical") + " count " +
                           std::to_string(count) + " seg " + std::to_string(seg.max_elems) + " op " +
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
      if (kind == OpKind::kAllgather) {  // the op table's local step
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
      const bool ring = algorithm == Algorithm::kRing;
      if (kind == OpKind::kAllreduce) {
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
    if (!interpret(schedules, t, rng, crossing, what + " trial " + std::to_string(trial))) return;
    for (int r = 0; r < P; ++r) {
      check(recv[r] == expected[r],
            what + " trial " + std::to_string(trial) + ": rank " + std::to_string(r) + " has a wrong result");
    }
    // Bytes each host sends to the others, as a share of the buffer (N: the
    // allreduce's, the gathered one): hierarchical 2(H-1)/H N for allreduce,
    // (H-1)/H N for the others; the ring (one edge leaves each host) 2(P-1)/P N
    // and (P-1)/P N. Give or take the uneven cut (blocks differ by an element).
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

}  // namespace

int main() {
  try {
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
