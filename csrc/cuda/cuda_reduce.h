/* rcoll's CUDA reductions, as a plain C API.
 *
 * No CUDA header is included here on purpose: the core, the Python bindings
 * and any future caller can include this file and link the kernels without
 * being compiled by nvcc or seeing cuda_runtime.h. Streams therefore travel as
 * void* (a cudaStream_t / CUstream; NULL is the legacy default stream).
 *
 * dtype and op are the numeric values of rcoll::DataType and rcoll::ReduceOp
 * (csrc/dtype.h), and the semantics are those of the CPU kernels
 * (csrc/reduce_kernels.h): integers wrap, float16/bfloat16 are computed in
 * float32 and rounded once, min/max propagate NaN, bool sum/max/bor are "or",
 * prod/min/band are "and", bxor is "xor" (results normalised to 0/1), avg
 * reduces like sum and rcollCudaScaleDivide() divides once at the end; avg on
 * integers and bitwise ops on floating types are refused.
 *
 * Every function returns RCOLL_CUDA_SUCCESS or an error code; the calling
 * thread's rcollCudaLastError() then says what went wrong. Argument errors are
 * detected before any CUDA call, so they are reported the same with or without
 * a GPU. Kernels are asynchronous on `stream`: the buffers must stay valid until
 * the stream reaches the kernel, and the current device must own the stream.
 */
#ifndef RCOLL_CUDA_CUDA_REDUCE_H_
#define RCOLL_CUDA_CUDA_REDUCE_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

enum {
  RCOLL_CUDA_SUCCESS = 0,
  RCOLL_CUDA_INVALID_ARGUMENT = 1, /* bad dtype/op/combination, pointer or size */
  RCOLL_CUDA_RUNTIME_ERROR = 2     /* the CUDA runtime failed (no driver, no GPU, launch...) */
};

/* dst[i] = a[i] (op) b[i] for i < count. dst may be a or b exactly, but must
 * not partially overlap either. Pointers must be aligned to the element size;
 * 16-byte loads are used where all three share their offset modulo 16. */
int rcollCudaReduce(void* dst, const void* a, const void* b, size_t count, int dtype, int op, void* stream);

/* buf[i] = buf[i] / divisor (true division, float16/bfloat16 in float32 and
 * rounded once): the final step of avg. Floating-point dtypes only. */
int rcollCudaScaleDivide(void* buf, size_t count, int dtype, size_t divisor, void* stream);

/* Visible devices. Sets *count to 0 and returns RCOLL_CUDA_RUNTIME_ERROR when
 * there is no driver, no GPU or a driver too old for this runtime. Never
 * creates a CUDA context. */
int rcollCudaDeviceCount(int* count);

/* Compute capability of `device` (e.g. 9, 0 for an H100). No context either. */
int rcollCudaDeviceCapability(int device, int* major, int* minor);

/* The CUDA runtime this was built with and the installed driver's CUDA
 * version, both as 1000 * major + 10 * minor; driver is 0 when none. */
int rcollCudaVersions(int* runtime, int* driver);

/* Code compiled in, e.g. "sm_75,sm_80,sm_86,sm_89,sm_90,compute_90":
 * sm_XY is machine code, compute_XY is PTX the driver can compile for newer GPUs. */
const char* rcollCudaBuiltArchs(void);

/* The device API table (csrc/device_api.h) over the CUDA runtime, static:
 * rcoll._cuda hands it to rcoll._core, which stages GPU buffers through it. */
struct rcoll_device_api;
const struct rcoll_device_api* rcollCudaDeviceApi(void);

/* Message of the calling thread's last failed call ("" if none yet). */
const char* rcollCudaLastError(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* RCOLL_CUDA_CUDA_REDUCE_H_ */
