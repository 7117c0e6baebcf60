// The device API table (csrc/device_api.h) over the CUDA runtime: what
// rcoll._core's staging executor calls to move segments between GPU memory
// and pinned host slots and to reduce them on the GPU.
//
// rcoll._cuda hands rcollCudaDeviceApi() to _core as a capsule; _core never
// links CUDA. Functions that create something for a given device switch to it
// and back, so the calling thread's current device (torch's) is left alone.
#include <cuda.h>  // driver API types only: the driver is reached through cudart's entry points
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>

#include "cuda_reduce.h"
#include "device_api.h"
#include "status.h"

namespace rcoll {
namespace cuda {
namespace {

int check(cudaError_t error, const char* what) {
  return error == cudaSuccess ? RCOLL_CUDA_SUCCESS : failCuda(error, what);
}

// Runs `fn` with `device` current, restoring the caller's device afterwards.
template <typename Fn>
int onDevice(int device, const char* what, Fn&& fn) {
  int previous = 0;
  cudaError_t error = cudaGetDevice(&previous);
  if (error == cudaSuccess && previous != device) error = cudaSetDevice(device);
  if (error != cudaSuccess) return failCuda(error, what);
  const cudaError_t result = fn();
  if (previous != device) (void)cudaSetDevice(previous);
  return check(result, what);
}

cudaStream_t asStream(void* stream) { return static_cast<cudaStream_t>(stream); }

int setDevice(int device) { return check(cudaSetDevice(device), "cudaSetDevice"); }

int pointerDevice(const void* ptr, int* device) {
  cudaPointerAttributes attributes{};
  const cudaError_t error = cudaPointerGetAttributes(&attributes, ptr);
  if (error != cudaSuccess) return failCuda(error, "cudaPointerGetAttributes");
  if (attributes.type != cudaMemoryTypeDevice && attributes.type != cudaMemoryTypeManaged) {
    return fail(RCOLL_CUDA_INVALID_ARGUMENT, "the buffer is not CUDA device memory");
  }
  *device = attributes.device;
  return RCOLL_CUDA_SUCCESS;
}

int streamCreate(int device, void** stream) {
  cudaStream_t created = nullptr;
  // Non-blocking: rcoll's copies must not serialise with the legacy default stream.
  const int rc = onDevice(device, "cudaStreamCreateWithFlags",
                          [&] { return cudaStreamCreateWithFlags(&created, cudaStreamNonBlocking); });
  *stream = created;
  return rc;
}

int streamDestroy(void* stream) { return check(cudaStreamDestroy(asStream(stream)), "cudaStreamDestroy"); }
int streamSynchronize(void* stream) { return check(cudaStreamSynchronize(asStream(stream)), "cudaStreamSynchronize"); }

int deviceAlloc(int device, size_t bytes, void** ptr) {
  *ptr = nullptr;
  return onDevice(device, "cudaMalloc", [&] { return cudaMalloc(ptr, bytes == 0 ? 1 : bytes); });
}
int deviceFree(void* ptr) { return check(cudaFree(ptr), "cudaFree"); }

int hostAlloc(size_t bytes, void** ptr) {
  *ptr = nullptr;
  // Portable: the slots serve whichever device the communicator uses.
  return check(cudaHostAlloc(ptr, bytes == 0 ? 1 : bytes, cudaHostAllocPortable), "cudaHostAlloc");
}
int hostFree(void* ptr) { return check(cudaFreeHost(ptr), "cudaFreeHost"); }

int copyD2H(void* dst, const void* src, size_t bytes, void* stream) {
  return check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, asStream(stream)), "copy to the host");
}
int copyH2D(void* dst, const void* src, size_t bytes, void* stream) {
  return check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, asStream(stream)), "copy to the device");
}
int copyD2D(void* dst, const void* src, size_t bytes, void* stream) {
  return check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, asStream(stream)), "copy within the device");
}

int reduceAsync(void* dst, const void* a, const void* b, size_t count, int dtype, int op, void* stream) {
  return rcollCudaReduce(dst, a, b, count, dtype, op, stream);
}
int scaleDivideAsync(void* buf, size_t count, int dtype, size_t divisor, void* stream) {
  return rcollCudaScaleDivide(buf, count, dtype, divisor, stream);
}

