// The settings every rank must share, agreed at start-up: rank 0 publishes its
// own with the job's secret and id, and every other rank adopts them, warning
// about each one it had set differently. Segment sizes, window slots and
// socket counts decide how bytes line up on the wire, so a rank that kept its
// own would mismatch its peers' headers instead of failing clearly.
//
// One row per setting in kAgreedSettings (agreed_settings.cc); JobInfo carries
// them in the same order.
#pragma once

#include <cstdint>
#include <vector>

#include "config.h"

namespace rcoll {

constexpr int kAgreedSettingCount = 13;

#pragma pack(push, 1)
struct JobInfo {
  uint8_t token[16];  // the job's secret: every connection's handshake carries it
  uint64_t comm_id;   // tells this communicator's connections from any other's
  uint32_t size;
  uint64_t settings[kAgreedSettingCount];  // rank 0's values, in kAgreedSettings' order
};
#pragma pack(pop)

// Rank 0: a fresh job (random token and id) carrying its settings.
JobInfo newJob(const Config& config, int size);
std::vector<uint8_t> encodeJob(const JobInfo& job);
// Any other rank: rank 0's job as published. Throws RcollError(kConfig) when
// rank 0 runs another rcoll version (another layout) or another world size.
JobInfo decodeJob(const std::vector<uint8_t>& bytes, int rank, int size);
// Takes rank 0's value of every agreed setting into `config`, with a warning
// naming each variable that differed.
void adoptAgreedSettings(const JobInfo& job, Config& config);

}  // namespace rcoll
