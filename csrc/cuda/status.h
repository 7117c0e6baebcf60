// Error reporting shared by the C API's implementation files: each failing
// call stores a message for rcollCudaLastError() and returns its code.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

namespace rcoll {
namespace cuda {

// Records `message` for the calling thread and returns `code`.
int fail(int code, std::string message);

// RCOLL_CUDA_RUNTIME_ERROR with "<what>: <cudaErrorName>: <description>", or
// a plain explanation for a missing or too old driver. Also clears the
// runtime's per-thread last error, so a failure seen here is not reported
// again by the next, unrelated cudaGetLastError().
int failCuda(cudaError_t error, const std::string& what);

// "12.4" for 12040.
std::string cudaVersionText(int version);

}  // namespace cuda
}  // namespace rcoll
