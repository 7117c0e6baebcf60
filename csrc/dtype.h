// Element types and reduction operators understood by the core.
//
// The core never sees framework types (numpy, torch): buffers arrive as raw
// pointers plus one of these tags. The numeric values travel in the wire header,
// so they are part of the protocol: append, never renumber.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace rcoll {

enum class DataType : uint8_t {
  kFloat16 = 0,
  kBFloat16 = 1,
  kFloat32 = 2,
  kFloat64 = 3,
  kInt8 = 4,
  kUInt8 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kBool = 8,
  kInt16 = 9,
  kUInt16 = 10,
  kUInt32 = 11,
  kUInt64 = 12,
  kFloat8E4M3FN = 13,  // float8.h: layouts, rounding, NaN and overflow rules
  kFloat8E5M2 = 14,
};
constexpr int kNumDataTypes = 15;

enum class ReduceOp : uint8_t {
  kSum = 0,
  kProd = 1,
  kMin = 2,
  kMax = 3,
  kAvg = 4,   // sum, then divided by the number of ranks once at the end
  kBand = 5,  // bitwise ops: integer and bool types only
  kBor = 6,
  kBxor = 7,
};
constexpr int kNumReduceOps = 8;

size_t elementSize(DataType dtype);
const char* dataTypeName(DataType dtype);    // numpy spelling: "float32", "bfloat16"...
const char* torchDtypeName(DataType dtype);  // torch's spelling: "Float", "BFloat16"...
const char* reduceOpName(ReduceOp op);       // "sum", "prod", ...

bool isValidDataType(int value);
bool isValidReduceOp(int value);
bool isFloatingPoint(DataType dtype);

// Why `op` cannot reduce `dtype` ("" when it can). Bitwise ops need integers or
// bool; avg needs a floating-point type (integer averages would have to pick a
// rounding rule silently, so they are refused, as torch.mean refuses them).
std::string reduceUnsupportedReason(DataType dtype, ReduceOp op);

}  // namespace rcoll
