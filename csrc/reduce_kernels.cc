#include "reduce_kernels.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <type_traits>

#include "error.h"
#include "float8.h"
#include "half.h"

#include <atomic>
#include <type_traits>
#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#endif

// Every kernel is one simple indexed loop applying a small functor, so the
// compiler can auto-vectorize it (checked with -O3 -fopt-info-vec at the
// baseline x86-64 ISA). `out` may equal `a` exactly, so those two are never
// marked __restrict against each other; `b` never overlaps `out`, so it is.

namespace rcoll {

namespace {
std::atomic<bool> g_portable_half{false};
bool portableHalfForced() { return g_portable_half.load(std::memory_order_relaxed); }
}  // namespace

void forcePortableHalfKernels(bool portable) { g_portable_half.store(portable); }

namespace {

// ---- element operators ----

template <typename T>
inline bool isNan(T x) {
  if constexpr (std::is_floating_point_v<T>) {
    return x != x;  // a select-friendly isnan (std::isnan can stay a call)
  } else {
    return false;
  }
}

// Arithmetic type for T: unsigned int for narrow unsigned types, so that e.g.
// uint16 * uint16 cannot overflow a promoted *signed* int; T itself otherwise.
template <typename T>
using ArithType = std::common_type_t<T, unsigned>;

struct Add {
  template <typename T>
  T operator()(T x, T y) const {
    return static_cast<T>(static_cast<ArithType<T>>(x) + static_cast<ArithType<T>>(y));
  }
};

struct Mul {
  template <typename T>
  T operator()(T x, T y) const {
    return static_cast<T>(static_cast<ArithType<T>>(x) * static_cast<ArithType<T>>(y));
  }
};

// numpy.minimum/maximum: a NaN in either operand gives NaN. On ties (+0 vs -0)
// the first operand wins, as in numpy's float16 loop (its SIMD float32/64
// loops keep the second, so signed-zero ties are not a numpy contract).
struct Min {
  template <typename T>
  T operator()(T x, T y) const {
    return (x <= y || isNan(x)) ? x : y;
  }
};

struct Max {
  template <typename T>
  T operator()(T x, T y) const {
    return (x >= y || isNan(x)) ? x : y;
  }
};

struct BitAnd {
  template <typename T>
  T operator()(T x, T y) const {
    return static_cast<T>(x & y);
  }
};

struct BitOr {
  template <typename T>
  T operator()(T x, T y) const {
    return static_cast<T>(x | y);
  }
};

struct BitXor {
  template <typename T>
  T operator()(T x, T y) const {
    return static_cast<T>(x ^ y);
  }
};

// bool arrives as bytes that may hold any nonzero value for true; results are
// normalised to 0/1. Bytes are read as uint8_t: reading a C++ bool that holds
// 2 would be undefined behaviour.
struct LogicalOr {
  uint8_t operator()(uint8_t x, uint8_t y) const { return (x | y) != 0; }
};

struct LogicalAnd {
  uint8_t operator()(uint8_t x, uint8_t y) const { return x != 0 && y != 0; }
};

struct LogicalXor {
  uint8_t operator()(uint8_t x, uint8_t y) const { return (x != 0) != (y != 0); }
};

// ---- loops ----

template <typename T, typename Op>
void applyLoop(T* out, const T* a, const T* __restrict b, size_t count, Op op) {
  for (size_t i = 0; i < count; ++i) out[i] = op(a[i], b[i]);
}

template <typename T, typename Op>
void applyTyped(void* out, const void* a, const void* b, size_t count, Op op) {
  applyLoop(static_cast<T*>(out), static_cast<const T*>(a), static_cast<const T*>(b), count, op);
}

// The narrow float types are stored as `Storage` and computed in float32 (the
// float8 codecs, Float8E4M3FN and Float8E5M2 from float8.h, have the same shape).
struct Float16Codec {
  using Storage = uint16_t;
  static float toFloat(uint16_t v) { return halfToFloat(v); }
  static uint16_t fromFloat(float v) { return floatToHalf(v); }
};

struct BFloat16Codec {
  using Storage = uint16_t;
  static float toFloat(uint16_t v) { return bfloat16ToFloat(v); }
  static uint16_t fromFloat(float v) { return floatToBfloat16(v); }
};

// Elements per stack block for the 16-bit float types: the two float32 temps
// (2 KiB) stay in L1, and each conversion loop is long enough to vectorize.
constexpr size_t kHalfBlock = 256;

template <typename Codec>
void widenBlock(const typename Codec::Storage* __restrict src, float* __restrict dst, size_t count) {
  for (size_t i = 0; i < count; ++i) dst[i] = Codec::toFloat(src[i]);
}

// Converts both inputs of a block to float32, applies the op there and rounds
// back once, matching the header's "computed in float32, rounded once".
template <typename Codec, typename Op>
void applyViaFloat(void* outRaw, const void* aRaw, const void* bRaw, size_t count, Op op) {
  using Storage = typename Codec::Storage;
  auto* out = static_cast<Storage*>(outRaw);
  const auto* a = static_cast<const Storage*>(aRaw);
  const auto* b = static_cast<const Storage*>(bRaw);
  float fa[kHalfBlock];
  float fb[kHalfBlock];
  for (size_t base = 0; base < count; base += kHalfBlock) {
    const size_t len = std::min(kHalfBlock, count - base);
    widenBlock<Codec>(a + base, fa, len);
    widenBlock<Codec>(b + base, fb, len);
    Storage* dst = out + base;
    for (size_t i = 0; i < len; ++i) dst[i] = Codec::fromFloat(op(fa[i], fb[i]));
  }
}

#if defined(__x86_64__) && defined(__GNUC__)
// The same computation with AVX2, and F16C's vcvtph2ps/vcvtps2ph for float16.
// The portable code above is branch-free so that it vectorizes, but at the
// baseline x86-64 ISA (SSE2) the float16 conversions run at ~1 GB/s, slower
// than the wire. F16C converts exactly and rounds to nearest-even, with the
// same NaN rule (quiet bit set, payload truncated), so results are bit-identical
// (tests/native/cpp/test_reduce_kernels.cc compares both paths on every float16
// value). No FMA: fused multiply-adds would round differently.
#define RCOLL_HAVE_AVX2_HALF 1

bool cpuHasAvx2F16c() {
  // F16C through cpuid (leaf 1, ECX): clang's __builtin_cpu_supports knows no "f16c".
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    return __builtin_cpu_supports("avx2") && __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  }();
  return has;
}

template <typename Codec, typename Op>
__attribute__((target("avx2,f16c"))) void applyHalfAvx2(void* outRaw, const void* aRaw, const void* bRaw, size_t count,
                                                        Op op) {
  auto* out = static_cast<uint16_t*>(outRaw);
  const auto* a = static_cast<const uint16_t*>(aRaw);
  const auto* b = static_cast<const uint16_t*>(bRaw);
  float fa[kHalfBlock];
  float fb[kHalfBlock];
  for (size_t base = 0; base < count; base += kHalfBlock) {
    const size_t len = std::min(kHalfBlock, count - base);
    size_t i = 0;
    if constexpr (std::is_same_v<Codec, Float16Codec>) {
      for (; i + 8 <= len; i += 8) {
        _mm256_storeu_ps(fa + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + base + i))));
        _mm256_storeu_ps(fb + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + base + i))));
      }
    }
    for (; i < len; ++i) {
      fa[i] = Codec::toFloat(a[base + i]);
      fb[i] = Codec::toFloat(b[base + i]);
    }
    for (i = 0; i < len; ++i) fa[i] = op(fa[i], fb[i]);
    uint16_t* dst = out + base;
    i = 0;
    if constexpr (std::is_same_v<Codec, Float16Codec>) {
      for (; i + 8 <= len; i += 8) {
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(fa + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      }
    }
    for (; i < len; ++i) dst[i] = Codec::fromFloat(fa[i]);
  }
}
#endif

