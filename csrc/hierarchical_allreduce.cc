// The hierarchical allreduce (algorithms.h): reduce-scatter inside each host,
// allreduce of each shard between the hosts, allgather inside each host.
//
// Why one schedule and not three sub-collectives: the executor starts a
// segment's next phase the moment its previous phase is done (a send's
// after_recv, a reduction's reduce_after_recv), so while the hosts exchange
// segment k of a shard, the ranks of a host are already reducing segment k+1.
// That only works if a segment is the same piece of the buffer in every phase,
// so the buffer is cut once, into units, and every phase moves whole units:
//
//   buffer = L shards (one per local rank, Blocks(count, L))
//   shard  = H sub-blocks (one per host, Blocks(shard, H))
//   sub-block = segments (Segmenter), each one unit
//
// Phase 1 passes shards around the host's ring (blocks = shards), phase 2
// passes the sub-blocks of one shard around the ring of the ranks with the
// same local index on every host (blocks = sub-blocks), phase 3 passes shards
// around the host's ring again. Each unit remembers which receive last wrote it
// on this rank, and that receive is what the unit's next send or reduction
// waits for.
#include <string>
#include <vector>

#include "algorithms.h"
#include "blocks.h"

namespace rcoll {

namespace {

struct Unit {
  size_t offset;  // elements
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
  HierarchicalBuilder(Schedule& s, const AlgorithmContext& ctx, size_t count)
      : s_(s), es_(s.elem_size), avg_(s.op.reduce_op == ReduceOp::kAvg) {
    const Topology& t = *ctx.topology;
    const int host = t.host_of[static_cast<size_t>(ctx.rank)];
    const int local = t.local_rank[static_cast<size_t>(ctx.rank)];
    hosts_ = t.hosts();
    locals_ = static_cast<int>(t.ranks_on_host[0].size());
    local_ring_ = Ring{t.ranks_on_host[static_cast<size_t>(host)], local};
    for (const std::vector<int>& ranks : t.ranks_on_host) host_ring_.ranks.push_back(ranks[static_cast<size_t>(local)]);
    host_ring_.me = host;

    // The cut, shard by shard and sub-block by sub-block, in buffer order.
    const Blocks shards(count, locals_);
    for (int i = 0; i < locals_; ++i) {
      const Blocks subs(shards.length(i), hosts_);
      for (int h = 0; h < hosts_; ++h) {
        const size_t start = shards.start(i) + subs.start(h), len = subs.length(h);
        const size_t seg = ctx.segmenter.segmentElems(len);
        sub_first_.push_back(units_.size());
        for (size_t k = 0; k < numSegments(len, seg); ++k)
          units_.push_back({start + k * seg, std::min(seg, len - k * seg)});
      }
    }
    sub_first_.push_back(units_.size());
    last_write_.assign(units_.size(), -1);
  }

  void build(const char* send, char* recv) {
    const int local = local_ring_.me;
    auto shard = [&](int i) { return UnitRange{sub_first_[sub(i, 0)], sub_first_[sub(i + 1, 0)]}; };
    auto sub_block = [&](int h) { return UnitRange{sub_first_[sub(local, h)], sub_first_[sub(local, h + 1)]}; };
    // Phase 1: the host's sum of shard `local` ends here. The sum is not the
    // op's result yet: avg divides once, at the end of phase 2.
    reduceScatter(local_ring_, shard, send, recv, false);
    // Phase 2: shard `local` between the hosts, in place in recv.
    reduceScatter(host_ring_, sub_block, recv, recv, avg_);
    allgather(host_ring_, sub_block, recv);
    // Phase 3: every shard to every rank of the host.
    allgather(local_ring_, shard, recv);
  }

 private:
  // Index of sub-block h of shard i in sub_first_ (h may be hosts_: the next shard's first).
  size_t sub(int i, int h) const {
    return static_cast<size_t>(i) * static_cast<size_t>(hosts_) + static_cast<size_t>(h);
  }

  // A ring reduce-scatter over blocks of units: position p ends with block p
  // reduced over the ring. Step 0 sends `in`; later steps forward partial
  // results, which land in `out`. A unit's send and its reduction with `in`
  // wait for whatever receive last wrote it (an earlier phase).
  template <typename BlockFn>
  void reduceScatter(const Ring& ring, BlockFn block, const char* in, char* out, bool divide_at_end) {
    const int P = ring.size(), r = ring.me;
    for (int step = 0; step < P - 1; ++step) {
      const UnitRange sending = block(ring.wrap(r - 1 - step));
      for (size_t u = sending.first; u < sending.last; ++u) {
        const Unit& unit = units_[u];
        s_.sends.push_back(
            {ring.next(), (step == 0 ? in : out) + unit.offset * es_, unit.offset, unit.count, last_write_[u]});
      }
      const UnitRange receiving = block(ring.wrap(r - 2 - step));
      for (size_t u = receiving.first; u < receiving.last; ++u) {
        const Unit& unit = units_[u];
        RecvStep step_in{ring.prev(),
                         unit.offset,
                         unit.count,
                         nullptr,
                         out + unit.offset * es_,
                         in + unit.offset * es_,
                         divide_at_end && step == P - 2};
        step_in.reduce_after_recv = last_write_[u];
        last_write_[u] = static_cast<int>(s_.recvs.size());
        s_.recvs.push_back(step_in);
      }
    }
  }

  // A ring allgather over blocks of units, in place in `buf`: position p starts
  // with block p complete and ends with every block.
  template <typename BlockFn>
  void allgather(const Ring& ring, BlockFn block, char* buf) {
    const int P = ring.size(), r = ring.me;
    for (int step = 0; step < P - 1; ++step) {
      const UnitRange sending = block(ring.wrap(r - step));
      for (size_t u = sending.first; u < sending.last; ++u) {
        const Unit& unit = units_[u];
        s_.sends.push_back({ring.next(), buf + unit.offset * es_, unit.offset, unit.count, last_write_[u]});
      }
      const UnitRange receiving = block(ring.wrap(r - step - 1));
      for (size_t u = receiving.first; u < receiving.last; ++u) {
        const Unit& unit = units_[u];
        last_write_[u] = static_cast<int>(s_.recvs.size());
        s_.recvs.push_back({ring.prev(), unit.offset, unit.count, buf + unit.offset * es_, nullptr, nullptr, false});
      }
    }
  }

  Schedule& s_;
  const size_t es_;
  const bool avg_;
  int hosts_ = 0;
  int locals_ = 0;
  Ring local_ring_;
  Ring host_ring_;
  std::vector<Unit> units_;
  std::vector<size_t> sub_first_;  // first unit of each (shard, sub-block), then units_.size()
  std::vector<int> last_write_;    // per unit: the receive that last wrote it here (-1: none yet)
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
  HierarchicalBuilder(s, ctx, count).build(send, recv);
}

}  // namespace rcoll
