// Device queries of the C API, and the grid size of every launch.
//
// None of these creates a CUDA context (cudaGetDeviceCount and
// cudaDeviceGetAttribute do not): asking whether a GPU is there must not cost
// hundreds of MiB of device memory on GPU 0 in every process.
#include <atomic>
#include <string>

#include "cuda_reduce.h"
#include "grid.h"
#include "status.h"

#ifndef RCOLL_CUDA_BUILT_ARCHS
#define RCOLL_CUDA_BUILT_ARCHS "unknown"  // set by CMake from the arch list it compiled for
#endif

namespace rcoll {
namespace cuda {
namespace {

constexpr int kMaxDevices = 64;
constexpr unsigned kBlocksPerSm = 2048 / kThreadsPerBlock;

// SM counts per device, filled on first use (0 = not asked yet); a device's
// SM count never changes, so racing writers store the same value.
std::atomic<int> g_smCount[kMaxDevices];

}  // namespace

cudaError_t gridBlocks(size_t work, unsigned* blocks) {
  int device = 0;
  cudaError_t error = cudaGetDevice(&device);
  if (error != cudaSuccess) return error;
  int sms = device < kMaxDevices ? g_smCount[device].load(std::memory_order_relaxed) : 0;
  if (sms == 0) {
    error = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (error != cudaSuccess) return error;
    if (device < kMaxDevices) g_smCount[device].store(sms, std::memory_order_relaxed);
  }
  const size_t wanted = (work + kThreadsPerBlock - 1) / kThreadsPerBlock;
  const size_t most = static_cast<size_t>(sms) * kBlocksPerSm;
  *blocks = static_cast<unsigned>(wanted == 0 ? 1 : (wanted < most ? wanted : most));
  return cudaSuccess;
}

}  // namespace cuda
}  // namespace rcoll

using rcoll::cuda::failCuda;

extern "C" int rcollCudaDeviceCount(int* count) {
  *count = 0;
  int found = 0;
  const cudaError_t error = cudaGetDeviceCount(&found);
  if (error == cudaSuccess) {
    *count = found;
    return RCOLL_CUDA_SUCCESS;
  }
  return failCuda(error, "cudaGetDeviceCount");
}

extern "C" int rcollCudaDeviceCapability(int device, int* major, int* minor) {
  *major = 0;
  *minor = 0;
  cudaError_t error = cudaDeviceGetAttribute(major, cudaDevAttrComputeCapabilityMajor, device);
  if (error == cudaSuccess) {
    error = cudaDeviceGetAttribute(minor, cudaDevAttrComputeCapabilityMinor, device);
  }
  if (error != cudaSuccess) return failCuda(error, "device " + std::to_string(device));
  return RCOLL_CUDA_SUCCESS;
}

extern "C" int rcollCudaVersions(int* runtime, int* driver) {
  *runtime = CUDART_VERSION;
  *driver = 0;
  const cudaError_t error = cudaDriverGetVersion(driver);
  if (error != cudaSuccess) return failCuda(error, "cudaDriverGetVersion");
  return RCOLL_CUDA_SUCCESS;
}

extern "C" const char* rcollCudaBuiltArchs(void) { return RCOLL_CUDA_BUILT_ARCHS; }
