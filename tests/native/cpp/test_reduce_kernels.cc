// Standalone tests for csrc/half.h and csrc/reduce_kernels.cc.
//
//   g++ -O2 -std=c++17 -Wall -Wextra -Werror -fsanitize=address,undefined -Icsrc
//       tests/native/cpp/test_reduce_kernels.cc csrc/reduce_kernels.cc csrc/dtype.cc
//       csrc/error.cc -o test_reduce_kernels && ./test_reduce_kernels
//
// The half conversions are checked against independent references built on
// double arithmetic (ldexp/frexp/nearbyint), exhaustively where the domain is
// 16 bits and on millions of chosen floats otherwise. The kernels are then
// checked for every dtype x op against a scalar reference that uses those
// reference conversions. Exit status is nonzero on any failure.

#include <algorithm>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "dtype.h"
#include "error.h"
#include "half.h"
#include "reduce_kernels.h"

using namespace rcoll;

namespace {

int gFailures = 0;

// Reports at most a few failures per check so a broken kernel stays readable.
bool check(bool ok, const std::string& what) {
  if (!ok) {
    ++gFailures;
    if (gFailures <= 50) std::fprintf(stderr, "FAIL: %s\n", what.c_str());
  }
  return ok;
}

std::mt19937_64 gRng(0x5eed1234);

uint64_t randomBits() { return gRng(); }

// ---------------------------------------------------------------------------
// Reference conversions (slow, written from the format definitions).

bool halfIsNan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0; }
bool bf16IsNan(uint16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x007fu) != 0; }

double refHalfToDouble(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  double magnitude;
  if (exponent == 0x1f) {
    magnitude = mantissa ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    magnitude = std::ldexp(mantissa, -24);
  } else {
    magnitude = std::ldexp(1024 + mantissa, exponent - 25);
  }
  return (h & 0x8000u) ? -magnitude : magnitude;
}

double refBf16ToDouble(uint16_t h) {
  const int exponent = (h >> 7) & 0xff;
  const int mantissa = h & 0x7f;
  double magnitude;
  if (exponent == 0xff) {
    magnitude = mantissa ? std::numeric_limits<double>::quiet_NaN() : std::numeric_limits<double>::infinity();
  } else if (exponent == 0) {
    magnitude = std::ldexp(mantissa, -133);
  } else {
    magnitude = std::ldexp(128 + mantissa, exponent - 134);
  }
  return (h & 0x8000u) ? -magnitude : magnitude;
}

// Rounds a finite non-negative float to a format with `mantissaBits` stored
// bits, exponent bias `bias` and all-ones exponent reserved, nearest-even
// (nearbyint in the default rounding mode). Scaling by powers of two is exact
// in double, so the only rounding is the nearbyint.
uint32_t refRoundMagnitude(double a, int mantissaBits, int bias) {
  const int minNormalExp = 1 - bias;
  const uint32_t infBits = ((2u * static_cast<uint32_t>(bias) + 1u) << mantissaBits);
  if (std::isinf(a)) return infBits;
  if (a < std::ldexp(1.0, minNormalExp)) {
    // Subnormal: units of 2^(minNormalExp - mantissaBits); 2^mantissaBits
    // units is the smallest normal, whose encoding is that same integer.
    return static_cast<uint32_t>(std::nearbyint(std::ldexp(a, mantissaBits - minNormalExp)));
  }
  int e2;
  std::frexp(a, &e2);    // a = m * 2^e2, m in [0.5, 1)
  const int e = e2 - 1;  // a in [2^e, 2^(e+1))
  // q in [2^mb, 2^(mb+1)]; q == 2^(mb+1) carries into the exponent.
  const double q = std::nearbyint(std::ldexp(a, mantissaBits - e));
  const uint64_t bits = (static_cast<uint64_t>(e + bias - 1) << mantissaBits) + static_cast<uint64_t>(q);
  return bits >= infBits ? infBits : static_cast<uint32_t>(bits);
}

uint16_t refFloatToHalf(float f) {
  if (std::isnan(f)) return 0x7e00;  // only NaN-ness is compared
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  return static_cast<uint16_t>(sign | refRoundMagnitude(std::fabs(double(f)), 10, 15));
}

uint16_t refFloatToBf16(float f) {
  if (std::isnan(f)) return 0x7fc0;
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  return static_cast<uint16_t>(sign | refRoundMagnitude(std::fabs(double(f)), 7, 127));
}

uint32_t bitsOf(float f) { return floatToBits(f); }

bool sameFloat(float x, float y) { return (std::isnan(x) && std::isnan(y)) || bitsOf(x) == bitsOf(y); }

