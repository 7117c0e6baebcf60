// The header in front of every message between ranks.
//
// It lets the receiver check that the bytes it is about to accept belong to the
// collective it is running: a rank that called a different op, count, dtype,
// reduce op or root, or is one op ahead, is reported on both sides by name
// instead of hanging or corrupting a buffer. 64 bytes per segment.
#pragma once

#include <cstdint>
#include <string>

#include "dtype.h"
#include "op_kind.h"

namespace rcoll {

constexpr uint32_t kWireMagic = 0x4c4f4352;  // "RCOL" in little-endian byte order
// 2: the connection handshake names its socket (lane) and the sockets per
//    pair (RCOLL_SOCKETS_PER_PEER), 44 bytes instead of 40.
// 3: `message` numbers a pair's messages where they are spread over several
//    networks (tcp_failover.cc), and control frames (lane_control.h) travel
//    between them.
constexpr uint16_t kWireVersion = 3;

#pragma pack(push, 1)
struct WireHeader {
  uint32_t magic;
  uint16_t version;
  uint8_t kind;        // OpKind
  uint8_t dtype;       // DataType
  uint8_t reduce_op;   // ReduceOp (0 where the op does not reduce)
  uint8_t error_kind;  // kAbort only: the sender's ErrorKind
  uint16_t reserved;
  uint32_t src_rank;  // sender's rank in the communicator
  uint32_t root;      // root of broadcast, reduce, gather, scatter (0 otherwise)
  uint64_t comm_id;   // random per communicator, agreed at rendezvous
  uint64_t seq;       // op sequence number within the communicator, from 1
  uint64_t count;     // the op's element count as the caller passed it (alltoall: see below)
  uint64_t offset;    // element offset of this segment within the op's buffer (alltoall: see below)
  uint64_t bytes;     // payload bytes that follow the header
  uint32_t message;   // the TCP transport over several networks: the message's number on its pair, mod 2^32; else 0
};
#pragma pack(pop)
static_assert(sizeof(WireHeader) == 64, "the wire header is 64 bytes");

// alltoall (alltoallv): ranks legitimately pass different counts, so the op's
// count cannot be compared across ranks. Instead every message from rank a to
// rank b carries, in `count`, the number of elements a sends to b in this op
// (a's send_counts[b]); b expects its recv_counts[a] there, so a pair whose two
// ends disagree is a mismatch naming both ranks and both numbers. `offset` is
// the element offset of the segment within that pair's block (displacements
// are each rank's local layout and do not travel). Every pair exchanges at
// least one message, a zero-byte one when its count is 0, so a disagreement
// is caught even when one side expects nothing. OpDesc::count of an alltoall
// is the total number of elements the rank sends (used in local messages only).

// The collective a rank is running, as the wire header describes it.
struct OpDesc {
  OpKind kind = OpKind::kBarrier;
  DataType dtype = DataType::kUInt8;
  ReduceOp reduce_op = ReduceOp::kSum;
  uint32_t root = 0;
  uint64_t count = 0;
  uint64_t seq = 0;
};

// "allreduce(float32, count=1048576, op=sum)" / "broadcast(int8, count=7, root=3)" /
// "reduce(float32, count=10, op=sum, root=0)"
std::string describeOp(const OpDesc& op);
OpDesc opFromHeader(const WireHeader& header);

WireHeader makeHeader(const OpDesc& op, uint64_t comm_id, uint32_t src_rank, uint64_t offset, uint64_t bytes);

// "" when `got` (from rank got.src_rank) is the segment the receiver (`my_rank`)
// expects, else a message naming both ranks and both ops, for example
// "rank 2 called allreduce(float32, count=1048576, op=sum) as op #17 while rank 0
// called allreduce(float32, count=1048575, op=sum) as op #17".
std::string checkHeader(const WireHeader& expected, const WireHeader& got, int my_rank);

// "rank 1 called broadcast(...) as op #7 while rank 0 called allreduce(...) as op #7":
// two ranks that called different collectives. `theirs` is the peer's op as
// this rank knows it (a description, or only its kind's name). `their_rank`
// is 64-bit: a header's (unsigned 32-bit) sender is printed as it came.
std::string differentCallsMessage(int64_t their_rank, const std::string& theirs, uint64_t their_seq, int my_rank,
                                  const OpDesc& mine);

}  // namespace rcoll
