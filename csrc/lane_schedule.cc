#include "lane_schedule.h"

#include <algorithm>
#include <numeric>

namespace rcoll {

void LaneSchedule::setWeights(const std::vector<int>& weights) {
  weights_ = weights;
  for (int& w : weights_) w = std::max(1, w);
  current_.assign(weights_.size(), 0);
  count_ = 0;
}

bool LaneSchedule::equal() const {
  return std::all_of(weights_.begin(), weights_.end(), [&](int w) { return w == weights_[0]; });
}

// Every lane gains its weight; the one with the most credit goes and pays the
// total. Ties go to the lowest lane, so both ends pick alike.
int LaneSchedule::pick(std::vector<int64_t>* current) const {
  const int64_t total = std::accumulate(weights_.begin(), weights_.end(), int64_t{0});
  size_t best = 0;
  for (size_t i = 0; i < weights_.size(); ++i) {
    (*current)[i] += weights_[i];
    if ((*current)[i] > (*current)[best]) best = i;
  }
  (*current)[best] -= total;
  return static_cast<int>(best);
}

int LaneSchedule::peek() const {
  if (weights_.size() <= 1) return 0;
  if (equal()) return static_cast<int>(count_ % weights_.size());
  std::vector<int64_t> scratch = current_;
  return pick(&scratch);
}

int LaneSchedule::next() {
  if (weights_.size() <= 1) return 0;
  if (equal()) return static_cast<int>(count_++ % weights_.size());
  ++count_;
  return pick(&current_);
}

}  // namespace rcoll
