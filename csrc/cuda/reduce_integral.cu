// Kernel launches for int8, uint8, int32, int64 (every op but avg) and bool.
// The table is in reduce_table.cuh: 3 unsigned widths x 5 ops + 4 signed types
// x {min, max} + 3 bool kernels.
#include "dispatch.h"
#include "elementwise.cuh"
#include "reduce_table.cuh"

namespace rcoll {
namespace cuda {

cudaError_t reduceIntegral(void* out, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op,
                           cudaStream_t stream) {
  return visitIntegralReduce(
      dtype, op,
      [&](auto type, auto f) { return launchBinary<typename decltype(type)::type>(out, a, b, count, f, stream); },
      cudaErrorInvalidValue);
}

}  // namespace cuda
}  // namespace rcoll