bool floatIsQuietNan(float f) { return std::isnan(f) && (bitsOf(f) & 0x00400000u); }

std::string hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// ---------------------------------------------------------------------------
// Conversion tests.

void testHalfExhaustive() {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = halfToFloat(h);
    const double ref = refHalfToDouble(h);
    if (halfIsNan(h)) {
      check(floatIsQuietNan(f) && std::signbit(f) == bool(h & 0x8000u), "halfToFloat NaN " + hex(h));
      const uint16_t back = floatToHalf(f);
      check(halfIsNan(back) && (back & 0x0200u) && (back & 0x8000u) == (h & 0x8000u),
            "half NaN round trip " + hex(h) + " -> " + hex(back));
      // The top payload bits survive (quiet bit forced on).
      check((back & 0x01ffu) == (h & 0x01ffu), "half NaN payload " + hex(h));
    } else {
      check(double(f) == ref && std::signbit(f) == std::signbit(ref), "halfToFloat " + hex(h));
      check(floatToHalf(f) == h, "half round trip " + hex(h));
    }
  }
}

void testBf16Exhaustive() {
  for (uint32_t i = 0; i < 65536; ++i) {
    const uint16_t h = static_cast<uint16_t>(i);
    const float f = bfloat16ToFloat(h);
    if (bf16IsNan(h)) {
      check(floatIsQuietNan(f), "bfloat16ToFloat NaN " + hex(h));
      const uint16_t back = floatToBfloat16(f);
      check(bf16IsNan(back) && (back & 0x0040u) && (back & 0x803fu) == (h & 0x803fu),
            "bf16 NaN round trip " + hex(h) + " -> " + hex(back));
    } else {
      const double ref = refBf16ToDouble(h);
      check(double(f) == ref && std::signbit(f) == std::signbit(ref), "bfloat16ToFloat " + hex(h));
      check(floatToBfloat16(f) == h, "bf16 round trip " + hex(h));
    }
  }
}

void checkFloatToHalf(float f) {
  const uint16_t got = floatToHalf(f);
  if (std::isnan(f)) {
    check(halfIsNan(got) && (got & 0x0200u), "floatToHalf NaN " + hex(bitsOf(f)));
  } else {
    const uint16_t want = refFloatToHalf(f);
    check(got == want, "floatToHalf " + hex(bitsOf(f)) + " got " + hex(got) + " want " + hex(want));
  }
}

void checkFloatToBf16(float f) {
  const uint16_t got = floatToBfloat16(f);
  if (std::isnan(f)) {
    check(bf16IsNan(got) && (got & 0x0040u), "floatToBfloat16 NaN " + hex(bitsOf(f)));
  } else {
    const uint16_t want = refFloatToBf16(f);
    check(got == want, "floatToBfloat16 " + hex(bitsOf(f)) + " got " + hex(got) + " want " + hex(want));
  }
}

// Every float a half-precision neighbour pair can round from hardest: the
// exact midpoint and the floats just either side of it.
void checkAroundMidpoint(double lo, double hi, void (*checker)(float)) {
  const float mid = static_cast<float>((lo + hi) / 2);  // exact: few significant bits
  for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
    checker(f);
    checker(-f);
  }
}

void testFloatToHalfRounding() {
  // Random bit patterns: every exponent, NaNs, infinities.
  for (int i = 0; i < 3000000; ++i) checkFloatToHalf(bitsToFloat(static_cast<uint32_t>(randomBits())));
  // Exponents around the float16 range (subnormal, normal, overflow), with
  // random mantissas and random or halfway-ish low bits.
  for (int i = 0; i < 3000000; ++i) {
    const uint64_t r = randomBits();
    const uint32_t exponent = 97u + static_cast<uint32_t>(r % 50);  // 2^-30 .. 2^19
    uint32_t mantissa = static_cast<uint32_t>(r >> 8) & 0x7fffffu;
    if (r & (1ull << 40)) mantissa = (mantissa & ~0x1fffu) | 0x1000u;  // normal halfway
    if (r & (1ull << 41)) mantissa ^= static_cast<uint32_t>(r >> 42) & 1u;
    const uint32_t sign = static_cast<uint32_t>(r >> 63) << 31;
    checkFloatToHalf(bitsToFloat(sign | (exponent << 23) | mantissa));
  }
  // Every pair of adjacent finite halves, including the subnormal range,
  // zero/denormal boundary, and 65504 vs the overflow threshold 65520.
  for (uint32_t h = 0; h < 0x7c00u; ++h) {
    const double lo = refHalfToDouble(static_cast<uint16_t>(h));
    const double hi = h + 1 == 0x7c00u ? 65536.0 : refHalfToDouble(static_cast<uint16_t>(h + 1));
    checkAroundMidpoint(lo, hi, checkFloatToHalf);
  }
  for (float f : {0.0f, -0.0f, INFINITY, -INFINITY, 65504.0f, 65519.99f, 65520.0f, 1e-8f,
                  2.98023224e-8f /* 2^-25: ties to 0 */, 2.98023259e-8f, 5.96046448e-8f, 6.10351562e-5f,
                  std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::max()}) {
    checkFloatToHalf(f);
    checkFloatToHalf(-f);
  }
}

