// When this rank arrived at a group's collectives, kept for the job's
// straggler judgement (python/rcoll/_health.py): per collective without a
// root, how long the rank waited in it (its call to its end) and how long it
// was away before it (the end of the group's previous collective to this
// call). The ranks' waits in one collective say which came last with no
// clock compared across hosts; the time away says whether it came last
// because of its own work.
//
// Every rank publishes its samples each watch round, at its own moment, and
// the judge needs the same collectives from every rank. The last few
// hundred collectives cover less than a round in a job that runs hundreds a
// second, so three rings keep the collectives whose number is a multiple of
// 1, 16 and 256: whatever the rate, one of them spans several rounds, and
// every rank keeps the same numbers.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace rcoll {

class ArrivalLog {
 public:
  static constexpr size_t kPerRing = 128;
  static constexpr int64_t kUnknown = INT64_MIN;

  struct Sample {
    uint64_t seq = 0;
    int64_t wait_ns = 0;
    int64_t away_ns = kUnknown;  // unknown when the collective before it is not the previous number
  };

  // A collective of the group finished (in order: a group runs its collectives one after another).
  void finished(uint64_t seq, bool rooted, int64_t created_ns, int64_t finished_ns);
  // Every kept sample once, by collective number.
  std::vector<Sample> samples() const;

 private:
  static constexpr std::array<uint64_t, 3> kStrides{1, 16, 256};
  struct Ring {
    std::array<Sample, kPerRing> slots{};
    uint64_t count = 0;
  };
  std::array<Ring, kStrides.size()> rings_{};
  bool has_previous_ = false;
  uint64_t previous_seq_ = 0;
  int64_t previous_end_ns_ = 0;
};

}  // namespace rcoll
