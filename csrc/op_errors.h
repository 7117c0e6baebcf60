// The messages of an op that failed or timed out, worded the same whichever
// executor ran it (host memory: pipeline_executor, device memory:
// device_staging_executor), so users and tests see one format.
#pragma once

#include <chrono>
#include <cstdint>
#include <set>
#include <string>

#include "error.h"
#include "wire.h"

namespace rcoll {

// "rank 2: allreduce(float32, count=4, op=sum) (op #7) failed: <why>"
inline std::string opFailureMessage(int rank, const OpDesc& op, const std::string& why) {
  return strFormat("rank %d: %s (op #%llu) failed: %s", rank, describeOp(op).c_str(),
                   static_cast<unsigned long long>(op.seq), why.c_str());
}

// Names the peers still owed data: `silent` sent nothing that arrived,
// `not_taking` did not take what was sent to them. `otherwise` says what was
// being waited for when neither list has a peer.
inline std::string opTimeoutMessage(int rank, const OpDesc& op, std::chrono::milliseconds limit,
                                    const std::set<int>& silent, const std::set<int>& not_taking,
                                    const char* otherwise) {
  auto list = [](const std::set<int>& ranks) {
    std::string out;
    for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
    return out;
  };
  std::string detail;
  if (!silent.empty()) detail += "no data arrived from rank(s) " + list(silent);
  if (!not_taking.empty()) {
    detail += (detail.empty() ? "" : "; ") + std::string("rank(s) ") + list(not_taking) +
              " did not take the data sent to them";
  }
  if (detail.empty()) detail = otherwise;
  return strFormat("rank %d: %s (op #%llu) %s; %s (did a rank die, hang, or skip this collective?)", rank,
                   describeOp(op).c_str(), static_cast<unsigned long long>(op.seq),
                   timedOut(static_cast<double>(limit.count()) / 1000.0).c_str(), detail.c_str());
}

}  // namespace rcoll
