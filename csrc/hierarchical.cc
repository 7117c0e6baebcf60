// The hierarchical collectives (algorithms.h): one phase inside each host and
// one between the hosts, where the ranks of one local index form a ring of
// their own (one rank per host, the k rings side by side).
//
// Why one schedule and not sub-collectives: the executor starts a segment's
// next phase the moment its previous phase is done (a send's after_recv, a
// reduction's reduce_after_recv), so while the hosts exchange segment k, the
// ranks of a host already work on segment k+1. That only works if a segment is
// the same piece of the buffer in every phase, so the buffer is cut once, into
// units, and every phase moves whole units. Each unit remembers which receive
// last wrote it on this rank, and that receive is what the unit's next send or
// reduction waits for.
//
// The cuts:
//   allreduce: L shards (one per local index, Blocks(count, L)), each cut into
//     H sub-blocks (one per host), each cut into segments. Reduce-scatter of
//     shards in the host, allreduce (reduce-scatter + allgather of sub-blocks)
//     of shard `local` between the hosts, allgather of shards in the host.
//   allgather / reduce-scatter: the P per-rank blocks, each cut into segments,
//     grouped by local index. Allgather: first between the hosts (each rank
//     collects the blocks of its local index), then in the host (groups of H
//     blocks go around). Reduce-scatter: the same backwards: in the host (each
//     rank sums its local index's group over the host), then between the hosts.
#include <algorithm>
#include <string>
#include <vector>

#include "algorithms.h"
#include "blocks.h"

namespace rcoll {

namespace {

struct Unit {
  size_t offset;  // elements, in the op's layout (it goes into the wire header)
  size_t count;
};

// One ring of a phase: its ranks in order and this rank's position.
struct Ring {
  std::vector<int> ranks;
  int me;
  int size() const { return static_cast<int>(ranks.size()); }
  // Position `p` taken around the ring (any integer: p mod size).
  int wrap(int p) const { return ((p % size()) + size()) % size(); }
  int next() const { return ranks[static_cast<size_t>(wrap(me + 1))]; }
  int prev() const { return ranks[static_cast<size_t>(wrap(me - 1))]; }
};

// Units [first, last) of the unit list: one block of a ring phase.
struct UnitRange {
  size_t first;
  size_t last;
};

class HierarchicalBuilder {
 public:
  HierarchicalBuilder(Schedule& s, const AlgorithmContext& ctx)
      : s_(s), ctx_(ctx), es_(s.elem_size), avg_(s.op.reduce_op == ReduceOp::kAvg) {
    const Topology& t = *ctx.topology;
    const int host = t.host_of[static_cast<size_t>(ctx.rank)];
    const int local = t.local_rank[static_cast<size_t>(ctx.rank)];
    hosts_ = t.hosts();
    locals_ = static_cast<int>(t.ranks_on_host[0].size());
    local_ring_ = Ring{t.ranks_on_host[static_cast<size_t>(host)], local};
    for (const std::vector<int>& ranks : t.ranks_on_host) host_ring_.ranks.push_back(ranks[static_cast<size_t>(local)]);
    host_ring_.me = host;
  }

  void allreduce(const char* send, char* recv, size_t count) {
    // Units by shard, then sub-block (group (i, h)), then segment.
    const Blocks shards(count, locals_);
    for (int i = 0; i < locals_; ++i) {
      const Blocks subs(shards.length(i), hosts_);
      for (int h = 0; h < hosts_; ++h) addSegments(shards.start(i) + subs.start(h), subs.length(h));
    }
    finishCut();
    const int local = local_ring_.me;
    auto shard = [&](int i) { return UnitRange{group_first_[group(i, 0)], group_first_[group(i + 1, 0)]}; };
    auto sub_block = [&](int h) { return UnitRange{group_first_[group(local, h)], group_first_[group(local, h + 1)]}; };
    auto input = [&](const Unit& u) { return send + u.offset * es_; };
    auto result = [&](const Unit& u) { return recv + u.offset * es_; };
    // The host's sum of shard `local` ends here; avg divides once, at the end.
    reduceScatter(local_ring_, shard, input, result, false);
    // Shard `local` between the hosts, in place in recv.
    reduceScatter(host_ring_, sub_block, result, result, avg_);
    allgather(host_ring_, sub_block, result);
    allgather(local_ring_, shard, result);
  }

