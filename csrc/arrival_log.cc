#include "arrival_log.h"

#include <algorithm>

namespace rcoll {

void ArrivalLog::finished(uint64_t seq, bool rooted, int64_t created_ns, int64_t finished_ns) {
  const bool follows = has_previous_ && previous_seq_ + 1 == seq;
  const Sample sample{seq, finished_ns - created_ns, follows ? created_ns - previous_end_ns_ : kUnknown};
  has_previous_ = true;
  previous_seq_ = seq;
  previous_end_ns_ = finished_ns;
  if (rooted) return;  // a root's collective: its members do not leave together, so waits say nothing
  for (size_t i = 0; i < kStrides.size(); ++i) {
    if (seq % kStrides[i] != 0) continue;
    Ring& ring = rings_[i];
    ring.slots[ring.count++ % kPerRing] = sample;
  }
}

std::vector<ArrivalLog::Sample> ArrivalLog::samples() const {
  std::vector<Sample> out;
  for (const Ring& ring : rings_) {
    const uint64_t kept = std::min<uint64_t>(ring.count, kPerRing);
    for (uint64_t k = ring.count - kept; k < ring.count; ++k) out.push_back(ring.slots[k % kPerRing]);
  }
  std::sort(out.begin(), out.end(), [](const Sample& a, const Sample& b) { return a.seq < b.seq; });
  out.erase(std::unique(out.begin(), out.end(), [](const Sample& a, const Sample& b) { return a.seq == b.seq; }),
            out.end());
  return out;
}

}  // namespace rcoll
