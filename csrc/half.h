// float16 / bfloat16 <-> float32 conversions by pure bit manipulation.
//
// No _Float16, F16C or NEON intrinsics: the wheel must run on any x86-64 and
// aarch64 CPU. Every function is a straight line of integer/float operations
// ending in selects (no branches), so GCC can auto-vectorize loops over them
// even at the baseline ISA (SSE2).
//
// Semantics: float -> half rounds to nearest-even (overflow gives inf);
// half -> float is exact; NaN stays NaN (sign and top payload bits kept, quiet
// bit forced on) in both directions. The float -> float16 subnormal path uses
// one float addition, so it relies on the default round-to-nearest mode; it is
// correct under flush-to-zero / denormals-are-zero too (float subnormals round
// to a zero float16 either way).
#pragma once

#include <cstdint>
#include <cstring>

namespace rcoll {

inline uint32_t floatToBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
}

inline float bitsToFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// Branch-free select. A plain ?: whose arm is computed with float arithmetic
// lets GCC sink that arithmetic into a branch, and under -ftrapping-math (the
// default) it then refuses to if-convert the branch back, so the enclosing
// loop stops vectorizing. A mask blend keeps the arithmetic unconditional.
inline uint32_t selectBits(bool condition, uint32_t ifTrue, uint32_t ifFalse) {
  const uint32_t mask = 0u - static_cast<uint32_t>(condition);
  return (ifTrue & mask) | (ifFalse & ~mask);
}

// ---- float16: 1 sign, 5 exponent (bias 15), 10 mantissa bits ----

inline float halfToFloat(uint16_t half) {
  const uint32_t sign = static_cast<uint32_t>(half & 0x8000u) << 16;
  const uint32_t mantissa = half & 0x03ffu;
  // Exponent and mantissa moved to their float32 positions.
  const uint32_t shifted = static_cast<uint32_t>(half & 0x7fffu) << 13;
  const uint32_t exponent = shifted & 0x0f800000u;
  // Normal: rebias the exponent from 15 to 127.
  const uint32_t normal = shifted + (112u << 23);
  // Inf/NaN: all exponent bits set; a NaN also gets the quiet bit.
  const uint32_t quiet = mantissa != 0 ? 0x00400000u : 0u;
  const uint32_t infOrNan = shifted | 0x7f800000u | quiet;
  // Zero/subnormal: the value is mantissa * 2^-24, exact in float. The
  // conversion is from int32 because SSE2 has no unsigned -> float convert.
  const uint32_t subnormal = floatToBits(static_cast<float>(static_cast<int32_t>(mantissa)) * 0x1p-24f);
  const uint32_t finite = selectBits(exponent == 0, subnormal, normal);
  const uint32_t magnitude = selectBits(exponent == 0x0f800000u, infOrNan, finite);
  return bitsToFloat(sign | magnitude);
}

// Every candidate result is built in the top 16 bits of a uint32_t and the
// answer is shifted down once at the end. Building them in the low bits lets
// GCC shrink the selects to 16-bit lanes, and at SSE2 it then spends many
// shuffles narrowing each 32-bit compare mask: about twice as slow.
inline uint16_t floatToHalf(float value) {
  const uint32_t bits = floatToBits(value);
  const uint32_t abs = bits & 0x7fffffffu;
  // Normal result: rebias 127 -> 15, then drop 13 mantissa bits rounding to
  // nearest-even: adding 0xfff plus the lowest kept bit carries into the kept
  // bits exactly when the dropped part is above half, or equal to half with an
  // odd kept part. A carry out of the mantissa bumps the exponent, which also
  // produces inf for values in [65520, 65536). (x >> 13) << 16 is x << 3 with
  // junk in the low 16 bits. Wraps harmlessly for inputs that take another path.
  const uint32_t odd = (abs >> 13) & 1u;
  const uint32_t normal = (abs - (112u << 23) + 0xfffu + odd) << 3;
  // Subnormal result (|value| < 2^-14): adding 0.5 makes the float unit in the
  // last place 2^-24, the float16 subnormal step, so the FPU does the
  // nearest-even rounding; the low bits are then the float16 encoding (1024,
  // the smallest normal, comes out right too).
  const uint32_t subnormal = (floatToBits(bitsToFloat(abs) + 0.5f) - floatToBits(0.5f)) << 16;
  const uint32_t nan = 0x7e000000u | ((abs << 3) & 0x03ff0000u);  // quiet, top payload bits
  const uint32_t finite = selectBits(abs < (113u << 23), subnormal, normal);
  const uint32_t infOrFinite = selectBits(abs >= (143u << 23), 0x7c000000u, finite);  // >= 65536
  const uint32_t magnitude = selectBits(abs > 0x7f800000u, nan, infOrFinite);
  return static_cast<uint16_t>(((bits & 0x80000000u) | magnitude) >> 16);
}

// ---- bfloat16: the top half of a float32 ----

inline float bfloat16ToFloat(uint16_t value) {
  const uint32_t bits = static_cast<uint32_t>(value) << 16;
  const bool isNan = (bits & 0x7fffffffu) > 0x7f800000u;
  return bitsToFloat(bits | (isNan ? 0x00400000u : 0u));
}

inline uint16_t floatToBfloat16(float value) {
  const uint32_t bits = floatToBits(value);
  // Round to nearest-even on the 16 dropped bits (same carry trick as above);
  // subnormals and overflow to inf fall out of the carry naturally. As in
  // floatToHalf, the select works on the full 32 bits and shifts down once.
  const uint32_t rounded = bits + 0x7fffu + ((bits >> 16) & 1u);
  // A NaN must not carry into the exponent (it could become inf): truncate it
  // instead and force the quiet bit so a payload in the dropped bits survives.
  const uint32_t nan = bits | 0x00400000u;
  const bool isNan = (bits & 0x7fffffffu) > 0x7f800000u;
  return static_cast<uint16_t>(selectBits(isNan, nan, rounded) >> 16);
}

}  // namespace rcoll
