// CPU reduction kernels: out[i] = a[i] (op) b[i] for every dtype x op.
//
// These are the only place in the core that knows arithmetic; algorithms call
// them on segments, transports never do. `out` may alias `a` (in-place
// accumulation); `b` never aliases `out` partially (it is a staging segment or
// another rank's block).
//
// Semantics (checked exactly against numpy by the tests):
//  - integers wrap on overflow (two's complement), like numpy;
//  - float16/bfloat16 are computed in float32 and rounded to nearest-even once;
//  - min/max propagate NaN like numpy.minimum/maximum;
//  - bool: sum/max/bor = logical or, prod/min/band = logical and, bxor = xor;
//    values are normalised to 0/1;
//  - avg reduces like sum; the caller applies scaleDivide() once at the end.
#pragma once

#include <cstddef>

#include "dtype.h"

namespace rcoll {

// Throws RcollError(kInvalidArgument) when reduceUnsupportedReason() is not "".
void reduceInto(void* out, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op);

// buf[i] = buf[i] / divisor, for the final step of avg. Floating types only:
// float16/bfloat16 divide in float32 and round once.
void scaleDivide(void* buf, size_t count, DataType dtype, size_t divisor);

// Tests only: true makes float16/bfloat16 reductions take the portable code
// even where the CPU has AVX2 and F16C, so that both paths can be compared.
void forcePortableHalfKernels(bool portable);

}  // namespace rcoll
