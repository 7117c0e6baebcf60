// Device (GPU) windows: the shared-window collectives for CUDA buffers of
// ranks on one host, through CUDA IPC.
//
// Each rank allocates one block of device memory (two slots, as its host
// window has) at its first device op that the windows carry, exports it with
// ipc_handle() into its host window's control page, and maps every peer's
// block with ipc_open(). The collectives then run the host windows' steps and
// counters (shm_collectives.h) with the data on the GPU: a rank copies its
// input into its device slot, and each rank reduces (with the device API's
// kernels) or copies straight out of the others' slots, device to device.
// Nothing crosses host memory; the host only orders the steps.
//
// Each phase of a step ends with the rank waiting for its own stream (an
// event, polled) before it publishes its counter: a peer may read a slot once
// the data is really there, and a slot is reused only after every peer's
// reads of it completed on the GPU.
//
// Set-up is agreed, so that every rank takes the same path: each publishes
// whether it exported its block, then whether it mapped all the others';
// unless all succeeded, every rank turns the device windows off and device
// ops take the pinned-host staging path (device_staging_executor.h).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "device_runtime.h"

namespace rcoll {

struct ShmDeviceWindows {
  enum class State { kUnset, kOn, kOff };

  ShmDeviceWindows(const DeviceApi& api, int device, size_t slot_bytes, size_t direct_bytes)
      : api(api), device(device), slot_bytes(slot_bytes), direct_bytes(direct_bytes) {}
  ~ShmDeviceWindows();
  ShmDeviceWindows(const ShmDeviceWindows&) = delete;
  ShmDeviceWindows& operator=(const ShmDeviceWindows&) = delete;

  // Unmaps the peers' blocks and frees this rank's (after its stream is idle).
  void release();

  const DeviceApi& api;
  const int device;
  const size_t slot_bytes;    // RCOLL_CUDA_IPC_SLOT_BYTES
  const size_t direct_bytes;  // RCOLL_CUDA_IPC_DIRECT_BYTES
  State state = State::kUnset;
  std::string why_off;                 // when kOff: the reason, for the log
  char* own = nullptr;                 // this rank's block (device_alloc)
  std::vector<char*> blocks;           // every rank's block, mapped here (own at this rank)
  void* stream = nullptr;              // every copy and kernel of the device windows
  std::unique_ptr<DeviceEvent> event;  // polled at the end of each phase
};

}  // namespace rcoll
