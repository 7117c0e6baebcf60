// Which socket ("lane") to a peer carries the next message, the same answer
// at both ends without a word: the sender's k-th message to a peer and the
// receiver's k-th receive from it pick the same lane because both run this
// schedule with the same weights from the same start.
//
// Equal weights: lane k mod n, as before several NICs. Weights measured per
// pair (lane_probe.h): a smooth weighted round robin, so that a lane of
// weight 4 beside one of weight 1 takes four messages of every five, spread
// out rather than in runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace rcoll {

class LaneSchedule {
 public:
  LaneSchedule() = default;
  explicit LaneSchedule(int lanes) : weights_(static_cast<size_t>(lanes), 1), current_(weights_.size(), 0) {}

  // Restarts the schedule with these weights (each >= 1): call it at the same
  // message count at both ends (before the pair's first message).
  void setWeights(const std::vector<int>& weights);
  const std::vector<int>& weights() const { return weights_; }

  int peek() const;  // the lane of the next message
  int next();        // the same, and moves on

 private:
  int pick(std::vector<int64_t>* current) const;
  bool equal() const;

  std::vector<int> weights_;
  std::vector<int64_t> current_;  // smooth weighted round robin's running credit per lane
  uint64_t count_ = 0;            // messages so far (equal weights: lane count_ mod n)
};

}  // namespace rcoll