int eventCreate(int device, void** event) {
  cudaEvent_t created = nullptr;
  const int rc = onDevice(device, "cudaEventCreateWithFlags",
                          [&] { return cudaEventCreateWithFlags(&created, cudaEventDisableTiming); });
  *event = created;
  return rc;
}
int eventRecord(void* event, void* stream) {
  return check(cudaEventRecord(static_cast<cudaEvent_t>(event), asStream(stream)), "cudaEventRecord");
}
int eventQuery(void* event) {
  const cudaError_t error = cudaEventQuery(static_cast<cudaEvent_t>(event));
  if (error == cudaSuccess) return RCOLL_EVENT_DONE;
  if (error == cudaErrorNotReady) {
    (void)cudaGetLastError();  // "not ready" is an answer, not an error to report later
    return RCOLL_EVENT_PENDING;
  }
  (void)failCuda(error, "cudaEventQuery");
  return RCOLL_EVENT_FAILED;
}
int eventDestroy(void* event) { return check(cudaEventDestroy(static_cast<cudaEvent_t>(event)), "cudaEventDestroy"); }
int streamWaitEvent(void* stream, void* event) {
  return check(cudaStreamWaitEvent(asStream(stream), static_cast<cudaEvent_t>(event), 0), "cudaStreamWaitEvent");
}

const char* lastError() { return rcollCudaLastError(); }

static_assert(sizeof(cudaIpcMemHandle_t) <= RCOLL_IPC_HANDLE_BYTES, "a CUDA IPC handle fits the table's handle bytes");

int ipcHandle(void* ptr, void* handle) {
  cudaIpcMemHandle_t exported{};
  const cudaError_t error = cudaIpcGetMemHandle(&exported, ptr);
  if (error != cudaSuccess) return failCuda(error, "cudaIpcGetMemHandle");
  std::memset(handle, 0, RCOLL_IPC_HANDLE_BYTES);
  std::memcpy(handle, &exported, sizeof(exported));
  return RCOLL_CUDA_SUCCESS;
}
int ipcOpen(int device, const void* handle, void** ptr) {
  cudaIpcMemHandle_t imported{};
  std::memcpy(&imported, handle, sizeof(imported));
  *ptr = nullptr;
  // Lazy peer access: another GPU's block is reachable once mapped (NVLink or
  // PCIe peer-to-peer); the same GPU's needs none.
  return onDevice(device, "cudaIpcOpenMemHandle",
                  [&] { return cudaIpcOpenMemHandle(ptr, imported, cudaIpcMemLazyEnablePeerAccess); });
}
int ipcClose(void* ptr) { return check(cudaIpcCloseMemHandle(ptr), "cudaIpcCloseMemHandle"); }

int deviceId(int device, char* id, size_t bytes) {
  return check(cudaDeviceGetPCIBusId(id, static_cast<int>(bytes), device), "cudaDeviceGetPCIBusId");
}
int peerAccess(int device, const char* peer_id, int* access) {
  int peer = -1;
  if (cudaDeviceGetByPCIBusId(&peer, peer_id) != cudaSuccess) {
    (void)cudaGetLastError();  // an answer (not visible here), not an error to report later
    *access = RCOLL_PEER_NOT_VISIBLE;
    return RCOLL_CUDA_SUCCESS;
  }
  if (peer == device) {
    *access = RCOLL_PEER_SAME_DEVICE;
    return RCOLL_CUDA_SUCCESS;
  }
  int can = 0;
  const cudaError_t error = cudaDeviceCanAccessPeer(&can, device, peer);
  if (error != cudaSuccess) return failCuda(error, "cudaDeviceCanAccessPeer");
  *access = can != 0 ? RCOLL_PEER_ACCESS : RCOLL_PEER_NO_ACCESS;
  return RCOLL_CUDA_SUCCESS;
}

int gdrSupport(int device, int* supported) {
  *supported = 0;
  return check(cudaDeviceGetAttribute(supported, cudaDevAttrGPUDirectRDMASupported, device),
               "cudaDeviceGetAttribute(GPUDirectRDMASupported)");
}