void testFloatToBf16Rounding() {
  for (int i = 0; i < 3000000; ++i) {
    const uint64_t r = randomBits();
    uint32_t bits = static_cast<uint32_t>(r);
    if (r & (1ull << 40)) bits = (bits & ~0xffffu) | 0x8000u;  // exact halfway
    if (r & (1ull << 41)) bits ^= static_cast<uint32_t>(r >> 42) & 1u;
    if (r & (1ull << 43)) bits &= 0x807fffffu;  // float subnormal range
    checkFloatToBf16(bitsToFloat(bits));
  }
  for (uint32_t h = 0; h < 0x7f80u; ++h) {
    const double lo = refBf16ToDouble(static_cast<uint16_t>(h));
    const double hi = h + 1 == 0x7f80u ? std::ldexp(1.0, 128) : refBf16ToDouble(static_cast<uint16_t>(h + 1));
    if (h + 1 == 0x7f80u) {
      // The midpoint to "2^128" is not a float; FLT_MAX rounds up to inf.
      checkFloatToBf16(std::numeric_limits<float>::max());
      checkFloatToBf16(-std::numeric_limits<float>::max());
      continue;
    }
    checkAroundMidpoint(lo, hi, checkFloatToBf16);
  }
  // A NaN whose payload lives only in the dropped bits must stay NaN.
  for (uint32_t bits : {0x7f800001u, 0x7f80ffffu, 0xff800001u, 0x7fffffffu}) {
    check(bf16IsNan(floatToBfloat16(bitsToFloat(bits))), "bf16 NaN low payload " + hex(bits));
  }
  check(floatToHalf(bitsToFloat(0x7f800001u)) != 0x7c00u, "f16 NaN low payload");
}

// ---------------------------------------------------------------------------
// Scalar reference reductions on one element, through raw bytes.

// memcpy with empty vectors: their data() may be null, which memcpy forbids.
void copyBytes(void* dst, const void* src, size_t n) {
  if (n) std::memcpy(dst, src, n);
}

template <typename T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

template <typename T>
void store(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof v);
}

template <typename F>
F refFloatOp(ReduceOp op, F x, F y) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return x + y;
    case ReduceOp::kProd:
      return x * y;
    case ReduceOp::kMin:
      if (std::isnan(x) || std::isnan(y)) return std::numeric_limits<F>::quiet_NaN();
      return std::min(x, y);
    case ReduceOp::kMax:
      if (std::isnan(x) || std::isnan(y)) return std::numeric_limits<F>::quiet_NaN();
      return std::max(x, y);
    default:
      break;
  }
  std::abort();
}

// Integer reference in 64-bit (or wider-by-construction) unsigned arithmetic,
// truncated to the width: two's complement wrap.
template <typename T>
T refIntOp(ReduceOp op, T x, T y) {
  using U = std::make_unsigned_t<T>;
  const uint64_t ux = static_cast<U>(x), uy = static_cast<U>(y);
  switch (op) {
    case ReduceOp::kSum:
      return static_cast<T>(static_cast<U>(ux + uy));
    case ReduceOp::kProd:
      return static_cast<T>(static_cast<U>(ux * uy));
    case ReduceOp::kMin:
      return x < y ? x : y;
    case ReduceOp::kMax:
      return x > y ? x : y;
    case ReduceOp::kBand:
      return static_cast<T>(static_cast<U>(ux & uy));
    case ReduceOp::kBor:
      return static_cast<T>(static_cast<U>(ux | uy));
    case ReduceOp::kBxor:
      return static_cast<T>(static_cast<U>(ux ^ uy));
    default:
      break;
  }
  std::abort();
}

uint8_t refBoolOp(ReduceOp op, uint8_t x, uint8_t y) {
  const bool bx = x != 0, by = y != 0;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMax:
    case ReduceOp::kBor:
      return bx || by;
    case ReduceOp::kProd:
    case ReduceOp::kMin:
    case ReduceOp::kBand:
      return bx && by;
    case ReduceOp::kBxor:
      return bx != by;
    default:
      break;
  }
  std::abort();
}

