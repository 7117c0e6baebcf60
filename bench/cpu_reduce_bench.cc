// CPU reduction kernels (csrc/reduce_kernels.cc) alone: GB/s of output for a
// sum at three sizes (in L2, in L3, in memory), per dtype. Build and run:
//
//   g++ -std=c++17 -O3 -Icsrc bench/cpu_reduce_bench.cc csrc/reduce_kernels.cc csrc/dtype.cc
//       csrc/error.cc -o /tmp/cpu_reduce_bench && /tmp/cpu_reduce_bench
//
// reduce_kernels.cc picks its AVX2 paths at run time, as in the wheel.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "dtype.h"
#include "reduce_kernels.h"

int main() {
  using rcoll::DataType;
  for (DataType dt :
       {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16, DataType::kInt32}) {
    for (size_t bytes : {size_t{256} << 10, size_t{4} << 20, size_t{64} << 20}) {
      const size_t es = rcoll::elementSize(dt);
      const size_t n = bytes / es;
      std::vector<char> a(bytes, 0), b(bytes, 0), out(bytes, 0);
      for (int i = 0; i < 3; ++i) rcoll::reduceInto(out.data(), a.data(), b.data(), n, dt, rcoll::ReduceOp::kSum);
      const int iters = static_cast<int>(std::max<size_t>(3, (size_t{2} << 30) / bytes));
      const auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < iters; ++i) {
        rcoll::reduceInto(out.data(), a.data(), b.data(), n, dt, rcoll::ReduceOp::kSum);
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      std::printf("%-9s %6zu KiB  %6.2f GB/s\n", rcoll::dataTypeName(dt), bytes >> 10,
                  static_cast<double>(bytes) * iters / s / 1e9);
    }
  }
  return 0;
}