  // `recv` holds size*count elements, this rank's block already at rank*count.
  void allgather(char* recv, size_t count) {
    cutPerRankBlocks(count);
    const int local = local_ring_.me;
    auto at = [&](const Unit& u) { return recv + u.offset * es_; };
    // Between the hosts: the blocks of this local index, host by host.
    allgather(
        host_ring_,
        [&](int h) {
          return UnitRange{group_first_[group(local, h)], group_first_[group(local, h + 1)]};
        },
        at);
    // In the host: each local index's H blocks as one.
    allgather(
        local_ring_,
        [&](int i) {
          return UnitRange{group_first_[group(i, 0)], group_first_[group(i + 1, 0)]};
        },
        at);
  }

  // `send` holds size*count elements; block r of the sum ends in rank r's
  // `recv`. Partial sums of other blocks go to `scratch` (size*count elements).
  void reduceScatter(const char* send, char* recv, char* scratch, size_t count) {
    cutPerRankBlocks(count);
    const int local = local_ring_.me;
    const size_t mine = static_cast<size_t>(ctx_.rank) * count;
    auto input = [&](const Unit& u) { return send + u.offset * es_; };
    auto partial = [&](const Unit& u) { return scratch + u.offset * es_; };
    auto result = [&](const Unit& u) {
      return u.offset >= mine && u.offset < mine + count ? recv + (u.offset - mine) * es_ : scratch + u.offset * es_;
    };
    // In the host: the host's sums of the blocks of local index `local`.
    reduceScatter(
        local_ring_,
        [&](int i) {
          return UnitRange{group_first_[group(i, 0)], group_first_[group(i + 1, 0)]};
        },
        input, partial, false);
    // Between the hosts: block h of this local index ends on host h's rank.
    reduceScatter(
        host_ring_,
        [&](int h) {
          return UnitRange{group_first_[group(local, h)], group_first_[group(local, h + 1)]};
        },
        partial, result, avg_);
  }

 private:
  // Groups are (local index i, host h), i-major; group(i, hosts_) is group(i + 1, 0).
  size_t group(int i, int h) const {
    return static_cast<size_t>(i) * static_cast<size_t>(hosts_) + static_cast<size_t>(h);
  }

  // Appends one group's units: `len` elements from `start`, cut into segments.
  void addSegments(size_t start, size_t len) {
    const size_t seg = ctx_.segmenter.segmentElems(len);
    group_first_.push_back(units_.size());
    for (size_t k = 0; k < numSegments(len, seg); ++k)
      units_.push_back({start + k * seg, std::min(seg, len - k * seg)});
  }

  void finishCut() {
    group_first_.push_back(units_.size());
    last_write_.assign(units_.size(), -1);
  }

  // Group (i, h) is the block of the rank with local index i on host h.
  void cutPerRankBlocks(size_t count) {
    const Topology& t = *ctx_.topology;
    for (int i = 0; i < locals_; ++i) {
      for (int h = 0; h < hosts_; ++h) {
        addSegments(static_cast<size_t>(t.ranks_on_host[static_cast<size_t>(h)][static_cast<size_t>(i)]) * count,
                    count);
      }
    }
    finishCut();
  }

  // The ring phases below list their transfers unit by unit, each unit
  // through every step of the ring before the next unit (block k of a step is
  // the k-th unit of that step's block): the first units leave the phase after
  // a few hops rather than after every step of every unit, so the next phase
  // (the network, for the host's ring) starts early. Both ends list a pair's
  // messages in the same order, which is all the transports need.
  template <typename BlockFn>
  size_t mostUnits(const Ring& ring, BlockFn block) const {
    size_t most = 0;
    for (int b = 0; b < ring.size(); ++b) most = std::max(most, block(b).last - block(b).first);
    return most;
  }