float refHalfToFloat(uint16_t h) { return static_cast<float>(refHalfToDouble(h)); }

// float8 from the formats' definitions, independent of csrc/float8.h's bit
// arithmetic: decoding by formula, encoding as the nearest of all codes (ties to
// the even code). One step past the largest finite value stands the code above
// it: 480 = 0x7f (NaN in e4m3fn: odd, so a tie at 464 goes down to 448) and
// 65536 = 0x7c (infinity in e5m2: even, so a tie at 61440 goes up to it).
struct RefFloat8 {
  int exp_bits, man_bits;
  bool finite_only;
  int bias() const { return (1 << (exp_bits - 1)) - 1; }
  bool isNan(uint8_t v) const {
    const int e = (v >> man_bits) & ((1 << exp_bits) - 1), m = v & ((1 << man_bits) - 1);
    return finite_only ? (e == (1 << exp_bits) - 1 && m == (1 << man_bits) - 1) : (e == (1 << exp_bits) - 1 && m != 0);
  }
  // The value of a non-negative code; the code above the largest finite one gives
  // the value a next binade would have.
  double magnitude(int code) const {
    const int e = code >> man_bits, m = code & ((1 << man_bits) - 1);
    if (e == 0) return std::ldexp(static_cast<double>(m), 1 - bias() - man_bits);
    return std::ldexp(1.0 + static_cast<double>(m) / (1 << man_bits), e - bias());
  }
  double toDouble(uint8_t v) const {
    if (isNan(v)) return std::numeric_limits<double>::quiet_NaN();
    const double s = (v & 0x80) ? -1.0 : 1.0;
    const int code = v & 0x7f;
    if (!finite_only && (code >> man_bits) == (1 << exp_bits) - 1) return s * INFINITY;
    return s * magnitude(code);
  }
  uint8_t fromDouble(double x) const {
    const uint8_t sign = std::signbit(x) ? 0x80 : 0;
    const uint8_t past_max = finite_only ? 0x7f : 0x7c;  // NaN / infinity
    if (std::isnan(x)) return static_cast<uint8_t>(sign | (finite_only ? 0x7f : 0x7e));
    if (std::isinf(x)) return static_cast<uint8_t>(sign | past_max);
    const double a = std::fabs(x);
    int best = 0;
    for (int code = 1; code <= past_max; ++code) {
      const double d = std::fabs(magnitude(code) - a), best_d = std::fabs(magnitude(best) - a);
      if (d < best_d || (d == best_d && (code & 1) == 0)) best = code;
    }
    return static_cast<uint8_t>(sign | best);
  }
};
const RefFloat8 kRefE4M3FN{4, 3, true};
const RefFloat8 kRefE5M2{5, 2, false};

bool refFloat8Element(const RefFloat8& f, ReduceOp op, const uint8_t* a, const uint8_t* b, const uint8_t* got) {
  const float r = refFloatOp(op, static_cast<float>(f.toDouble(*a)), static_cast<float>(f.toDouble(*b)));
  return std::isnan(r) ? f.isNan(*got) : *got == f.fromDouble(r);
}
float refBf16ToFloat(uint16_t h) { return static_cast<float>(refBf16ToDouble(h)); }

