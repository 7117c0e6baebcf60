// Element operators for the CUDA kernels: the device twins of the functors in
// csrc/reduce_kernels.cc, with the same semantics (see csrc/reduce_kernels.h).
//
// Every functor maps storage values to a storage value, so one vectorized loop
// (elementwise.cuh) serves every dtype. They are __host__ too, for the CPU-only
// check in host_check/. Keep this file and the CPU kernels in
// step: the tests compare both against the same references.
//
// Built without --use_fast_math on purpose: x / d must stay IEEE division
// (-prec-div=true), subnormals must survive (-ftz=false) and x != x must stay a
// NaN test.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "float8.h"  // Float8E4M3FN, Float8E5M2: the same codecs as the CPU kernels

namespace rcoll {
namespace cuda {

// ---- arithmetic in the storage type ----

// unsigned int for narrow unsigned types, so that e.g. uint8 * uint8 never
// overflows a promoted *signed* int; T itself otherwise. Integer sum/prod are
// instantiated on unsigned types only, so they wrap like numpy.
template <typename T>
using ArithType = std::common_type_t<T, unsigned>;

struct Add {
  template <typename T>
  __host__ __device__ T operator()(T x, T y) const {
    return static_cast<T>(static_cast<ArithType<T>>(x) + static_cast<ArithType<T>>(y));
  }
};

struct Mul {
  template <typename T>
  __host__ __device__ T operator()(T x, T y) const {
    return static_cast<T>(static_cast<ArithType<T>>(x) * static_cast<ArithType<T>>(y));
  }
};

template <typename T>
__host__ __device__ bool isNan(T x) {
  if constexpr (std::is_floating_point_v<T>) {
    return x != x;
  } else {
    return false;
  }
}

// numpy.minimum/maximum: NaN in either operand gives NaN (if x is not NaN and
// y is, the comparison fails and y is returned); on a tie the first operand
// wins, as on the CPU.
struct Min {
  template <typename T>
  __host__ __device__ T operator()(T x, T y) const {
    return (x <= y || isNan(x)) ? x : y;
  }
};

struct Max {
  template <typename T>
  __host__ __device__ T operator()(T x, T y) const {
    return (x >= y || isNan(x)) ? x : y;
  }
};

struct BitAnd {
  template <typename T>
  __host__ __device__ T operator()(T x, T y) const {
    return static_cast<T>(x & y);
  }
};

struct BitOr {
  template <typename T>
  __host__ __device__ T operator()(T x, T y) const {
    return static_cast<T>(x | y);
  }
};

struct BitXor {
  template <typename T>
  __host__ __device__ T operator()(T x, T y) const {
    return static_cast<T>(x ^ y);
  }
};

// bool travels as bytes where any nonzero value means true; results are 0/1.
struct LogicalOr {
  __host__ __device__ uint8_t operator()(uint8_t x, uint8_t y) const { return (x | y) != 0; }
};

struct LogicalAnd {
  __host__ __device__ uint8_t operator()(uint8_t x, uint8_t y) const { return x != 0 && y != 0; }
};

struct LogicalXor {
  __host__ __device__ uint8_t operator()(uint8_t x, uint8_t y) const { return (x != 0) != (y != 0); }
};

// ---- 16-bit floats: stored as uint16_t, computed in float32, rounded once ----

// The CUDA conversions are exact (to float) and round to nearest-even (from
// float), like csrc/half.h; NaN stays NaN (its payload may differ).
struct Float16Codec {
  using Storage = uint16_t;
  __host__ __device__ static float toFloat(uint16_t v) { return __half2float(__ushort_as_half(v)); }
  __host__ __device__ static uint16_t fromFloat(float v) { return __half_as_ushort(__float2half_rn(v)); }
};

struct BFloat16Codec {
  using Storage = uint16_t;
  __host__ __device__ static float toFloat(uint16_t v) { return __bfloat162float(__ushort_as_bfloat16(v)); }
  __host__ __device__ static uint16_t fromFloat(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }
};

// The narrow float types (16-bit, and float8 through float8.h): stored as
// Codec::Storage, computed in float32, rounded once.
template <typename Codec, typename Op>
struct ViaFloat {
  using Storage = typename Codec::Storage;
  __host__ __device__ Storage operator()(Storage x, Storage y) const {
    return Codec::fromFloat(Op{}(Codec::toFloat(x), Codec::toFloat(y)));
  }
};

// ---- avg's final step ----

// True division, not a multiplication by 1/divisor: that is not correctly
// rounded for divisors that are not powers of two.
template <typename T>
struct DivideBy {
  T divisor;
  __host__ __device__ T operator()(T x) const { return x / divisor; }
};

template <typename Codec>
struct DivideViaFloat {
  using Storage = typename Codec::Storage;
  float divisor;
  __host__ __device__ Storage operator()(Storage x) const { return Codec::fromFloat(Codec::toFloat(x) / divisor); }
};

}  // namespace cuda
}  // namespace rcoll
