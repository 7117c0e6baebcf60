// Kernel launches for the floating types: 4 dtypes x {sum (also avg), prod,
// min, max}, and avg's division. The table is in reduce_table.cuh.
#include "dispatch.h"
#include "elementwise.cuh"
#include "reduce_table.cuh"

namespace rcoll {
namespace cuda {

cudaError_t reduceFloating(void* out, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op,
                           cudaStream_t stream) {
  return visitFloatingReduce(
      dtype, op,
      [&](auto type, auto f) { return launchBinary<typename decltype(type)::type>(out, a, b, count, f, stream); },
      cudaErrorInvalidValue);
}

cudaError_t scaleDivideFloating(void* buf, size_t count, DataType dtype, size_t divisor, cudaStream_t stream) {
  return visitScaleDivide(
      dtype, divisor,
      [&](auto type, auto f) { return launchUnary<typename decltype(type)::type>(buf, count, f, stream); },
      cudaErrorInvalidValue);
}

}  // namespace cuda
}  // namespace rcoll