// Writes the expected element and returns whether `got` matches it (NaN
// matches any NaN of the same type).
bool refElement(DataType dtype, ReduceOp op, const uint8_t* a, const uint8_t* b, const uint8_t* got) {
  switch (dtype) {
    case DataType::kFloat16: {
      const float r = refFloatOp(op, refHalfToFloat(load<uint16_t>(a)), refHalfToFloat(load<uint16_t>(b)));
      const uint16_t g = load<uint16_t>(got);
      return std::isnan(r) ? halfIsNan(g) : g == refFloatToHalf(r);
    }
    case DataType::kBFloat16: {
      const float r = refFloatOp(op, refBf16ToFloat(load<uint16_t>(a)), refBf16ToFloat(load<uint16_t>(b)));
      const uint16_t g = load<uint16_t>(got);
      return std::isnan(r) ? bf16IsNan(g) : g == refFloatToBf16(r);
    }
    case DataType::kFloat32:
      return sameFloat(refFloatOp(op, load<float>(a), load<float>(b)), load<float>(got));
    case DataType::kFloat64: {
      const double r = refFloatOp(op, load<double>(a), load<double>(b));
      const double g = load<double>(got);
      return (std::isnan(r) && std::isnan(g)) || std::memcmp(&r, &g, sizeof r) == 0;
    }
    case DataType::kInt8:
      return refIntOp(op, load<int8_t>(a), load<int8_t>(b)) == load<int8_t>(got);
    case DataType::kUInt8:
      return refIntOp(op, load<uint8_t>(a), load<uint8_t>(b)) == load<uint8_t>(got);
    case DataType::kInt32:
      return refIntOp(op, load<int32_t>(a), load<int32_t>(b)) == load<int32_t>(got);
    case DataType::kInt64:
      return refIntOp(op, load<int64_t>(a), load<int64_t>(b)) == load<int64_t>(got);
    case DataType::kBool:
      return refBoolOp(op, *a, *b) == *got;
    case DataType::kInt16:
      return refIntOp(op, load<int16_t>(a), load<int16_t>(b)) == load<int16_t>(got);
    case DataType::kUInt16:
      return refIntOp(op, load<uint16_t>(a), load<uint16_t>(b)) == load<uint16_t>(got);
    case DataType::kUInt32:
      return refIntOp(op, load<uint32_t>(a), load<uint32_t>(b)) == load<uint32_t>(got);
    case DataType::kUInt64:
      return refIntOp(op, load<uint64_t>(a), load<uint64_t>(b)) == load<uint64_t>(got);
    case DataType::kFloat8E4M3FN:
      return refFloat8Element(kRefE4M3FN, op, a, b, got);
    case DataType::kFloat8E5M2:
      return refFloat8Element(kRefE5M2, op, a, b, got);
  }
  return false;
}

// ---------------------------------------------------------------------------
// Random inputs per dtype: moderate values (so sums/products stay finite and
// interesting) mixed with specials (NaN, inf, signed zero, subnormals).

float randomFloatValue() {
  const uint64_t r = randomBits();
  switch (r % 16) {
    case 0:
      return std::numeric_limits<float>::quiet_NaN();
    case 1:
      return (r & 16) ? INFINITY : -INFINITY;
    case 2:
      return (r & 16) ? 0.0f : -0.0f;
    case 3:
      return bitsToFloat(static_cast<uint32_t>(r >> 20));  // any bit pattern
    default: {
      std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
      return dist(gRng);
    }
  }
}

void fillRandom(DataType dtype, uint8_t* p, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    switch (dtype) {
      case DataType::kFloat16: {
        const uint64_t r = randomBits();
        store<uint16_t>(p + 2 * i, (r & 3) == 0 ? static_cast<uint16_t>(r >> 16) : floatToHalf(randomFloatValue()));
        break;
      }
      case DataType::kBFloat16: {
        const uint64_t r = randomBits();
        store<uint16_t>(p + 2 * i, (r & 3) == 0 ? static_cast<uint16_t>(r >> 16) : floatToBfloat16(randomFloatValue()));
        break;
      }
      case DataType::kFloat32:
        store<float>(p + 4 * i, randomFloatValue());
        break;
      case DataType::kFloat64: {
        const uint64_t r = randomBits();
        store<double>(p + 8 * i, (r & 7) == 0 ? load<double>(reinterpret_cast<const uint8_t*>(&r))
                                              : double(randomFloatValue()) * 1.000123);
        break;
      }
      case DataType::kBool: {
        static const uint8_t kBytes[] = {0, 1, 0, 1, 2, 255, 0x80, 0};
        p[i] = kBytes[randomBits() % 8];
        break;
      }
      default: {
        const uint64_t r = randomBits();
        std::memcpy(p + elementSize(dtype) * i, &r, elementSize(dtype));  // full range
        break;
      }
    }
  }
}

std::string comboName(DataType dtype, ReduceOp op, size_t count) {
  return std::string(dataTypeName(dtype)) + "/" + reduceOpName(op) + "/n=" + std::to_string(count);
}

bool throwsInvalidArgument(DataType dtype, ReduceOp op) {
  uint8_t a[8] = {}, b[8] = {}, out[8] = {};
  try {
    reduceInto(out, a, b, 1, dtype, op);
  } catch (const RcollError& e) {
    return e.kind() == ErrorKind::kInvalidArgument && std::string(e.what()).size() > 0;
  }
  return false;
}

