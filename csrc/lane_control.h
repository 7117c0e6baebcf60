// Control frames between the two ends of one socket ("lane") where a pair's
// messages are spread over several networks (tcp_failover.cc).
//
// They share the data stream with the messages, at message boundaries, and
// look like a wire header with their own magic, so that a reader tells them
// apart from data by their first four bytes:
//   ack        "of your messages on this socket I hold the first `count`": the
//              sender may let their buffers go (their sends complete);
//   lane down  "the socket `lane` between us failed; of your messages on it I
//              hold the first `count`": the sender sends the rest again on the
//              sockets that are left.
#pragma once

#include <cstdint>
#include <string>

#include "wire.h"

namespace rcoll {

constexpr uint32_t kControlMagic = 0x4c544352;  // "RCTL" in little-endian byte order

enum class LaneControl : uint8_t { kAck = 1, kLaneDown = 2 };

WireHeader makeLaneControl(LaneControl kind, uint64_t comm_id, int src_rank, int lane, uint64_t count);

inline bool isLaneControl(const WireHeader& h) { return h.magic == kControlMagic; }

// "" when `got` is a well-formed control frame from `peer` of communicator
// `comm_id`, else what is wrong with it (the stream is corrupt).
std::string checkLaneControl(const WireHeader& got, uint64_t comm_id, int peer, int lanes);

}  // namespace rcoll
