// dtype x op -> kernel launch, split by dtype family into separate .cu files
// so that the instantiations compile in parallel (each is built for every arch).
//
// Callers (api.cc) validate first: these assume a supported dtype/op pair,
// aligned pointers and count > 0, and return cudaErrorInvalidValue otherwise.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "dtype.h"

namespace rcoll {
namespace cuda {

// float16, bfloat16, float32, float64 with sum/avg, prod, min, max.
cudaError_t reduceFloating(void* out, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op,
                           cudaStream_t stream);

// int8, uint8, int32, int64 with every op but avg; bool with every op but avg.
cudaError_t reduceIntegral(void* out, const void* a, const void* b, size_t count, DataType dtype, ReduceOp op,
                           cudaStream_t stream);

// buf[i] /= divisor for the floating types.
cudaError_t scaleDivideFloating(void* buf, size_t count, DataType dtype, size_t divisor, cudaStream_t stream);

}  // namespace cuda
}  // namespace rcoll