// One dtype x op x size: out-of-place, then in place (out == a), on buffers
// offset by one element so the kernels see non-vector-aligned pointers.
void checkCombo(DataType dtype, ReduceOp op, size_t count) {
  const size_t es = elementSize(dtype);
  const size_t bytes = (count + 1) * es;
  std::vector<uint8_t> abuf(bytes), bbuf(bytes), outbuf(bytes), inplace(bytes);
  fillRandom(dtype, abuf.data(), count + 1);
  fillRandom(dtype, bbuf.data(), count + 1);
  for (size_t offset : {size_t{0}, es}) {
    const uint8_t* a = abuf.data() + offset;
    const uint8_t* b = bbuf.data() + offset;
    uint8_t* out = outbuf.data() + offset;
    reduceInto(count ? out : nullptr, count ? a : nullptr, count ? b : nullptr, count, dtype, op);
    std::memcpy(inplace.data(), abuf.data(), bytes);
    uint8_t* io = inplace.data() + offset;
    reduceInto(io, io, b, count, dtype, op);
    size_t bad = 0;
    for (size_t i = 0; i < count; ++i) {
      const size_t at = i * es;
      const bool ok = refElement(dtype, op, a + at, b + at, out + at) && refElement(dtype, op, a + at, b + at, io + at);
      if (!ok && ++bad == 1) {
        check(false, comboName(dtype, op, count) + " offset " + std::to_string(offset) + " first mismatch at " +
                         std::to_string(i));
      }
    }
  }
}

void testAllCombos() {
  for (int d = 0; d < kNumDataTypes; ++d) {
    for (int o = 0; o < kNumReduceOps; ++o) {
      const auto dtype = static_cast<DataType>(d);
      const auto op = static_cast<ReduceOp>(o);
      if (!reduceUnsupportedReason(dtype, op).empty()) {
        check(throwsInvalidArgument(dtype, op), "expected throw: " + comboName(dtype, op, 1));
        continue;
      }
      for (size_t count : {0, 1, 7, 300, 1000, 4099}) checkCombo(dtype, op, count);
    }
  }
  // Out-of-range enum values are refused too (they may come off the wire).
  check(throwsInvalidArgument(static_cast<DataType>(kNumDataTypes), ReduceOp::kSum), "bad dtype throws");
  check(throwsInvalidArgument(DataType::kFloat32, static_cast<ReduceOp>(kNumReduceOps)), "bad op throws");
}

// ---------------------------------------------------------------------------
// Targeted cases.

template <typename T>
std::vector<T> reduceVec(const std::vector<T>& a, const std::vector<T>& b, DataType dtype, ReduceOp op) {
  std::vector<T> out(a.size());
  reduceInto(out.data(), a.data(), b.data(), a.size(), dtype, op);
  return out;
}

void testNanPropagation() {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
    const std::string name = reduceOpName(op);
    // Repeated so the vector body, not only the scalar tail, sees NaNs.
    std::vector<float> a, b;
    for (int rep = 0; rep < 8; ++rep) {
      a.insert(a.end(), {nan, 1.0f, nan, -INFINITY, INFINITY});
      b.insert(b.end(), {1.0f, nan, nan, nan, nan});
    }
    for (float v : reduceVec(a, b, DataType::kFloat32, op)) check(std::isnan(v), "f32 NaN " + name);

    std::vector<double> ad(a.begin(), a.end()), bd(b.begin(), b.end());
    for (double v : reduceVec(ad, bd, DataType::kFloat64, op)) check(std::isnan(v), "f64 NaN " + name);

    std::vector<uint16_t> ah, bh, ab, bb;
    for (size_t i = 0; i < a.size(); ++i) {
      ah.push_back(floatToHalf(a[i]));
      bh.push_back(floatToHalf(b[i]));
      ab.push_back(floatToBfloat16(a[i]));
      bb.push_back(floatToBfloat16(b[i]));
    }
    for (uint16_t v : reduceVec(ah, bh, DataType::kFloat16, op)) check(halfIsNan(v), "f16 NaN " + name);
    for (uint16_t v : reduceVec(ab, bb, DataType::kBFloat16, op)) check(bf16IsNan(v), "bf16 NaN " + name);
  }
  // Ties keep the first operand (visible only with signed zeros). This is our
  // choice, not a numpy contract: numpy's float16 loops keep the first operand
  // and its SIMD float32/float64 loops the second.
  const std::vector<float> z1(16, 0.0f), z2(16, -0.0f);
  check(!std::signbit(reduceVec(z1, z2, DataType::kFloat32, ReduceOp::kMin)[3]), "min(+0,-0)");
  check(std::signbit(reduceVec(z2, z1, DataType::kFloat32, ReduceOp::kMax)[3]), "max(-0,+0)");
}

