#include "lane_control.h"

#include "error.h"

namespace rcoll {

WireHeader makeLaneControl(LaneControl kind, uint64_t comm_id, int src_rank, int lane, uint64_t count) {
  WireHeader h{};
  h.magic = kControlMagic;
  h.version = kWireVersion;
  h.kind = static_cast<uint8_t>(kind);
  h.src_rank = static_cast<uint32_t>(src_rank);
  h.comm_id = comm_id;
  h.count = count;
  h.offset = static_cast<uint64_t>(lane);
  return h;
}

std::string checkLaneControl(const WireHeader& got, uint64_t comm_id, int peer, int lanes) {
  const bool known =
      got.kind == static_cast<uint8_t>(LaneControl::kAck) || got.kind == static_cast<uint8_t>(LaneControl::kLaneDown);
  if (got.version != kWireVersion || got.comm_id != comm_id || got.src_rank != static_cast<uint32_t>(peer) || !known ||
      got.offset >= static_cast<uint64_t>(lanes) || got.bytes != 0) {
    return strFormat(
        "a control frame on rank %d's connection is malformed (version %u, kind %u, from rank %u, socket %llu): "
        "the stream is corrupt or the peer runs another rcoll version",
        peer, got.version, got.kind, got.src_rank, static_cast<unsigned long long>(got.offset));
  }
  return "";
}

}  // namespace rcoll
