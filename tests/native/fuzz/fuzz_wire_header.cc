// libFuzzer target: the wire header check (checkHeader, opFromHeader,
// describeOp) over arbitrary 64-byte headers, invalid kind/dtype/reduce-op
// values included.
//
//   byte 0      mode: bit 0 clear: `expected` is the 64 bytes after `got`;
//               bit 0 set: `expected` is `got` XOR those bytes (zeros: equal
//               headers, so the fuzzer reaches every branch of the check);
//               bits 1-3: the receiver's rank
//   64 bytes    got (what arrived); missing bytes read as 0
//   64 bytes    expected, or the XOR mask
//
// Oracles: checkHeader() returns "" exactly when `got` has the wire magic and
// version and every op and segment field equals `expected`'s, and otherwise a
// message that starts with the sending rank ("rank N ...") or names the stream
// as corrupt; describeOp() gives a non-empty description of any OpDesc, with
// out-of-range enum values too; and when both headers are well formed (what
// makeHeader() can produce) and describe different ops, the message describes
// them differently.
#include <string>

#include "dtype.h"
#include "fuzz_common.h"
#include "wire.h"

using namespace rcoll;

namespace {

bool reduces(uint8_t kind) {
  return kind == static_cast<uint8_t>(OpKind::kAllreduce) || kind == static_cast<uint8_t>(OpKind::kReduceScatter) ||
         kind == static_cast<uint8_t>(OpKind::kReduce);
}

bool hasRoot(uint8_t kind) {
  return kind == static_cast<uint8_t>(OpKind::kBroadcast) || kind == static_cast<uint8_t>(OpKind::kReduce) ||
         kind == static_cast<uint8_t>(OpKind::kGather) || kind == static_cast<uint8_t>(OpKind::kScatter) ||
         kind == static_cast<uint8_t>(OpKind::kPointToPoint);
}

// A header makeHeader() could have produced for a collective.
bool wellFormed(const WireHeader& h) {
  bool kind_ok =
      (h.kind >= static_cast<uint8_t>(OpKind::kAllreduce) && h.kind <= static_cast<uint8_t>(OpKind::kPointToPoint)) ||
      h.kind == static_cast<uint8_t>(OpKind::kAdasum);
  if (!kind_ok || !isValidDataType(h.dtype)) return false;
  if (reduces(h.kind) ? !isValidReduceOp(h.reduce_op) : h.reduce_op != 0) return false;
  if (!hasRoot(h.kind) && h.root != 0) return false;
  if (h.kind == static_cast<uint8_t>(OpKind::kBarrier) &&
      (h.dtype != static_cast<uint8_t>(DataType::kUInt8) || h.count != 0)) {
    return false;
  }
  return true;
}

bool sameOp(const WireHeader& a, const WireHeader& b) {
  return a.kind == b.kind && a.dtype == b.dtype && a.reduce_op == b.reduce_op && a.root == b.root &&
         a.count == b.count && a.seq == b.seq;
}

// Whether `got` is the segment `expected` describes: checkHeader() must say "" exactly then.
// (The receiver's own magic and version are the constants, whatever `expected` holds there.)
bool matches(const WireHeader& expected, const WireHeader& got) {
  return got.magic == kWireMagic && got.version == kWireVersion && got.comm_id == expected.comm_id &&
         sameOp(expected, got) && got.offset == expected.offset && got.bytes == expected.bytes;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  rcoll_fuzz::quietLogs();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  uint8_t raw[2 * sizeof(WireHeader)] = {};
  std::memcpy(raw, data + 1, std::min(size - 1, sizeof(raw)));
  WireHeader got, expected;
  std::memcpy(&got, raw, sizeof(got));
  std::memcpy(&expected, raw + sizeof(got), sizeof(expected));
  if (mode & 1) {
    uint8_t* e = reinterpret_cast<uint8_t*>(&expected);
    for (size_t i = 0; i < sizeof(expected); ++i) e[i] ^= raw[i];
  }
  const int my_rank = (mode >> 1) & 7;

  // describeOp never fails, whatever the enum values, raw or through opFromHeader.
  OpDesc raw_op;
  raw_op.kind = static_cast<OpKind>(got.kind);
  raw_op.dtype = static_cast<DataType>(got.dtype);
  raw_op.reduce_op = static_cast<ReduceOp>(got.reduce_op);
  raw_op.root = got.root;
  raw_op.count = got.count;
  raw_op.seq = got.seq;
  FUZZ_CHECK(!describeOp(raw_op).empty(), "describeOp of a raw op is empty");
  OpDesc op = opFromHeader(got);
  std::string got_desc = describeOp(op);
  FUZZ_CHECK(!got_desc.empty() && got_desc.back() == ')', "describeOp: '%s'", got_desc.c_str());
  FUZZ_CHECK(opKindName(op.kind) != nullptr, "opKindName returned null");
  FUZZ_CHECK(elementSize(op.dtype) > 0, "opFromHeader produced an invalid dtype %d", static_cast<int>(op.dtype));

  std::string msg = checkHeader(expected, got, my_rank);
  bool equal = matches(expected, got);
  FUZZ_CHECK(msg.empty() == equal, "checkHeader returned '%s' for %s headers", msg.c_str(),
             equal ? "matching" : "different");
  if (equal) return 0;

  const std::string from = strFormat("rank %u ", got.src_rank);
  bool names_sender = msg.compare(0, from.size(), from) == 0;
  bool names_corruption = got.magic != kWireMagic && msg.find("not an rcoll message") != std::string::npos;
  FUZZ_CHECK(names_sender || names_corruption, "the message names neither the sender nor corruption: '%s'",
             msg.c_str());

  if (got.magic == kWireMagic && got.version == kWireVersion && got.comm_id == expected.comm_id &&
      !sameOp(expected, got) && wellFormed(expected) && wellFormed(got)) {
    // Two real ops that differ: the message must let a reader tell them apart.
    std::string mine =
        describeOp(opFromHeader(expected)) + strFormat(" as op #%llu", static_cast<unsigned long long>(expected.seq));
    std::string theirs = got_desc + strFormat(" as op #%llu", static_cast<unsigned long long>(got.seq));
    bool alltoall_counts =
        got.kind == static_cast<uint8_t>(OpKind::kAllToAll) && got.kind == expected.kind && got.count != expected.count;
    FUZZ_CHECK(mine != theirs || alltoall_counts, "different ops described identically ('%s'): '%s'", mine.c_str(),
               msg.c_str());
  }
  return 0;
}
