// Which loop runs for each (dtype, op): the storage type T and the element
// functor, as in csrc/reduce_kernels.cc. Written once as "visit" functions so
// the launches (reduce_floating.cu, reduce_integral.cu) and the CPU-only check
// (host_check/) cannot disagree.
//
// visit(Type<T>{}, functor) is called for a supported pair and its result
// returned; `otherwise` is returned for anything else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "dtype.h"
#include "reduce_ops.cuh"

namespace rcoll {
namespace cuda {

template <typename T>
struct Type {
  using type = T;
};

// float16/bfloat16 (uint16_t storage) and float8 (uint8_t) computed in float32; avg reduces like sum.
template <typename R, typename Visit>
R visitFloatingReduce(DataType dtype, ReduceOp op, Visit&& visit, R otherwise) {
  auto native = [&](auto type) -> R {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        return visit(type, Add{});
      case ReduceOp::kProd:
        return visit(type, Mul{});
      case ReduceOp::kMin:
        return visit(type, Min{});
      case ReduceOp::kMax:
        return visit(type, Max{});
      default:
        return otherwise;
    }
  };
  auto via = [&](auto codec) -> R {
    using Codec = decltype(codec);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        return visit(Type<typename Codec::Storage>{}, ViaFloat<Codec, Add>{});
      case ReduceOp::kProd:
        return visit(Type<typename Codec::Storage>{}, ViaFloat<Codec, Mul>{});
      case ReduceOp::kMin:
        return visit(Type<typename Codec::Storage>{}, ViaFloat<Codec, Min>{});
      case ReduceOp::kMax:
        return visit(Type<typename Codec::Storage>{}, ViaFloat<Codec, Max>{});
      default:
        return otherwise;
    }
  };
  switch (dtype) {
    case DataType::kFloat16:
      return via(Float16Codec{});
    case DataType::kBFloat16:
      return via(BFloat16Codec{});
    case DataType::kFloat32:
      return native(Type<float>{});
    case DataType::kFloat64:
      return native(Type<double>{});
    case DataType::kFloat8E4M3FN:
      return via(Float8E4M3FN{});
    case DataType::kFloat8E5M2:
      return via(Float8E5M2{});
    default:
      return otherwise;
  }
}

// Sum, prod and the bitwise ops run in the unsigned type of the same width:
// overflow then wraps (two's complement, like numpy) instead of being
// undefined, and int8/uint8 (int32/uint32...) share one kernel. Only min/max
// need the signed type. bool: sum/max/bor = or, prod/min/band = and, bxor = xor.
template <typename R, typename Visit>
R visitIntegralReduce(DataType dtype, ReduceOp op, Visit&& visit, R otherwise) {
  auto integer = [&](auto type) -> R {
    using S = typename decltype(type)::type;
    using U = Type<std::make_unsigned_t<S>>;
    switch (op) {
      case ReduceOp::kSum:
        return visit(U{}, Add{});
      case ReduceOp::kProd:
        return visit(U{}, Mul{});
      case ReduceOp::kMin:
        return visit(type, Min{});
      case ReduceOp::kMax:
        return visit(type, Max{});
      case ReduceOp::kBand:
        return visit(U{}, BitAnd{});
      case ReduceOp::kBor:
        return visit(U{}, BitOr{});
      case ReduceOp::kBxor:
        return visit(U{}, BitXor{});
      default:
        return otherwise;  // avg: refused for integers
    }
  };
  switch (dtype) {
    case DataType::kInt8:
      return integer(Type<int8_t>{});
    case DataType::kUInt8:
      return integer(Type<uint8_t>{});
    case DataType::kInt32:
      return integer(Type<int32_t>{});
    case DataType::kInt64:
      return integer(Type<int64_t>{});
    case DataType::kInt16:
      return integer(Type<int16_t>{});
    case DataType::kUInt16:
      return integer(Type<uint16_t>{});
    case DataType::kUInt32:
      return integer(Type<uint32_t>{});
    case DataType::kUInt64:
      return integer(Type<uint64_t>{});
    case DataType::kBool:
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kMax:
        case ReduceOp::kBor:
          return visit(Type<uint8_t>{}, LogicalOr{});
        case ReduceOp::kProd:
        case ReduceOp::kMin:
        case ReduceOp::kBand:
          return visit(Type<uint8_t>{}, LogicalAnd{});
        case ReduceOp::kBxor:
          return visit(Type<uint8_t>{}, LogicalXor{});
        default:
          return otherwise;
      }
    default:
      return otherwise;
  }
}

// avg's last step. The divisor is converted as on the CPU: to float for the
// 16-bit types and float32, to double for float64.
template <typename R, typename Visit>
R visitScaleDivide(DataType dtype, size_t divisor, Visit&& visit, R otherwise) {
  switch (dtype) {
    case DataType::kFloat16:
      return visit(Type<uint16_t>{}, DivideViaFloat<Float16Codec>{static_cast<float>(divisor)});
    case DataType::kBFloat16:
      return visit(Type<uint16_t>{}, DivideViaFloat<BFloat16Codec>{static_cast<float>(divisor)});
    case DataType::kFloat32:
      return visit(Type<float>{}, DivideBy<float>{static_cast<float>(divisor)});
    case DataType::kFloat64:
      return visit(Type<double>{}, DivideBy<double>{static_cast<double>(divisor)});
    case DataType::kFloat8E4M3FN:
      return visit(Type<uint8_t>{}, DivideViaFloat<Float8E4M3FN>{static_cast<float>(divisor)});
    case DataType::kFloat8E5M2:
      return visit(Type<uint8_t>{}, DivideViaFloat<Float8E5M2>{static_cast<float>(divisor)});
    default:
      return otherwise;
  }
}

}  // namespace cuda
}  // namespace rcoll
