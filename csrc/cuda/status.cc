#include "status.h"

#include <utility>

#include "cuda_reduce.h"

namespace rcoll {
namespace cuda {
namespace {

// Per thread, like errno: two threads reducing at once must not read each
// other's message.
thread_local std::string t_lastError;

}  // namespace

int fail(int code, std::string message) {
  t_lastError = std::move(message);
  return code;
}

std::string cudaVersionText(int version) {
  return std::to_string(version / 1000) + "." + std::to_string(version % 1000 / 10);
}

int failCuda(cudaError_t error, const std::string& what) {
  (void)cudaGetLastError();
  // The runtime reports a missing driver as "driver version is insufficient";
  // say which of the two it is.
  if (error == cudaErrorInsufficientDriver) {
    int driver = 0;
    (void)cudaDriverGetVersion(&driver);
    (void)cudaGetLastError();
    if (driver == 0) {
      return fail(RCOLL_CUDA_RUNTIME_ERROR,
                  what + ": no CUDA driver (libcuda.so.1 could not be loaded; is the NVIDIA driver installed?)");
    }
    return fail(RCOLL_CUDA_RUNTIME_ERROR, what + ": the NVIDIA driver supports CUDA " + cudaVersionText(driver) +
                                              " but rcoll._cuda was built with CUDA " +
                                              cudaVersionText(CUDART_VERSION) +
                                              "; update the driver or rebuild rcoll with an older CUDA toolkit");
  }
  return fail(RCOLL_CUDA_RUNTIME_ERROR, what + ": " + cudaGetErrorName(error) + ": " + cudaGetErrorString(error));
}

}  // namespace cuda
}  // namespace rcoll

extern "C" const char* rcollCudaLastError(void) { return rcoll::cuda::t_lastError.c_str(); }