template <typename Codec, typename Op>
void applyViaFloatBest(void* out, const void* a, const void* b, size_t count, Op op) {
#ifdef RCOLL_HAVE_AVX2_HALF
  if constexpr (sizeof(typename Codec::Storage) == 2) {
    if (cpuHasAvx2F16c() && !portableHalfForced()) return applyHalfAvx2<Codec>(out, a, b, count, op);
  }
#endif
  applyViaFloat<Codec>(out, a, b, count, op);
}

[[noreturn]] void throwBadCombo(DataType dtype, ReduceOp op) {
  throwError(ErrorKind::kInvalidArgument, strFormat("invalid dtype or reduce op value (dtype %d, op %d)",
                                                    static_cast<int>(dtype), static_cast<int>(op)));
}

// ---- dispatch per dtype family (avg reduces like sum) ----

template <typename T>
void reduceFloat(void* out, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return applyTyped<T>(out, a, b, count, Add{});
    case ReduceOp::kProd:
      return applyTyped<T>(out, a, b, count, Mul{});
    case ReduceOp::kMin:
      return applyTyped<T>(out, a, b, count, Min{});
    case ReduceOp::kMax:
      return applyTyped<T>(out, a, b, count, Max{});
    default:
      throwBadCombo(dtype, op);
  }
}

