/* The device API: what the core needs from a GPU runtime, as a plain C table.
 *
 * The core (rcoll._core) never links or loads CUDA. A module that does
 * (rcoll._cuda) fills this table and hands it over as a PyCapsule named
 * RCOLL_DEVICE_API_CAPSULE; `_core.set_device_api(capsule)` installs it, in the
 * spirit of NCCL's versioned net-plugin structs. RCOLL_DEVICE_RUNTIME names
 * another module with the same device_api_capsule(): the tests' host-memory
 * implementation (tests/device/emulated_device/, not part of rcoll) drives the device
 * data path on machines without a GPU.
 *
 * Pointers to device memory, streams and events are opaque (void*). Every
 * function returns 0 on success or non-zero on failure, and last_error() then
 * describes the failure of the calling thread. All functions are thread-safe.
 * Asynchronous functions enqueue work on `stream` and return at once;
 * event_query() is the only way the core learns that work finished, so the
 * progress loop never blocks on the GPU.
 *
 * Versioning: append members only, and bump RCOLL_DEVICE_API_VERSION when you
 * do; the core refuses a table whose version it does not know.
 */
#ifndef RCOLL_DEVICE_API_H_
#define RCOLL_DEVICE_API_H_

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RCOLL_DEVICE_API_VERSION 3
#define RCOLL_DEVICE_API_CAPSULE "rcoll_device_api"

/* Bytes of an inter-process memory handle (cudaIpcMemHandle_t is 64). */
#define RCOLL_IPC_HANDLE_BYTES 64
/* Bytes of a GPU identity, NUL included (a PCI bus id "0000:3b:00.0"). */
#define RCOLL_DEVICE_ID_BYTES 32

/* peer_access() answers. */
enum {
  RCOLL_PEER_SAME_DEVICE = 1, /* the peer's GPU is this one */
  RCOLL_PEER_ACCESS = 2,      /* another GPU whose memory kernels here can read (NVLink, PCIe P2P) */
  RCOLL_PEER_NOT_VISIBLE = 3, /* not a GPU of this process (CUDA_VISIBLE_DEVICES) */
  RCOLL_PEER_NO_ACCESS = 4    /* visible, but no peer-to-peer path to it */
};

enum {
  RCOLL_EVENT_DONE = 0,    /* event_query(): the work recorded before the event finished */
  RCOLL_EVENT_PENDING = 1, /* not yet */
  RCOLL_EVENT_FAILED = 2   /* the runtime failed (last_error() says why) */
};

typedef struct rcoll_device_api {
  int version;      /* RCOLL_DEVICE_API_VERSION */
  const char* name; /* "cuda", "emulated (host memory, for tests)" */

  /* Device of the calling thread for the calls that follow it (the progress
   * thread calls it before every device op). */
  int (*set_device)(int device);
  /* The device that owns `ptr` (device memory, managed, or registered host memory). */
  int (*pointer_device)(const void* ptr, int* device);

  /* Streams and device memory of `device` (the caller's current device is kept). */
  int (*stream_create)(int device, void** stream);
  int (*stream_destroy)(void* stream);
  int (*stream_synchronize)(void* stream); /* blocking: only on failure paths and shutdown */
  int (*device_alloc)(int device, size_t bytes, void** ptr);
  int (*device_free)(void* ptr);

  /* Page-locked host memory, usable by every device (cudaHostAllocPortable):
   * the staging slots that the transports send from and receive into. */
  int (*host_alloc)(size_t bytes, void** ptr);
  int (*host_free)(void* ptr);

  /* Asynchronous copies and kernels on `stream`. */
  int (*copy_d2h_async)(void* host_dst, const void* device_src, size_t bytes, void* stream);
  int (*copy_h2d_async)(void* device_dst, const void* host_src, size_t bytes, void* stream);
  int (*copy_d2d_async)(void* device_dst, const void* device_src, size_t bytes, void* stream);
  /* dst[i] = a[i] (op) b[i]; dtype and op are rcoll::DataType / ReduceOp codes
   * (csrc/dtype.h), semantics those of csrc/reduce_kernels.h. */
  int (*reduce_async)(void* dst, const void* a, const void* b, size_t count, int dtype, int op, void* stream);
  int (*scale_divide_async)(void* buf, size_t count, int dtype, size_t divisor, void* stream);

  /* Events: created for `device`, recorded on a stream of that device. */
  int (*event_create)(int device, void** event);
  int (*event_record)(void* event, void* stream);
  int (*event_query)(void* event); /* RCOLL_EVENT_DONE / _PENDING / _FAILED */
  int (*event_destroy)(void* event);
  /* Work enqueued on `stream` after this call waits for `event` (no host wait). */
  int (*stream_wait_event)(void* stream, void* event);

  /* Why the calling thread's last call failed. */
  const char* (*last_error)(void);

  /* Version 2: device memory shared between processes of one host (CUDA IPC),
   * for the shared-window collectives (csrc/cuda_ipc/cuda_ipc_collectives.cc).
   * ipc_handle() exports a block from device_alloc() (its base address) as
   * RCOLL_IPC_HANDLE_BYTES opaque bytes; another process maps it for `device`
   * with ipc_open() and unmaps it with ipc_close(). The exporter keeps the
   * block until every importer closed it. */
  int (*ipc_handle)(void* device_ptr, void* handle);
  int (*ipc_open)(int device, const void* handle, void** device_ptr);
  int (*ipc_close)(void* device_ptr);
  /* `device`'s identity as every process of the host names it (the PCI bus
   * id; device ordinals differ between processes with CUDA_VISIBLE_DEVICES),
   * and whether kernels on `device` can read the memory of the GPU named
   * `peer_id`: RCOLL_PEER_* in *access. */
  int (*device_id)(int device, char* id, size_t bytes);
  int (*peer_access)(int device, const char* peer_id, int* access);

  /* Version 3: GPUDirect RDMA (device_staging_executor.cc), the NIC reading
   * and writing device memory itself.
   * gdr_support(): whether `device` can take part at all (CUDA: the
   * GPUDirect RDMA device attribute), in *supported (0/1).
   * dmabuf_export(): a dma-buf file descriptor for [ptr, ptr + bytes) of a
   * device_alloc() block (page-aligned), for ibv_reg_dmabuf_mr; the caller
   * closes *fd. *offset is ptr's offset inside the dma-buf.
   * flush_rdma_writes(): NIC writes into `device`'s memory whose completion
   * the caller has seen become visible to device work enqueued after the call
   * (CUDA: cudaDeviceFlushGPUDirectRDMAWrites where the platform needs it). */
  int (*gdr_support)(int device, int* supported);
  int (*dmabuf_export)(void* ptr, size_t bytes, int* fd, unsigned long long* offset);
  int (*flush_rdma_writes)(int device);
} rcoll_device_api;

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* RCOLL_DEVICE_API_H_ */
