// FOR TESTS ONLY: the device API (device_api.h) implemented with host memory,
// so that the device data path (device_staging_executor.h, the stream
// handshakes of the communicator and the Python layers) runs on machines
// without a GPU.
//
// It checks the orchestration, not CUDA: "device" pointers are host pointers,
// copies are memcpy, reductions are the CPU kernels. What makes it worth
// having is that it is asynchronous like a GPU: every stream is a worker
// thread running its queue in order after a small random delay, so events
// complete late and out of order across streams, and a wrong dependency
// shows up as a wrong result or a hang rather than passing by luck.
//
// Not part of rcoll: the tests build it into the module rcoll_emulated_device
// (module.cc, built by build.py), and a rank installs it as its device runtime
// with RCOLL_DEVICE_RUNTIME=rcoll_emulated_device, the way rcoll._cuda is
// installed by default.
#pragma once

#include <cstddef>

#include "device_api.h"

namespace rcoll {
namespace testing {

const rcoll_device_api* emulatedDeviceApi();

// Test hook: after `delay_seconds`, on emulated `stream`, copy `bytes` from src
// to dst: work the caller queued before a collective, which the collective
// must wait for.
int emulatedDelayedCopy(void* stream, void* dst, const void* src, size_t bytes, double delay_seconds);

}  // namespace testing
}  // namespace rcoll
