#include "dtype.h"

namespace rcoll {

size_t elementSize(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat16:
      return 2;
    case DataType::kBFloat16:
      return 2;
    case DataType::kFloat32:
      return 4;
    case DataType::kFloat64:
      return 8;
    case DataType::kInt8:
      return 1;
    case DataType::kUInt8:
      return 1;
    case DataType::kInt32:
      return 4;
    case DataType::kInt64:
      return 8;
    case DataType::kBool:
      return 1;
    case DataType::kInt16:
      return 2;
    case DataType::kUInt16:
      return 2;
    case DataType::kUInt32:
      return 4;
    case DataType::kUInt64:
      return 8;
    case DataType::kFloat8E4M3FN:
      return 1;
    case DataType::kFloat8E5M2:
      return 1;
  }
  return 0;
}

const char* dataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat16:
      return "float16";
    case DataType::kBFloat16:
      return "bfloat16";
    case DataType::kFloat32:
      return "float32";
    case DataType::kFloat64:
      return "float64";
    case DataType::kInt8:
      return "int8";
    case DataType::kUInt8:
      return "uint8";
    case DataType::kInt32:
      return "int32";
    case DataType::kInt64:
      return "int64";
    case DataType::kBool:
      return "bool";
    case DataType::kInt16:
      return "int16";
    case DataType::kUInt16:
      return "uint16";
    case DataType::kUInt32:
      return "uint32";
    case DataType::kUInt64:
      return "uint64";
    case DataType::kFloat8E4M3FN:
      return "float8_e4m3fn";
    case DataType::kFloat8E5M2:
      return "float8_e5m2";
  }
  return "?";
}

// torch's names (c10::toString), which its flight-recorder analyzer compares.
const char* torchDtypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat16:
      return "Half";
    case DataType::kBFloat16:
      return "BFloat16";
    case DataType::kFloat32:
      return "Float";
    case DataType::kFloat64:
      return "Double";
    case DataType::kInt8:
      return "Char";
    case DataType::kUInt8:
      return "Byte";
    case DataType::kInt32:
      return "Int";
    case DataType::kInt64:
      return "Long";
    case DataType::kBool:
      return "Bool";
    case DataType::kInt16:
      return "Short";
    case DataType::kUInt16:
      return "UInt16";
    case DataType::kUInt32:
      return "UInt32";
    case DataType::kUInt64:
      return "UInt64";
    case DataType::kFloat8E4M3FN:
      return "Float8_e4m3fn";
    case DataType::kFloat8E5M2:
      return "Float8_e5m2";
  }
  return "Byte";
}

const char* reduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kProd:
      return "prod";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kBand:
      return "band";
    case ReduceOp::kBor:
      return "bor";
    case ReduceOp::kBxor:
      return "bxor";
  }
  return "?";
}

bool isValidDataType(int value) { return value >= 0 && value < kNumDataTypes; }
bool isValidReduceOp(int value) { return value >= 0 && value < kNumReduceOps; }

bool isFloatingPoint(DataType dtype) {
  return dtype == DataType::kFloat16 || dtype == DataType::kBFloat16 || dtype == DataType::kFloat32 ||
         dtype == DataType::kFloat64 || dtype == DataType::kFloat8E4M3FN || dtype == DataType::kFloat8E5M2;
}

std::string reduceUnsupportedReason(DataType dtype, ReduceOp op) {
  bool bitwise = op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
  if (bitwise && isFloatingPoint(dtype)) {
    return std::string("reduce op '") + reduceOpName(op) + "' needs an integer or bool dtype, got " +
           dataTypeName(dtype);
  }
  if (op == ReduceOp::kAvg && !isFloatingPoint(dtype)) {
    return std::string("reduce op 'avg' needs a floating-point dtype, got ") + dataTypeName(dtype) +
           " (use 'sum' and divide with the rounding you want)";
  }
  return "";
}

}  // namespace rcoll