void testIntegerWrap() {
  const std::vector<int8_t> a8(20, 127), b8(20, 1);
  check(reduceVec(a8, b8, DataType::kInt8, ReduceOp::kSum)[5] == -128, "int8 127+1");
  const std::vector<int8_t> m8(20, -128), n8(20, -1);
  check(reduceVec(m8, n8, DataType::kInt8, ReduceOp::kProd)[5] == -128, "int8 -128*-1");
  check(reduceVec(m8, n8, DataType::kInt8, ReduceOp::kMin)[5] == -128, "int8 min signed");
  const std::vector<uint8_t> u8(20, 255), v8(20, 2);
  check(reduceVec(u8, v8, DataType::kUInt8, ReduceOp::kSum)[5] == 1, "uint8 255+2");
  check(reduceVec(u8, v8, DataType::kUInt8, ReduceOp::kProd)[5] == 254, "uint8 255*2");
  check(reduceVec(u8, v8, DataType::kUInt8, ReduceOp::kMax)[5] == 255, "uint8 max unsigned");
  const std::vector<int32_t> a32(20, INT32_MAX), b32(20, 1);
  check(reduceVec(a32, b32, DataType::kInt32, ReduceOp::kSum)[5] == INT32_MIN, "int32 wrap");
  const std::vector<int32_t> c32(20, 65536);
  check(reduceVec(c32, c32, DataType::kInt32, ReduceOp::kProd)[5] == 0, "int32 mul wrap");
  const std::vector<int64_t> a64(20, INT64_MAX), b64(20, 1);
  check(reduceVec(a64, b64, DataType::kInt64, ReduceOp::kSum)[5] == INT64_MIN, "int64 wrap");
  const std::vector<int64_t> c64(20, int64_t{1} << 32), d64(20, -(int64_t{1} << 32) - 1);
  check(reduceVec(c64, c64, DataType::kInt64, ReduceOp::kProd)[5] == 0, "int64 mul wrap");
  check(reduceVec(c64, d64, DataType::kInt64, ReduceOp::kMin)[5] == d64[0], "int64 min signed");
}

void testBoolNormalisation() {
  // 2 & 4 would be 0 bitwise and 2 ^ 4 would be 6: bool must act on truth values.
  const std::vector<uint8_t> a(40, 2), b(40, 4), zero(40, 0);
  check(reduceVec(a, zero, DataType::kBool, ReduceOp::kSum)[7] == 1, "bool 2|0");
  check(reduceVec(a, zero, DataType::kBool, ReduceOp::kProd)[7] == 0, "bool 2&0");
  check(reduceVec(a, b, DataType::kBool, ReduceOp::kBand)[7] == 1, "bool 2&4");
  check(reduceVec(a, b, DataType::kBool, ReduceOp::kMin)[7] == 1, "bool min(2,4)");
  check(reduceVec(a, b, DataType::kBool, ReduceOp::kBxor)[7] == 0, "bool 2^4");
  check(reduceVec(a, b, DataType::kBool, ReduceOp::kMax)[7] == 1, "bool max(2,4)");
  check(reduceVec(a, zero, DataType::kBool, ReduceOp::kBxor)[7] == 1, "bool 2^0");
}

void testScaleDivide() {
  const size_t sizes[] = {0, 1, 7, 300, 1000};
  for (size_t divisor : {size_t{1}, size_t{3}, size_t{7}, size_t{8}, size_t{96}}) {
    for (size_t count : sizes) {
      const std::string what = "/n=" + std::to_string(count) + "/div=" + std::to_string(divisor);
      std::vector<uint8_t> buf;

      buf.resize(count * 4);
      fillRandom(DataType::kFloat32, buf.data(), count);
      std::vector<float> f(count);
      copyBytes(f.data(), buf.data(), buf.size());
      scaleDivide(f.data(), count, DataType::kFloat32, divisor);
      for (size_t i = 0; i < count; ++i) {
        check(sameFloat(f[i], load<float>(&buf[4 * i]) / float(divisor)), "scale f32" + what);
      }

      buf.resize(count * 8);
      fillRandom(DataType::kFloat64, buf.data(), count);
      std::vector<double> d(count);
      copyBytes(d.data(), buf.data(), buf.size());
      scaleDivide(d.data(), count, DataType::kFloat64, divisor);
      for (size_t i = 0; i < count; ++i) {
        const double want = load<double>(&buf[8 * i]) / double(divisor);
        check((std::isnan(want) && std::isnan(d[i])) || std::memcmp(&want, &d[i], 8) == 0, "scale f64" + what);
      }

      for (DataType dt : {DataType::kFloat16, DataType::kBFloat16}) {
        const bool isHalf = dt == DataType::kFloat16;
        buf.resize(count * 2);
        fillRandom(dt, buf.data(), count);
        std::vector<uint16_t> h(count);
        copyBytes(h.data(), buf.data(), buf.size());
        scaleDivide(h.data(), count, dt, divisor);
        for (size_t i = 0; i < count; ++i) {
          const uint16_t in = load<uint16_t>(&buf[2 * i]);
          const float q = (isHalf ? refHalfToFloat(in) : refBf16ToFloat(in)) / float(divisor);
          const bool ok = std::isnan(q) ? (isHalf ? halfIsNan(h[i]) : bf16IsNan(h[i]))
                                        : h[i] == (isHalf ? refFloatToHalf(q) : refFloatToBf16(q));
          check(ok, std::string("scale ") + dataTypeName(dt) + what);
        }
      }
    }
  }
  // avg = sum then one divide: (1 + 2) / 2 = 1.5 exactly.
  std::vector<float> a(10, 1.0f), b(10, 2.0f);
  reduceInto(a.data(), a.data(), b.data(), a.size(), DataType::kFloat32, ReduceOp::kAvg);
  scaleDivide(a.data(), a.size(), DataType::kFloat32, 2);
  check(a[9] == 1.5f, "avg f32");

  auto throwsOn = [](DataType dt, size_t divisor) {
    uint8_t buf[8] = {};
    try {
      scaleDivide(buf, 1, dt, divisor);
    } catch (const RcollError& e) {
      return e.kind() == ErrorKind::kInvalidArgument;
    }
    return false;
  };
  for (DataType dt : {DataType::kInt8, DataType::kUInt8, DataType::kInt32, DataType::kInt64, DataType::kBool}) {
    check(throwsOn(dt, 2), std::string("scaleDivide refuses ") + dataTypeName(dt));
  }
  check(throwsOn(DataType::kFloat32, 0), "scaleDivide refuses divisor 0");
}

