#include "adasum_math.h"

#include <cfloat>
#include <cmath>
#include <cstdint>

#include "error.h"
#include "half.h"

namespace rcoll {

namespace {

// How each element type is read as, and written from, a double. float16 and
// bfloat16 go through float (half.h converts to and from float only): a
// double rounded to float and then to 16 bits can differ from one rounding
// by one unit in the last place in rare ties, far below what 16-bit
// gradients resolve anyway.
struct Half {
  using T = uint16_t;
  static double load(T v) { return halfToFloat(v); }
  static T store(double v) { return floatToHalf(static_cast<float>(v)); }
};
struct BFloat16 {
  using T = uint16_t;
  static double load(T v) { return bfloat16ToFloat(v); }
  static T store(double v) { return floatToBfloat16(static_cast<float>(v)); }
};
template <typename F>
struct Native {
  using T = F;
  static double load(T v) { return v; }
  static T store(double v) { return static_cast<T>(v); }
};

// Four partial sums per quantity, added at the end: the additions of one
// lane do not wait on each other's results (without -ffast-math the compiler
// may not reorder one running sum), and pairwise-ish summation loses less
// than one long running sum.
template <typename E>
DotAndNorms dotAndNormsOf(const typename E::T* a, const typename E::T* b, size_t count) {
  constexpr size_t kLanes = 4;
  double dot[kLanes] = {}, a_sq[kLanes] = {}, b_sq[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= count; i += kLanes) {
    for (size_t k = 0; k < kLanes; ++k) {
      const double x = E::load(a[i + k]), y = E::load(b[i + k]);
      dot[k] += x * y;
      a_sq[k] += x * x;
      b_sq[k] += y * y;
    }
  }
  for (; i < count; ++i) {
    const double x = E::load(a[i]), y = E::load(b[i]);
    dot[0] += x * y;
    a_sq[0] += x * x;
    b_sq[0] += y * y;
  }
  DotAndNorms out;
  out.dot = (dot[0] + dot[1]) + (dot[2] + dot[3]);
  out.a_sq = (a_sq[0] + a_sq[1]) + (a_sq[2] + a_sq[3]);
  out.b_sq = (b_sq[0] + b_sq[1]) + (b_sq[2] + b_sq[3]);
  return out;
}

template <typename E>
void scaledAddOf(typename E::T* a, double a_coeff, const typename E::T* b, double b_coeff, size_t count) {
  for (size_t i = 0; i < count; ++i) a[i] = E::store(a_coeff * E::load(a[i]) + b_coeff * E::load(b[i]));
}

// Calls fn(Element{}) with the element description of `dtype`.
template <typename Fn>
void withElement(DataType dtype, Fn&& fn) {
  switch (dtype) {
    case DataType::kFloat16:
      return fn(Half{});
    case DataType::kBFloat16:
      return fn(BFloat16{});
    case DataType::kFloat32:
      return fn(Native<float>{});
    case DataType::kFloat64:
      return fn(Native<double>{});
    default:
      break;
  }
  throwError(ErrorKind::kInvalidArgument,
             strFormat("adasum: dtype %s is not a type Adasum takes", dataTypeName(dtype)));
}

}  // namespace

bool adasumTakes(DataType dtype) {
  return dtype == DataType::kFloat16 || dtype == DataType::kBFloat16 || dtype == DataType::kFloat32 ||
         dtype == DataType::kFloat64;
}

DotAndNorms dotAndNorms(const char* a, const char* b, size_t count, DataType dtype) {
  DotAndNorms out;
  withElement(dtype, [&](auto element) {
    using E = decltype(element);
    out = dotAndNormsOf<E>(reinterpret_cast<const typename E::T*>(a), reinterpret_cast<const typename E::T*>(b), count);
  });
  return out;
}

double adasumCoefficient(double dot, double norm_sq) {
  static const double kSmallest = std::sqrt(DBL_MIN);
  // Written as Horovod writes it (dot / |v|^2 * 0.5), so that the same
  // numbers give the same coefficient.
  return norm_sq >= kSmallest ? 1.0 - dot / norm_sq * 0.5 : 1.0;
}

void scaledAdd(char* a, double a_coeff, const char* b, double b_coeff, size_t count, DataType dtype) {
  withElement(dtype, [&](auto element) {
    using E = decltype(element);
    scaledAddOf<E>(reinterpret_cast<typename E::T*>(a), a_coeff, reinterpret_cast<const typename E::T*>(b), b_coeff,
                   count);
  });
}

}  // namespace rcoll
