// The one loop every CUDA kernel of rcoll runs: out[i] = f(a[i], b[i]) (or
// f(a[i]) in place), vectorized.
//
// Memory-bound code wants 16-byte loads and stores (ld.global.v4): four times
// fewer memory instructions than 4-byte ones, sixteen times fewer for bytes.
// They need 16-byte aligned addresses, and all buffers must then share the same
// offset modulo 16 for one index to be aligned everywhere. So a buffer set is
// split into a scalar head (up to the first aligned element), whole 16-byte
// packs, and a scalar tail; buffers with different offsets run scalar
// throughout (still coalesced, just more instructions). Every part is a
// grid-stride loop, so one launch of a bounded grid covers any count.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "grid.h"

namespace rcoll {
namespace cuda {

// The device compiler unrolls the per-pack loops fully (a pack is registers);
// the host compiler, which sees them for the CPU-only check, knows no such pragma.
#ifdef __CUDA_ARCH__
#define RCOLL_UNROLL _Pragma("unroll")
#else
#define RCOLL_UNROLL
#endif

constexpr size_t kPackBytes = 16;

template <typename T>
struct alignas(kPackBytes) Pack {
  static constexpr int kSize = static_cast<int>(kPackBytes / sizeof(T));
  T v[kSize];
};

// Elements [0, head) and [tailStart, count) are scalar; packs cover the rest.
struct Split {
  size_t head;
  size_t packs;
  size_t tailStart;
  size_t count;

  // The most loop iterations any one part needs, i.e. the threads worth launching.
  __host__ __device__ size_t work() const {
    size_t tail = count - tailStart;
    size_t most = head > packs ? head : packs;
    return most > tail ? most : tail;
  }
};

// Pointers must already be aligned to elementSize (checked by the caller).
inline Split splitForPacks(size_t count, size_t elementSize, std::initializer_list<const void*> pointers) {
  const uintptr_t offset = reinterpret_cast<uintptr_t>(*pointers.begin()) % kPackBytes;
  for (const void* p : pointers) {
    if (reinterpret_cast<uintptr_t>(p) % kPackBytes != offset) return Split{count, 0, count, count};
  }
  size_t head = ((kPackBytes - offset) % kPackBytes) / elementSize;
  if (head > count) head = count;
  const size_t perPack = kPackBytes / elementSize;
  const size_t packs = (count - head) / perPack;
  return Split{head, packs, head + packs * perPack, count};
}

// The loops of one thread of the grid: the thread numbered `first` of
// `stride`. __host__ too, so that a CPU-only check (host_check/) can run the
// whole grid thread by thread and compare with the CPU kernels.
//
// `out` may be `a` (or `b`) exactly: each element is read and written by the
// same thread, loads first, so no __restrict__ and no non-coherent loads.
template <typename T, typename F>
__host__ __device__ inline void binaryRange(size_t first, size_t stride, T* out, const T* a, const T* b,
                                            const Split& split, const F& f) {
  for (size_t i = first; i < split.head; i += stride) out[i] = f(a[i], b[i]);

  using P = Pack<T>;
  P* outPacks = reinterpret_cast<P*>(out + split.head);
  const P* aPacks = reinterpret_cast<const P*>(a + split.head);
  const P* bPacks = reinterpret_cast<const P*>(b + split.head);
  for (size_t i = first; i < split.packs; i += stride) {
    const P x = aPacks[i];
    const P y = bPacks[i];
    P r;
    RCOLL_UNROLL
    for (int k = 0; k < P::kSize; ++k) r.v[k] = f(x.v[k], y.v[k]);
    outPacks[i] = r;
  }

  for (size_t i = split.tailStart + first; i < split.count; i += stride) out[i] = f(a[i], b[i]);
}

template <typename T, typename F>
__host__ __device__ inline void unaryRange(size_t first, size_t stride, T* buf, const Split& split, const F& f) {
  for (size_t i = first; i < split.head; i += stride) buf[i] = f(buf[i]);

  using P = Pack<T>;
  P* packs = reinterpret_cast<P*>(buf + split.head);
  for (size_t i = first; i < split.packs; i += stride) {
    P x = packs[i];
    RCOLL_UNROLL
    for (int k = 0; k < P::kSize; ++k) x.v[k] = f(x.v[k]);
    packs[i] = x;
  }

  for (size_t i = split.tailStart + first; i < split.count; i += stride) buf[i] = f(buf[i]);
}

template <typename T, typename F>
__global__ void __launch_bounds__(kThreadsPerBlock) binaryKernel(T* out, const T* a, const T* b, Split split, F f) {
  binaryRange(static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x, static_cast<size_t>(gridDim.x) * blockDim.x,
              out, a, b, split, f);
}

template <typename T, typename F>
__global__ void __launch_bounds__(kThreadsPerBlock) unaryKernel(T* buf, Split split, F f) {
  unaryRange(static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x, static_cast<size_t>(gridDim.x) * blockDim.x,
             buf, split, f);
}

template <typename T, typename F>
cudaError_t launchBinary(void* out, const void* a, const void* b, size_t count, F f, cudaStream_t stream) {
  const Split split = splitForPacks(count, sizeof(T), {out, a, b});
  unsigned blocks = 0;
  cudaError_t error = gridBlocks(split.work(), &blocks);
  if (error != cudaSuccess) return error;
  (void)cudaGetLastError();  // drop a stale error so the check below is this launch's
  binaryKernel<T, F><<<blocks, kThreadsPerBlock, 0, stream>>>(static_cast<T*>(out), static_cast<const T*>(a),
                                                              static_cast<const T*>(b), split, f);
  return cudaGetLastError();
}

template <typename T, typename F>
cudaError_t launchUnary(void* buf, size_t count, F f, cudaStream_t stream) {
  const Split split = splitForPacks(count, sizeof(T), {buf});
  unsigned blocks = 0;
  cudaError_t error = gridBlocks(split.work(), &blocks);
  if (error != cudaSuccess) return error;
  (void)cudaGetLastError();
  unaryKernel<T, F><<<blocks, kThreadsPerBlock, 0, stream>>>(static_cast<T*>(buf), split, f);
  return cudaGetLastError();
}

}  // namespace cuda
}  // namespace rcoll