// cuMemGetHandleForAddressRange is a driver API call (CUDA 11.7+). The driver
// is reached through cudart's entry-point lookup, so that rcoll._cuda links
// no libcuda and still imports where the driver is older.
using GetHandleForAddressRange = CUresult (*)(void*, CUdeviceptr, size_t, CUmemRangeHandleType, unsigned long long);

int dmabufExport(void* ptr, size_t bytes, int* fd, unsigned long long* offset) {
  *fd = -1;
  *offset = 0;
  static std::atomic<GetHandleForAddressRange> resolved{nullptr};
  GetHandleForAddressRange get = resolved.load();
  if (get == nullptr) {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    const cudaError_t error =
        cudaGetDriverEntryPointByVersion("cuMemGetHandleForAddressRange", &fn, 11070, cudaEnableDefault, &found);
    if (error != cudaSuccess) return failCuda(error, "looking up cuMemGetHandleForAddressRange");
    if (found != cudaDriverEntryPointSuccess || fn == nullptr) {
      return fail(RCOLL_CUDA_RUNTIME_ERROR,
                  "the NVIDIA driver lacks cuMemGetHandleForAddressRange (dma-buf export "
                  "needs driver 515 or newer)");
    }
    get = reinterpret_cast<GetHandleForAddressRange>(fn);
    resolved.store(get);
  }
  int handle = -1;
  const CUresult result =
      get(&handle, reinterpret_cast<CUdeviceptr>(ptr), bytes, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, 0);
  if (result != CUDA_SUCCESS) {
    return fail(RCOLL_CUDA_RUNTIME_ERROR,
                "cuMemGetHandleForAddressRange(DMA_BUF_FD) failed with CUresult " + std::to_string(result) +
                    " (dma-buf needs the open-source NVIDIA kernel module and a Linux kernel with dma-buf support)");
  }
  *fd = handle;
  return RCOLL_CUDA_SUCCESS;
}

int flushRdmaWrites(int device) {
  // Where the GPU can say that it needs no flush (the option bit is absent),
  // there is nothing to do: NIC writes are then ordered with the completion.
  static std::atomic<int> options[64];  // per device: 0 unknown, 1 not needed, 2 flush
  const int slot = device >= 0 && device < 64 ? device : 0;
  int known = options[slot].load();
  if (known == 0) {
    int bits = 0;
    if (cudaDeviceGetAttribute(&bits, cudaDevAttrGPUDirectRDMAFlushWritesOptions, device) != cudaSuccess) {
      (void)cudaGetLastError();
      bits = 0;
    }
    known = (bits & cudaFlushGPUDirectRDMAWritesOptionHost) != 0 ? 2 : 1;
    options[slot].store(known);
  }
  if (known == 1) return RCOLL_CUDA_SUCCESS;
  return onDevice(device, "cudaDeviceFlushGPUDirectRDMAWrites", [] {
    return cudaDeviceFlushGPUDirectRDMAWrites(cudaFlushGPUDirectRDMAWritesTargetCurrentDevice,
                                              cudaFlushGPUDirectRDMAWritesToOwner);
  });
}

const rcoll_device_api kCudaApi = {
    RCOLL_DEVICE_API_VERSION,
    "cuda",
    setDevice,
    pointerDevice,
    streamCreate,
    streamDestroy,
    streamSynchronize,
    deviceAlloc,
    deviceFree,
    hostAlloc,
    hostFree,
    copyD2H,
    copyH2D,
    copyD2D,
    reduceAsync,
    scaleDivideAsync,
    eventCreate,
    eventRecord,
    eventQuery,
    eventDestroy,
    streamWaitEvent,
    lastError,
    ipcHandle,
    ipcOpen,
    ipcClose,
    deviceId,
    peerAccess,
    gdrSupport,
    dmabufExport,
    flushRdmaWrites,
};

}  // namespace
}  // namespace cuda
}  // namespace rcoll

extern "C" const rcoll_device_api* rcollCudaDeviceApi(void) { return &rcoll::cuda::kCudaApi; }