  // A ring reduce-scatter over blocks of units: position p ends with block p
  // reduced over the ring, at result(unit). Step 0 sends input(unit); later
  // steps forward partial results, which land at result(unit). A unit's send
  // and its reduction with input(unit) wait for whatever receive last wrote it
  // (an earlier step, or an earlier phase).
  template <typename BlockFn, typename InFn, typename OutFn>
  void reduceScatter(const Ring& ring, BlockFn block, InFn input, OutFn result, bool divide_at_end) {
    const int P = ring.size(), r = ring.me;
    const size_t units = P > 1 ? mostUnits(ring, block) : 0;
    for (size_t k = 0; k < units; ++k) {
      for (int step = 0; step < P - 1; ++step) {
        const UnitRange sending = block(ring.wrap(r - 1 - step));
        if (k < sending.last - sending.first) {
          const size_t u = sending.first + k;
          const Unit& unit = units_[u];
          const char* data = step == 0 ? input(unit) : result(unit);
          s_.sends.push_back({ring.next(), data, unit.offset, unit.count, last_write_[u]});
        }
        const UnitRange receiving = block(ring.wrap(r - 2 - step));
        if (k < receiving.last - receiving.first) {
          const size_t u = receiving.first + k;
          const Unit& unit = units_[u];
          RecvStep in{
              ring.prev(), unit.offset, unit.count, nullptr, result(unit), input(unit), divide_at_end && step == P - 2};
          in.reduce_after_recv = last_write_[u];
          last_write_[u] = static_cast<int>(s_.recvs.size());
          s_.recvs.push_back(in);
        }
      }
    }
  }

  // A ring allgather over blocks of units, in place at at(unit): position p
  // starts with block p complete and ends with every block.
  template <typename BlockFn, typename AtFn>
  void allgather(const Ring& ring, BlockFn block, AtFn at) {
    const int P = ring.size(), r = ring.me;
    const size_t units = P > 1 ? mostUnits(ring, block) : 0;
    for (size_t k = 0; k < units; ++k) {
      for (int step = 0; step < P - 1; ++step) {
        const UnitRange sending = block(ring.wrap(r - step));
        if (k < sending.last - sending.first) {
          const size_t u = sending.first + k;
          const Unit& unit = units_[u];
          s_.sends.push_back({ring.next(), at(unit), unit.offset, unit.count, last_write_[u]});
        }
        const UnitRange receiving = block(ring.wrap(r - step - 1));
        if (k < receiving.last - receiving.first) {
          const size_t u = receiving.first + k;
          const Unit& unit = units_[u];
          last_write_[u] = static_cast<int>(s_.recvs.size());
          s_.recvs.push_back({ring.prev(), unit.offset, unit.count, at(unit), nullptr, nullptr, false});
        }
      }
    }
  }

  Schedule& s_;
  const AlgorithmContext& ctx_;
  const size_t es_;
  const bool avg_;
  int hosts_ = 0;
  int locals_ = 0;
  Ring local_ring_;
  Ring host_ring_;
  std::vector<Unit> units_;
  std::vector<size_t> group_first_;  // first unit of each group, then units_.size()
  std::vector<int> last_write_;      // per unit: the receive that last wrote it here (-1: none yet)
};

}  // namespace

bool hierarchicalFits(const Topology& topology, std::string* why) {
  const int hosts = topology.hosts();
  if (hosts < 2) {
    *why = "all ranks are on one host";
    return false;
  }
  const size_t locals = topology.ranks_on_host[0].size();
  for (const std::vector<int>& ranks : topology.ranks_on_host) {
    if (ranks.size() != locals) {
      *why = "the hosts have different numbers of ranks (" + topology.describe() + ")";
      return false;
    }
  }
  if (locals < 2) {
    *why = "every host has one rank (the ring in host order is already hierarchical)";
    return false;
  }
  return true;
}

void buildHierarchicalAllreduce(Schedule& s, const AlgorithmContext& ctx, const char* send, char* recv, size_t count) {
  HierarchicalBuilder(s, ctx).allreduce(send, recv, count);
}

void buildHierarchicalAllgather(Schedule& s, const AlgorithmContext& ctx, char* recv, size_t count) {
  HierarchicalBuilder(s, ctx).allgather(recv, count);
}

void buildHierarchicalReduceScatter(Schedule& s, const AlgorithmContext& ctx, const char* send, char* recv,
                                    char* scratch, size_t count) {
  HierarchicalBuilder(s, ctx).reduceScatter(send, recv, scratch, count);
}

}  // namespace rcoll