template <typename Codec>
void reduceViaFloat(void* out, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return applyViaFloatBest<Codec>(out, a, b, count, Add{});
    case ReduceOp::kProd:
      return applyViaFloatBest<Codec>(out, a, b, count, Mul{});
    case ReduceOp::kMin:
      return applyViaFloatBest<Codec>(out, a, b, count, Min{});
    case ReduceOp::kMax:
      return applyViaFloatBest<Codec>(out, a, b, count, Max{});
    default:
      throwBadCombo(dtype, op);
  }
}

// Sum/prod/bitwise run in the unsigned type of the same width so overflow
// wraps (two's complement, like numpy) instead of being undefined; min/max
// compare in the declared (possibly signed) type.
template <typename S>
void reduceInteger(void* out, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op) {
  using U = std::make_unsigned_t<S>;
  switch (op) {
    case ReduceOp::kSum:
      return applyTyped<U>(out, a, b, count, Add{});
    case ReduceOp::kProd:
      return applyTyped<U>(out, a, b, count, Mul{});
    case ReduceOp::kMin:
      return applyTyped<S>(out, a, b, count, Min{});
    case ReduceOp::kMax:
      return applyTyped<S>(out, a, b, count, Max{});
    case ReduceOp::kBand:
      return applyTyped<U>(out, a, b, count, BitAnd{});
    case ReduceOp::kBor:
      return applyTyped<U>(out, a, b, count, BitOr{});
    case ReduceOp::kBxor:
      return applyTyped<U>(out, a, b, count, BitXor{});
    default:
      throwBadCombo(dtype, op);
  }
}

void reduceBool(void* out, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMax:
    case ReduceOp::kBor:
      return applyTyped<uint8_t>(out, a, b, count, LogicalOr{});
    case ReduceOp::kProd:
    case ReduceOp::kMin:
    case ReduceOp::kBand:
      return applyTyped<uint8_t>(out, a, b, count, LogicalAnd{});
    case ReduceOp::kBxor:
      return applyTyped<uint8_t>(out, a, b, count, LogicalXor{});
    default:
      throwBadCombo(dtype, op);
  }
}

// ---- scaleDivide ----

// True division, not multiplication by a reciprocal: x * (1/n) is not
// correctly rounded for n that are not powers of two.
template <typename T>
void divideLoop(T* buf, size_t count, T divisor) {
  for (size_t i = 0; i < count; ++i) buf[i] = buf[i] / divisor;
}

