#include "algorithms.h"

#include <algorithm>

#include "blocks.h"

namespace rcoll {

size_t Segmenter::segmentElems(size_t block_elems) const {
  size_t target = (block_elems + kTargetSegmentsPerBlock - 1) / kTargetSegmentsPerBlock;
  return std::max<size_t>(1, std::min(max_elems, std::max(min_elems, target)));
}

namespace {

int mod(int a, int n) { return ((a % n) + n) % n; }

// Appends the reduce-scatter phase of the ring. Blocks are numbered by ring
// position; `block_start(b)`, `block_len(b)` locate block b in element offsets;
// `acc(b)` is where block b's partial result is written on this rank. Returns,
// for the last step, the index of the first receive (the block of this rank's
// position), so that the allgather phase can depend on it.
template <typename StartFn, typename LenFn, typename AccFn>
int appendReduceScatterPhase(Schedule& s, const AlgorithmContext& ctx, const char* send, StartFn block_start,
                             LenFn block_len, AccFn acc) {
  const int P = ctx.size, r = ctx.position();
  const int next = ctx.rankAt(r + 1), prev = ctx.rankAt(r - 1);
  const size_t es = s.elem_size;
  const bool avg = s.op.reduce_op == ReduceOp::kAvg;
  int prev_step_first_recv = -1;  // index of the first receive of the previous step
  int last_step_first_recv = -1;
  for (int step = 0; step < P - 1; ++step) {
    // Position r sends block r-1-step and receives block r-2-step, so that
    // after P-1 steps it has received and reduced its own block r last.
    int send_block = mod(r - 1 - step, P);
    int recv_block = mod(r - 2 - step, P);
    size_t len = block_len(send_block);
    size_t seg = ctx.segmenter.segmentElems(len);
    for (size_t k = 0; k < numSegments(len, seg); ++k) {
      size_t off = block_start(send_block) + k * seg;
      size_t n = std::min(seg, len - k * seg);
      // Step 0 sends this rank's own input; later steps forward the partial
      // result received (and reduced) in the previous step: same block, same segment.
      const char* data = step == 0 ? send + off * es : acc(send_block) + k * seg * es;
      int dep = step == 0 ? -1 : prev_step_first_recv + static_cast<int>(k);
      s.sends.push_back({next, data, off, n, dep});
    }
    int first = static_cast<int>(s.recvs.size());
    len = block_len(recv_block);
    seg = ctx.segmenter.segmentElems(len);
    for (size_t k = 0; k < numSegments(len, seg); ++k) {
      size_t off = block_start(recv_block) + k * seg;
      size_t n = std::min(seg, len - k * seg);
      bool last = step == P - 2;
      s.recvs.push_back({prev, off, n, nullptr, acc(recv_block) + k * seg * es, send + off * es, avg && last});
    }
    prev_step_first_recv = first;
    last_step_first_recv = first;
  }
  return last_step_first_recv;
}

}  // namespace

void buildRingAllreduce(Schedule& s, const AlgorithmContext& ctx, const char* send, char* recv, size_t count) {
  const int P = ctx.size, r = ctx.position();
  const size_t es = s.elem_size;
  const Blocks blocks(count, P);
  auto start = [&](int b) { return blocks.start(b); };
  auto len = [&](int b) { return blocks.length(b); };
  auto acc = [&](int b) { return recv + blocks.start(b) * es; };
  int own_block_recvs = appendReduceScatterPhase(s, ctx, send, start, len, acc);

  // Allgather phase: pass the completed blocks around the ring, straight into
  // `recv`. Step 0 sends block r (completed by the last reduce-scatter step);
  // step j forwards the block received in step j-1.
  const int next = ctx.rankAt(r + 1), prev = ctx.rankAt(r - 1);
  int prev_first = own_block_recvs;
  for (int step = 0; step < P - 1; ++step) {
    int send_block = mod(r - step, P);
    int recv_block = mod(r - step - 1, P);
    size_t slen = blocks.length(send_block);
    size_t seg = ctx.segmenter.segmentElems(slen);
    for (size_t k = 0; k < numSegments(slen, seg); ++k) {
      size_t off = blocks.start(send_block) + k * seg;
      s.sends.push_back({next, recv + off * es, off, std::min(seg, slen - k * seg), prev_first + static_cast<int>(k)});
    }
    int first = static_cast<int>(s.recvs.size());
    size_t rlen = blocks.length(recv_block);
    seg = ctx.segmenter.segmentElems(rlen);
    for (size_t k = 0; k < numSegments(rlen, seg); ++k) {
      size_t off = blocks.start(recv_block) + k * seg;
      s.recvs.push_back({prev, off, std::min(seg, rlen - k * seg), recv + off * es, nullptr, nullptr, false});
    }
    prev_first = first;
  }
}

void buildRecursiveDoublingAllreduce(Schedule& s, const AlgorithmContext& ctx, const char* send, char* recv,
                                     size_t count) {
  const int P = ctx.size, r = ctx.rank;
  const size_t es = s.elem_size;
  const bool avg = s.op.reduce_op == ReduceOp::kAvg;
  int pof2 = 1;
  while (pof2 * 2 <= P) pof2 *= 2;
  const int rem = P - pof2;
  const size_t seg = ctx.segmenter.segmentElems(count);
  const size_t nseg = numSegments(count, seg);
  auto segLen = [&](size_t k) { return std::min(seg, count - k * seg); };

  // Fold: among the first 2*rem ranks, each even rank hands its input to the
  // odd rank above it and waits for the result.
  if (r < 2 * rem && r % 2 == 0) {
    for (size_t k = 0; k < nseg; ++k) s.sends.push_back({r + 1, send + k * seg * es, k * seg, segLen(k), -1});
    for (size_t k = 0; k < nseg; ++k) {
      s.recvs.push_back({r + 1, k * seg, segLen(k), recv + k * seg * es, nullptr, nullptr, false});
    }
    return;
  }
  const bool folded = r < 2 * rem;  // odd: holds its lower neighbour's input too
  const int newrank = folded ? r / 2 : r - rem;
  auto rankOf = [&](int nr) { return nr < rem ? nr * 2 + 1 : nr + rem; };
  int prev_first = -1;  // first receive of the previous exchange: what the next one forwards
  if (folded) {
    prev_first = static_cast<int>(s.recvs.size());
    for (size_t k = 0; k < nseg; ++k) {
      RecvStep step{r - 1, k * seg, segLen(k), nullptr, recv + k * seg * es, send + k * seg * es, false};
      step.staged_first = true;  // rank r-1 is the lower one
      s.recvs.push_back(step);
    }
  }
  for (int mask = 1; mask < pof2; mask <<= 1) {
    const int partner_new = newrank ^ mask;
    const int partner = rankOf(partner_new);
    const bool last = mask * 2 == pof2;
    // Until something was received the partial result is this rank's input.
    const char* acc = prev_first < 0 ? send : recv;
    const int first_send = static_cast<int>(s.sends.size());
    for (size_t k = 0; k < nseg; ++k) {
      s.sends.push_back(
          {partner, acc + k * seg * es, k * seg, segLen(k), prev_first < 0 ? -1 : prev_first + static_cast<int>(k)});
    }
    const int first = static_cast<int>(s.recvs.size());
    for (size_t k = 0; k < nseg; ++k) {
      RecvStep step{partner, k * seg, segLen(k), nullptr, recv + k * seg * es, acc + k * seg * es, avg && last};
      step.staged_first = partner_new < newrank;
      // The send above reads what this reduction overwrites (in place, or the
      // partial result in recv): it must be gone first.
      step.reduce_after_send = first_send + static_cast<int>(k);
      s.recvs.push_back(step);
    }
    prev_first = first;
  }
  if (folded) {  // hand the result back to the even rank below
    for (size_t k = 0; k < nseg; ++k) {
      s.sends.push_back(
          {r - 1, recv + k * seg * es, k * seg, segLen(k), prev_first < 0 ? -1 : prev_first + static_cast<int>(k)});
    }
  }
}

void buildRingReduceScatter(Schedule& s, const AlgorithmContext& ctx, const char* send, char* recv, char* scratch,
                            size_t count) {
  const size_t es = s.elem_size;
  // Block b (a ring position) is the block of the rank at that position: its
  // place in `send` (at that rank's place, or at b: blocks_by_position), and
  // where that rank's result ends up.
  auto place = [&](int b) { return static_cast<size_t>(ctx.blocks_by_position ? b : ctx.rankAt(b)); };
  auto start = [&](int b) { return place(b) * count; };
  auto len = [&](int) { return count; };
  auto acc = [&](int b) { return ctx.rankAt(b) == ctx.rank ? recv : scratch + place(b) * count * es; };
  appendReduceScatterPhase(s, ctx, send, start, len, acc);
}

void buildRingAllgather(Schedule& s, const AlgorithmContext& ctx, char* recv, size_t count) {
  const int P = ctx.size, r = ctx.position();
  const int next = ctx.rankAt(r + 1), prev = ctx.rankAt(r - 1);
  const size_t es = s.elem_size;
  const size_t seg = ctx.segmenter.segmentElems(count);
  const size_t nseg = numSegments(count, seg);
  for (int step = 0; step < P - 1; ++step) {
    // The blocks of the ranks 0 and 1 places back along the ring.
    int send_block = ctx.rankAt(r - step);
    int recv_block = ctx.rankAt(r - step - 1);
    int prev_first = static_cast<int>(s.recvs.size()) - static_cast<int>(nseg);  // previous step's receives
    for (size_t k = 0; k < nseg; ++k) {
      size_t off = static_cast<size_t>(send_block) * count + k * seg;
      int dep = step == 0 ? -1 : prev_first + static_cast<int>(k);
      s.sends.push_back({next, recv + off * es, off, std::min(seg, count - k * seg), dep});
    }
    for (size_t k = 0; k < nseg; ++k) {
      size_t off = static_cast<size_t>(recv_block) * count + k * seg;
      s.recvs.push_back({prev, off, std::min(seg, count - k * seg), recv + off * es, nullptr, nullptr, false});
    }
  }
}

void buildBruckAllgather(Schedule& s, const AlgorithmContext& ctx, char* recv, size_t count) {
  const int P = ctx.size, r = ctx.rank;
  const size_t bytes = count * s.elem_size;
  auto block = [&](int j) {  // the block of rank r + j, in place
    const size_t rank = static_cast<size_t>(mod(r + j, P));
    return std::make_pair(rank * count, recv + rank * bytes);
  };
  for (int d = 1; d < P; d *= 2) {
    const int n = std::min(d, P - d);  // blocks this step moves
    // Block r+j (j >= 1) arrived by receive j-1: the steps receive blocks
    // r+1, r+2..r+3, r+4..r+7, ... in that order.
    for (int j = 0; j < n; ++j) {
      const auto [offset, data] = block(j);
      s.sends.push_back({mod(r - d, P), data, offset, count, j - 1});
    }
    for (int j = d; j < d + n; ++j) {
      const auto [offset, data] = block(j);
      s.recvs.push_back({mod(r + d, P), offset, count, data, nullptr, nullptr, false});
    }
  }
}

void buildChainBroadcast(Schedule& s, const AlgorithmContext& ctx, char* buf, size_t count, int root) {
  const int P = ctx.size, r = ctx.position();
  const int distance = mod(r - ctx.positionOf(root), P);  // place along the chain; the root is 0
  const int next = ctx.rankAt(r + 1), prev = ctx.rankAt(r - 1);
  const size_t es = s.elem_size;
  const size_t seg = ctx.segmenter.segmentElems(count);
  for (size_t k = 0; k < numSegments(count, seg); ++k) {
    size_t off = k * seg;
    size_t n = std::min(seg, count - off);
    int dep = -1;
    if (distance > 0) {
      dep = static_cast<int>(s.recvs.size());
      s.recvs.push_back({prev, off, n, buf + off * es, nullptr, nullptr, false});
    }
    if (distance < P - 1) s.sends.push_back({next, buf + off * es, off, n, dep});
  }
}

void buildDisseminationBarrier(Schedule& s, const AlgorithmContext& ctx) {
  const int P = ctx.size, r = ctx.rank;
  int round = 0;
  for (int dist = 1; dist < P; dist *= 2, ++round) {
    // Round k's message may only leave once the messages of every earlier
    // round have arrived: that is what makes every rank transitively hear
    // from every other. Round k-1's alone is not enough: rank r+1 hears from r
    // only in round 0, and at P = 6 that is the only path from r to r-1
    // (1 + 4), so with round 1 done early r-1 left before r entered.
    int dep = round == 0 ? -1 : static_cast<int>(s.recvs.size()) - 1;
    s.sends.push_back({mod(r + dist, P), nullptr, static_cast<uint64_t>(round), 0, dep, /*after_earlier_recvs=*/true});
    s.recvs.push_back({mod(r - dist, P), static_cast<uint64_t>(round), 0, nullptr, nullptr, nullptr, false});
  }
}

void buildChainReduce(Schedule& s, const AlgorithmContext& ctx, const char* send, char* recv, char* partial,
                      size_t count, int root) {
  const int P = ctx.size, r = ctx.position();
  const int distance = mod(r - ctx.positionOf(root), P);         // the root is 0, the far end (just before it) is P-1
  const int next = ctx.rankAt(r + 1), prev = ctx.rankAt(r - 1);  // data flows next -> this rank -> prev
  const size_t es = s.elem_size;
  const bool avg = s.op.reduce_op == ReduceOp::kAvg;
  // The root's "go" to the far end (see algorithms.h); nothing waits for it.
  if (distance == 0) s.sends.push_back({prev, nullptr, 0, 0, -1});
  if (distance == P - 1) s.recvs.push_back({next, 0, 0, nullptr, nullptr, nullptr, false});
  const size_t seg = ctx.segmenter.segmentElems(count);
  for (size_t k = 0; k < numSegments(count, seg); ++k) {
    size_t off = k * seg;
    size_t n = std::min(seg, count - off);
    if (distance == P - 1) {
      s.sends.push_back({prev, send + off * es, off, n, -1});
      continue;
    }
    int dep = static_cast<int>(s.recvs.size());
    char* out = distance == 0 ? recv + off * es : partial + off * es;
    s.recvs.push_back({next, off, n, nullptr, out, send + off * es, avg && distance == 0});
    if (distance > 0) s.sends.push_back({prev, partial + off * es, off, n, dep});
  }
}

void buildDirectGather(Schedule& s, const AlgorithmContext& ctx, const char* send, char* recv, size_t count, int root) {
  const int P = ctx.size, r = ctx.rank;
  const size_t es = s.elem_size;
  const size_t seg = ctx.segmenter.segmentElems(count);
  const size_t nseg = numSegments(count, seg);
  if (r != root) {
    s.recvs.push_back({root, 0, 0, nullptr, nullptr, nullptr, false});  // the root's "go"
    for (size_t k = 0; k < nseg; ++k) {
      size_t off = static_cast<size_t>(r) * count + k * seg;
      s.sends.push_back({root, send + k * seg * es, off, std::min(seg, count - k * seg), -1});
    }
    return;
  }
  for (int j = 1; j < P; ++j) s.sends.push_back({mod(root + j, P), nullptr, 0, 0, -1});
  // Segment k of every peer before segment k+1 of any: all peers stream at once.
  for (size_t k = 0; k < nseg; ++k) {
    for (int j = 1; j < P; ++j) {
      int peer = mod(root + j, P);
      size_t off = static_cast<size_t>(peer) * count + k * seg;
      s.recvs.push_back({peer, off, std::min(seg, count - k * seg), recv + off * es, nullptr, nullptr, false});
    }
  }
}

void buildDirectScatter(Schedule& s, const AlgorithmContext& ctx, const char* send, char* recv, size_t count,
                        int root) {
  const int P = ctx.size, r = ctx.rank;
  const size_t es = s.elem_size;
  const size_t seg = ctx.segmenter.segmentElems(count);
  const size_t nseg = numSegments(count, seg);
  if (r != root) {
    s.sends.push_back({root, nullptr, 0, 0, -1});  // "ready" to the root
    for (size_t k = 0; k < nseg; ++k) {
      size_t off = static_cast<size_t>(r) * count + k * seg;
      s.recvs.push_back({root, off, std::min(seg, count - k * seg), recv + k * seg * es, nullptr, nullptr, false});
    }
    return;
  }
  for (int j = 1; j < P; ++j) s.recvs.push_back({mod(root + j, P), 0, 0, nullptr, nullptr, nullptr, false});
  for (size_t k = 0; k < nseg; ++k) {
    for (int j = 1; j < P; ++j) {
      int peer = mod(root + j, P);
      size_t off = static_cast<size_t>(peer) * count + k * seg;
      s.sends.push_back({peer, send + off * es, off, std::min(seg, count - k * seg), -1});
    }
  }
}

void buildPairwiseAllToAll(Schedule& s, const AlgorithmContext& ctx, const char* send, char* recv,
                           const uint64_t* send_counts, const uint64_t* send_displs, const uint64_t* recv_counts,
                           const uint64_t* recv_displs) {
  const int P = ctx.size, r = ctx.rank;
  const size_t es = s.elem_size;
  s.send_pair_count.assign(send_counts, send_counts + P);
  s.recv_pair_count.assign(recv_counts, recv_counts + P);
  for (int step = 1; step < P; ++step) {
    const int dst = mod(r + step, P), src = mod(r - step, P);
    // Offsets in headers are relative to the pair's block (wire.h).
    size_t len = send_counts[dst];
    if (len == 0) {
      s.sends.push_back({dst, nullptr, 0, 0, -1});
    } else {
      size_t seg = ctx.segmenter.segmentElems(len);
      const char* base = send + send_displs[dst] * es;
      for (size_t k = 0; k < numSegments(len, seg); ++k) {
        s.sends.push_back({dst, base + k * seg * es, k * seg, std::min(seg, len - k * seg), -1});
      }
    }
    len = recv_counts[src];
    if (len == 0) {
      s.recvs.push_back({src, 0, 0, nullptr, nullptr, nullptr, false});
    } else {
      size_t seg = ctx.segmenter.segmentElems(len);
      char* base = recv + recv_displs[src] * es;
      for (size_t k = 0; k < numSegments(len, seg); ++k) {
        s.recvs.push_back({src, k * seg, std::min(seg, len - k * seg), base + k * seg * es, nullptr, nullptr, false});
      }
    }
  }
}

std::vector<bool> collectivePeers(int rank, const Topology& t) {
  const int P = static_cast<int>(t.host_of.size());
  std::vector<bool> used(static_cast<size_t>(P), false);
  auto use = [&](int peer) {
    if (peer != rank) used[static_cast<size_t>(mod(peer, P))] = true;
  };
  // Rings (and the chains of broadcast and reduce) in host order.
  const int position = t.position[static_cast<size_t>(rank)];
  use(t.host_order[static_cast<size_t>(mod(position + 1, P))]);
  use(t.host_order[static_cast<size_t>(mod(position - 1, P))]);
  // Dissemination barrier: rank +- 2^k.
  for (int dist = 1; dist < P; dist *= 2) {
    use(rank + dist);
    use(rank - dist);
  }
  // Recursive doubling (buildRecursiveDoublingAllreduce): the fold, then
  // partners by the bits of the new rank.
  int pof2 = 1;
  while (pof2 * 2 <= P) pof2 *= 2;
  const int rem = P - pof2;
  if (rank < 2 * rem) use(rank % 2 == 0 ? rank + 1 : rank - 1);
  if (rank >= 2 * rem || rank % 2 == 1) {
    const int newrank = rank < 2 * rem ? rank / 2 : rank - rem;
    for (int mask = 1; mask < pof2; mask <<= 1) {
      const int partner = newrank ^ mask;
      use(partner < rem ? partner * 2 + 1 : partner + rem);
    }
  }
  // This host's ranks, and the hierarchical algorithms' ring between hosts.
  const int host = t.host_of[static_cast<size_t>(rank)];
  for (int peer : t.ranks_on_host[static_cast<size_t>(host)]) use(peer);
  std::string why;
  if (hierarchicalFits(t, &why)) {
    const auto local = static_cast<size_t>(t.local_rank[static_cast<size_t>(rank)]);
    const int H = t.hosts();
    use(t.ranks_on_host[static_cast<size_t>(mod(host + 1, H))][local]);
    use(t.ranks_on_host[static_cast<size_t>(mod(host - 1, H))][local]);
  }
  return used;
}

}  // namespace rcoll