// The float16/bfloat16 kernels have a portable path and, on x86-64 with AVX2
// and F16C, a vectorized one: every 16-bit value against a spread of partners,
// for every op, must give the same bits on both.
void testHalfPathsAgree() {
  std::mt19937 rng(7);
  const size_t n = 65536 * 4;
  std::vector<uint16_t> a(n), b(n), portable(n), fast(n);
  for (size_t i = 0; i < n; ++i) {
    a[i] = static_cast<uint16_t>(i);  // every value, four times
    b[i] = static_cast<uint16_t>(rng());
  }
  for (DataType dtype : {DataType::kFloat16, DataType::kBFloat16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kAvg}) {
      forcePortableHalfKernels(true);
      reduceInto(portable.data(), a.data(), b.data(), n, dtype, op);
      forcePortableHalfKernels(false);
      reduceInto(fast.data(), a.data(), b.data(), n, dtype, op);
      // IEEE 754 leaves open which payload a NaN op NaN returns, and the
      // compiler may swap the operands of a commutative add or multiply: only
      // there may the two paths differ, and then only in the payload.
      auto isNan = [dtype](uint16_t v) {
        return dtype == DataType::kFloat16 ? (v & 0x7fffu) > 0x7c00u : (v & 0x7fffu) > 0x7f80u;
      };
      size_t bad = 0;
      for (size_t i = 0; i < n; ++i) {
        if (portable[i] == fast[i]) continue;
        if (isNan(a[i]) && isNan(b[i]) && isNan(portable[i]) && isNan(fast[i])) continue;
        ++bad;
        if (bad <= 3)
          std::fprintf(stderr, "  %04x op %04x: portable %04x fast %04x\n", a[i], b[i], portable[i], fast[i]);
      }
      check(bad == 0, std::string("half paths differ: ") + dataTypeName(dtype) + " " + reduceOpName(op) + ": " +
                          std::to_string(bad) + " elements");
    }
  }
}

void runAll() {
  testHalfExhaustive();
  testBf16Exhaustive();
  testFloatToHalfRounding();
  testFloatToBf16Rounding();
  testAllCombos();
  testNanPropagation();
  testIntegerWrap();
  testBoolNormalisation();
  testScaleDivide();
}

}  // namespace

int main() {
  // The references rely on nearbyint rounding to nearest-even.
  std::fesetround(FE_TONEAREST);
  try {
    testHalfPathsAgree();
    forcePortableHalfKernels(true);  // every check once on the portable code...
    runAll();
    forcePortableHalfKernels(false);  // ...and once on the fastest this CPU has
    runAll();
  } catch (const std::exception& e) {
    check(false, std::string("unexpected exception: ") + e.what());
  }
  if (gFailures) {
    std::fprintf(stderr, "test_reduce_kernels: %d failure(s)\n", gFailures);
    return 1;
  }
  std::printf("test_reduce_kernels: all passed\n");
  return 0;
}
