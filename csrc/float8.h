// float8_e4m3fn and float8_e5m2 <-> float32, for the CPU kernels and the CUDA
// kernels alike (one source, so both round the same way).
//
// The formats (as torch, ml_dtypes and the OCP 8-bit float spec define them):
//   e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities; the
//           only NaN is S.1111.111; largest finite 448.
//   e5m2:   1 sign, 5 exponent (bias 15), 2 mantissa bits; IEEE-like: infinities
//           S.11111.00, NaNs S.11111.xx; largest finite 57344.
// Rules of fromFloat (those of torch's Tensor.to() and of ml_dtypes' astype,
// checked against ml_dtypes on every pair of float8 values, for every reduce op,
// by tests/collectives/test_float8.py):
//   - round to nearest, ties to even, subnormals included;
//   - not saturating: a value that rounds past the largest finite becomes NaN
//     in e4m3fn (it has no infinity) and infinity in e5m2; infinities become
//     NaN in e4m3fn and stay infinities in e5m2;
//   - NaN becomes the quiet NaN of the format (0x7f / 0x7e) with its sign.
// A reduction of two float8 values computes in float32 and rounds once to the
// format, as torch and ml_dtypes compute float8 arithmetic (in float32 the sum
// of two e4m3fn values and the product of any two float8 values are exact).
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define RCOLL_HOST_DEVICE __host__ __device__
#else
#define RCOLL_HOST_DEVICE
#endif

namespace rcoll {
namespace float8 {

RCOLL_HOST_DEVICE inline uint32_t bitsOf(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

RCOLL_HOST_DEVICE inline float floatOf(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// Rounds `magnitude >> shift` to nearest, ties to even (shift in 1..31).
RCOLL_HOST_DEVICE inline uint32_t shiftRoundEven(uint32_t magnitude, int shift) {
  const uint32_t kept = magnitude >> shift;
  const uint32_t rest = magnitude & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  return kept + ((rest > half || (rest == half && (kept & 1u))) ? 1u : 0u);
}

// kExp exponent bits, kMan mantissa bits, kFiniteOnly: the e4m3fn layout.
template <int kExp, int kMan, bool kFiniteOnly>
struct Format {
  using Storage = uint8_t;  // a codec for the narrow-float kernels (reduce_kernels.cc)
  static constexpr int kBias = (1 << (kExp - 1)) - 1;
  static constexpr int kMinExp = 1 - kBias;  // exponent of the smallest normal
  static constexpr uint32_t kNan = kFiniteOnly ? 0x7fu : 0x7eu;
  static constexpr uint32_t kInf = kFiniteOnly ? 0x7fu : 0x7cu;  // e4m3fn: NaN stands in
  static constexpr uint32_t kMaxFinite = kFiniteOnly ? 0x7eu : 0x7bu;

  RCOLL_HOST_DEVICE static float toFloat(uint8_t v) {
    const uint32_t sign = static_cast<uint32_t>(v & 0x80u) << 24;
    const uint32_t exp = (v >> kMan) & ((1u << kExp) - 1u);
    const uint32_t man = v & ((1u << kMan) - 1u);
    const uint32_t all_ones = (1u << kExp) - 1u;
    if (kFiniteOnly ? (exp == all_ones && man == (1u << kMan) - 1u) : exp == all_ones) {
      return floatOf(sign | (!kFiniteOnly && man == 0 ? 0x7f800000u : 0x7fc00000u));
    }
    if (exp == 0) {  // zero or subnormal: man x 2^(kMinExp - kMan), exact in float32
      const float step = floatOf(static_cast<uint32_t>(127 + kMinExp - kMan) << 23);
      return floatOf(sign | bitsOf(static_cast<float>(man) * step));
    }
    return floatOf(sign | ((exp - kBias + 127u) << 23) | (man << (23 - kMan)));
  }

  RCOLL_HOST_DEVICE static uint8_t fromFloat(float value) {
    const uint32_t bits = bitsOf(value);
    const uint32_t sign = (bits >> 24) & 0x80u;
    const uint32_t magnitude = bits & 0x7fffffffu;
    if (magnitude >= 0x7f800000u) {  // infinity or NaN
      return static_cast<uint8_t>(sign | (magnitude == 0x7f800000u ? kInf : kNan));
    }
    const int exp = static_cast<int>(magnitude >> 23) - 127;  // -127: zero or a float32 subnormal
    uint32_t code;
    if (exp >= kMinExp) {
      // Normal in the format: drop the low mantissa bits with rounding; a carry
      // moves into the exponent by itself. Then rebias the exponent field.
      code = shiftRoundEven(magnitude, 23 - kMan) - (static_cast<uint32_t>(127 - kBias) << kMan);
    } else {
      // Subnormal (or zero) in the format: the significand in steps of 2^(kMinExp - kMan).
      const uint32_t significand = exp == -127 ? (magnitude & 0x7fffffu) << 1 : (magnitude & 0x7fffffu) | 0x800000u;
      const int e = exp == -127 ? -127 : exp;  // significand x 2^(e - 23)
      const int shift = 23 + kMinExp - kMan - e;
      code = shift >= 32 ? 0u : shiftRoundEven(significand, shift);  // may round up to the smallest normal
    }
    if (code > kMaxFinite) code = kInf;  // not saturating: past the largest finite
    return static_cast<uint8_t>(sign | code);
  }
};

}  // namespace float8

using Float8E4M3FN = float8::Format<4, 3, true>;
using Float8E5M2 = float8::Format<5, 2, false>;

}  // namespace rcoll