template <typename Codec>
void divideViaFloat(typename Codec::Storage* buf, size_t count, float divisor) {
  for (size_t i = 0; i < count; ++i) buf[i] = Codec::fromFloat(Codec::toFloat(buf[i]) / divisor);
}

}  // namespace

void reduceInto(void* out, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op) {
  if (!isValidDataType(static_cast<int>(dtype)) || !isValidReduceOp(static_cast<int>(op))) {
    throwBadCombo(dtype, op);
  }
  const std::string reason = reduceUnsupportedReason(dtype, op);
  if (!reason.empty()) throwError(ErrorKind::kInvalidArgument, reason);
  switch (dtype) {
    case DataType::kFloat16:
      return reduceViaFloat<Float16Codec>(out, a, b, count, dtype, op);
    case DataType::kBFloat16:
      return reduceViaFloat<BFloat16Codec>(out, a, b, count, dtype, op);
    case DataType::kFloat32:
      return reduceFloat<float>(out, a, b, count, dtype, op);
    case DataType::kFloat64:
      return reduceFloat<double>(out, a, b, count, dtype, op);
    case DataType::kInt8:
      return reduceInteger<int8_t>(out, a, b, count, dtype, op);
    case DataType::kUInt8:
      return reduceInteger<uint8_t>(out, a, b, count, dtype, op);
    case DataType::kInt32:
      return reduceInteger<int32_t>(out, a, b, count, dtype, op);
    case DataType::kInt64:
      return reduceInteger<int64_t>(out, a, b, count, dtype, op);
    case DataType::kBool:
      return reduceBool(out, a, b, count, dtype, op);
    case DataType::kInt16:
      return reduceInteger<int16_t>(out, a, b, count, dtype, op);
    case DataType::kUInt16:
      return reduceInteger<uint16_t>(out, a, b, count, dtype, op);
    case DataType::kUInt32:
      return reduceInteger<uint32_t>(out, a, b, count, dtype, op);
    case DataType::kUInt64:
      return reduceInteger<uint64_t>(out, a, b, count, dtype, op);
    case DataType::kFloat8E4M3FN:
      return reduceViaFloat<Float8E4M3FN>(out, a, b, count, dtype, op);
    case DataType::kFloat8E5M2:
      return reduceViaFloat<Float8E5M2>(out, a, b, count, dtype, op);
  }
  throwBadCombo(dtype, op);
}

void scaleDivide(void* buf, size_t count, DataType dtype, size_t divisor) {
  if (divisor == 0) throwError(ErrorKind::kInvalidArgument, "scaleDivide: divisor is 0");
  switch (dtype) {
    case DataType::kFloat16:
      return divideViaFloat<Float16Codec>(static_cast<uint16_t*>(buf), count, static_cast<float>(divisor));
    case DataType::kBFloat16:
      return divideViaFloat<BFloat16Codec>(static_cast<uint16_t*>(buf), count, static_cast<float>(divisor));
    case DataType::kFloat32:
      return divideLoop(static_cast<float*>(buf), count, static_cast<float>(divisor));
    case DataType::kFloat64:
      return divideLoop(static_cast<double*>(buf), count, static_cast<double>(divisor));
    case DataType::kFloat8E4M3FN:
      return divideViaFloat<Float8E4M3FN>(static_cast<uint8_t*>(buf), count, static_cast<float>(divisor));
    case DataType::kFloat8E5M2:
      return divideViaFloat<Float8E5M2>(static_cast<uint8_t*>(buf), count, static_cast<float>(divisor));
    default:
      break;
  }
  throwError(ErrorKind::kInvalidArgument,
             std::string("scaleDivide needs a floating-point dtype, got ") +
                 (isValidDataType(static_cast<int>(dtype)) ? dataTypeName(dtype) : "unknown"));
}

}  // namespace rcoll
