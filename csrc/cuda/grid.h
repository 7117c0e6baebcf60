// Launch geometry shared by the kernels (elementwise.cuh) and the host code
// that sizes their grids (device.cc). Plain C++: no device code in here.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace rcoll {
namespace cuda {

constexpr int kThreadsPerBlock = 256;

// Blocks for `work` threads' worth of loop iterations on the current device:
// enough to fill every SM (8 blocks of 256 = 2048 resident threads each), no
// more; past that the kernels' grid-stride loops take over. At least 1.
cudaError_t gridBlocks(size_t work, unsigned* blocks);

}  // namespace cuda
}  // namespace rcoll
