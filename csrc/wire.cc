#include "wire.h"

#include "error.h"

namespace rcoll {

namespace {

bool opReduces(OpKind kind) {
  const OpTraits* t = findOpTraits(kind);
  return t != nullptr && t->reduces;
}

bool opHasRoot(OpKind kind) {
  const OpTraits* t = findOpTraits(kind);
  return t != nullptr && t->rooted;
}

}  // namespace

std::string describeOp(const OpDesc& op) {
  if (op.kind == OpKind::kBarrier) return "barrier()";
  std::string out =
      std::string(opKindName(op.kind)) + "(" + dataTypeName(op.dtype) + ", count=" + std::to_string(op.count);
  if (opReduces(op.kind)) out += std::string(", op=") + reduceOpName(op.reduce_op);
  if (opHasRoot(op.kind)) out += ", root=" + std::to_string(op.root);
  if (op.kind == OpKind::kPointToPoint) out += ", tag=" + std::to_string(op.root);
  return out + ")";
}

OpDesc opFromHeader(const WireHeader& header) {
  OpDesc op;
  op.kind = static_cast<OpKind>(header.kind);
  op.dtype = isValidDataType(header.dtype) ? static_cast<DataType>(header.dtype) : DataType::kUInt8;
  op.reduce_op = isValidReduceOp(header.reduce_op) ? static_cast<ReduceOp>(header.reduce_op) : ReduceOp::kSum;
  op.root = header.root;
  op.count = header.count;
  op.seq = header.seq;
  return op;
}

WireHeader makeHeader(const OpDesc& op, uint64_t comm_id, uint32_t src_rank, uint64_t offset, uint64_t bytes) {
  WireHeader h{};
  h.magic = kWireMagic;
  h.version = kWireVersion;
  h.kind = static_cast<uint8_t>(op.kind);
  h.dtype = static_cast<uint8_t>(op.dtype);
  h.reduce_op = opReduces(op.kind) ? static_cast<uint8_t>(op.reduce_op) : 0;
  h.src_rank = src_rank;
  h.root = opHasRoot(op.kind) || op.kind == OpKind::kPointToPoint ? op.root : 0;  // p2p: the tag
  h.comm_id = comm_id;
  h.seq = op.seq;
  h.count = op.count;
  h.offset = offset;
  h.bytes = bytes;
  return h;
}

std::string differentCallsMessage(int64_t their_rank, const std::string& theirs, uint64_t their_seq, int my_rank,
                                  const OpDesc& mine) {
  return strFormat("rank %lld called %s as op #%llu while rank %d called %s as op #%llu",
                   static_cast<long long>(their_rank), theirs.c_str(), static_cast<unsigned long long>(their_seq),
                   my_rank, describeOp(mine).c_str(), static_cast<unsigned long long>(mine.seq));
}

std::string checkHeader(const WireHeader& expected, const WireHeader& got, int my_rank) {
  if (got.magic != kWireMagic) {
    return strFormat(
        "received bytes that are not an rcoll message (magic 0x%08x) where rank %u's "
        "data was expected: the stream is corrupt or the peer is not rcoll",
        got.magic, expected.src_rank);
  }
  if (got.version != kWireVersion) {
    return strFormat(
        "rank %u speaks rcoll wire version %u, this rank speaks %u: "
        "install the same rcoll version on every rank",
        got.src_rank, got.version, kWireVersion);
  }
  if (got.comm_id != expected.comm_id) {
    return strFormat("rank %u sent data for another communicator (id %016llx, expected %016llx)", got.src_rank,
                     static_cast<unsigned long long>(got.comm_id), static_cast<unsigned long long>(expected.comm_id));
  }
  bool same_op = got.kind == expected.kind && got.dtype == expected.dtype && got.reduce_op == expected.reduce_op &&
                 got.root == expected.root && got.count == expected.count && got.seq == expected.seq;
  if (!same_op && got.kind == expected.kind && got.kind == static_cast<uint8_t>(OpKind::kAllToAll) &&
      got.dtype == expected.dtype && got.seq == expected.seq && got.count != expected.count) {
    // alltoall: `count` is the pair's element count (wire.h).
    OpDesc op = opFromHeader(got);
    return strFormat(
        "rank %u called alltoall(%s) as op #%llu sending %llu elements to rank %d while rank %d "
        "called alltoall(%s) as op #%llu expecting %llu elements from rank %u (send_counts and "
        "recv_counts disagree)",
        got.src_rank, dataTypeName(op.dtype), static_cast<unsigned long long>(got.seq),
        static_cast<unsigned long long>(got.count), my_rank, my_rank, dataTypeName(op.dtype),
        static_cast<unsigned long long>(expected.seq), static_cast<unsigned long long>(expected.count), got.src_rank);
  }
  if (!same_op) {
    return differentCallsMessage(got.src_rank, describeOp(opFromHeader(got)), got.seq, my_rank, opFromHeader(expected));
  }
  if (got.offset != expected.offset || got.bytes != expected.bytes) {
    return strFormat(
        "rank %u sent segment [offset %llu, %llu bytes] of %s op #%llu where rank %d "
        "expected [offset %llu, %llu bytes]: ranks disagree on the segmentation "
        "(different RCOLL_CHUNK_BYTES or rcoll versions?)",
        got.src_rank, static_cast<unsigned long long>(got.offset), static_cast<unsigned long long>(got.bytes),
        describeOp(opFromHeader(got)).c_str(), static_cast<unsigned long long>(got.seq), my_rank,
        static_cast<unsigned long long>(expected.offset), static_cast<unsigned long long>(expected.bytes));
  }
  return "";
}

}  // namespace rcoll
