// rcollCudaReduce / rcollCudaScaleDivide: argument checks, then dispatch.
//
// Everything a caller can get wrong is checked here on the host, before any
// CUDA call: a misaligned or overlapping pointer would otherwise fault inside
// the kernel, and a fault poisons the whole CUDA context (the caller's torch
// tensors included), not just this call.
#include <cstdint>
#include <string>

#include "cuda_reduce.h"
#include "dispatch.h"
#include "dtype.h"
#include "status.h"

namespace rcoll {
namespace cuda {
namespace {

int invalid(const std::string& message) { return fail(RCOLL_CUDA_INVALID_ARGUMENT, message); }

int checkDataType(int dtype, const char* what) {
  if (!isValidDataType(dtype)) {
    return invalid(std::string(what) + ": unknown dtype code " + std::to_string(dtype));
  }
  return RCOLL_CUDA_SUCCESS;
}

int checkBuffer(const void* p, const char* name, size_t count, size_t elementSize, const char* what) {
  if (count == 0) return RCOLL_CUDA_SUCCESS;
  if (p == nullptr) return invalid(std::string(what) + ": " + name + " is null");
  if (reinterpret_cast<uintptr_t>(p) % elementSize != 0) {
    return invalid(std::string(what) + ": " + name + " is not aligned to its " + std::to_string(elementSize) +
                   "-byte elements");
  }
  return RCOLL_CUDA_SUCCESS;
}

// Exactly equal is fine (in place); a partial overlap would let one thread
// overwrite an input element another thread has not read yet.
bool overlapsPartially(const void* x, const void* y, size_t bytes) {
  const uintptr_t px = reinterpret_cast<uintptr_t>(x);
  const uintptr_t py = reinterpret_cast<uintptr_t>(y);
  return px != py && px < py + bytes && py < px + bytes;
}

}  // namespace
}  // namespace cuda
}  // namespace rcoll

using namespace rcoll;
using namespace rcoll::cuda;

extern "C" int rcollCudaReduce(void* dst, const void* a, const void* b, size_t count, int dtype, int op, void* stream) {
  const char* what = "rcollCudaReduce";
  if (int rc = checkDataType(dtype, what)) return rc;
  if (!isValidReduceOp(op)) return invalid(std::string(what) + ": unknown reduce op code " + std::to_string(op));
  const DataType type = static_cast<DataType>(dtype);
  const ReduceOp reduceOp = static_cast<ReduceOp>(op);
  const std::string reason = reduceUnsupportedReason(type, reduceOp);
  if (!reason.empty()) return invalid(reason);

  const size_t size = elementSize(type);
  if (count > SIZE_MAX / size) return invalid(std::string(what) + ": count is too large");
  if (int rc = checkBuffer(dst, "dst", count, size, what)) return rc;
  if (int rc = checkBuffer(a, "a", count, size, what)) return rc;
  if (int rc = checkBuffer(b, "b", count, size, what)) return rc;
  if (count == 0) return RCOLL_CUDA_SUCCESS;
  const size_t bytes = count * size;
  if (overlapsPartially(dst, a, bytes) || overlapsPartially(dst, b, bytes)) {
    return invalid(std::string(what) + ": dst overlaps an input partially (it may only be one of them exactly)");
  }

  auto cudaStream = static_cast<cudaStream_t>(stream);
  const cudaError_t error = isFloatingPoint(type) ? reduceFloating(dst, a, b, count, type, reduceOp, cudaStream)
                                                  : reduceIntegral(dst, a, b, count, type, reduceOp, cudaStream);
  if (error != cudaSuccess) {
    return failCuda(error, std::string("reduce ") + dataTypeName(type) + " " + reduceOpName(reduceOp));
  }
  return RCOLL_CUDA_SUCCESS;
}

extern "C" int rcollCudaScaleDivide(void* buf, size_t count, int dtype, size_t divisor, void* stream) {
  const char* what = "rcollCudaScaleDivide";
  if (int rc = checkDataType(dtype, what)) return rc;
  const DataType type = static_cast<DataType>(dtype);
  if (!isFloatingPoint(type)) {
    return invalid(std::string(what) + ": needs a floating-point dtype, got " + dataTypeName(type));
  }
  if (divisor == 0) return invalid(std::string(what) + ": divisor is 0");
  const size_t size = elementSize(type);
  if (count > SIZE_MAX / size) return invalid(std::string(what) + ": count is too large");
  if (int rc = checkBuffer(buf, "buf", count, size, what)) return rc;
  if (count == 0) return RCOLL_CUDA_SUCCESS;

  const cudaError_t error = scaleDivideFloating(buf, count, type, divisor, static_cast<cudaStream_t>(stream));
  if (error != cudaSuccess) {
    return failCuda(error, std::string("scale_divide ") + dataTypeName(type));
  }
  return RCOLL_CUDA_SUCCESS;
}
