// The core's side of the device API (device_api.h): which table is installed,
// errors turned into RcollErrors that name the call, and RAII for events.
//
// Nothing here knows CUDA: every call goes through the installed table, so a
// CPU-only process never has one and never pays for it.
#pragma once

#include <memory>
#include <string>

#include "device_api.h"

namespace rcoll {

using DeviceApi = rcoll_device_api;

// Installs `api` for the whole process (it must stay valid for the process's
// lifetime: a static table in the module that provides it). Throws
// RcollError(kConfig) on an unknown version or a missing function. Installing
// a different table while one is in use is refused: device memory handed to
// one runtime means nothing to another.
void installDeviceApi(const DeviceApi* api);
// The installed table, or nullptr.
const DeviceApi* installedDeviceApi();

// Throws RcollError(kGeneric) "<context>: <api->last_error()>" when rc != 0.
void deviceCheck(const DeviceApi& api, int rc, const std::string& context);

// An event of one device, destroyed with its last owner.
class DeviceEvent {
 public:
  DeviceEvent(const DeviceApi& api, int device, const std::string& context);
  ~DeviceEvent();
  DeviceEvent(const DeviceEvent&) = delete;
  DeviceEvent& operator=(const DeviceEvent&) = delete;

  void record(void* stream, const std::string& context);
  // Never blocks: true once the recorded work finished; throws "<context>: <what>:
  // <why>" if the runtime failed (the message is built only then: this is polled).
  bool done(const std::string& context, const char* what) const;
  // Makes work queued on `stream` after this call wait for the event (no host wait).
  void streamWait(void* stream, const std::string& context) const;
  int device() const { return device_; }

 private:
  const DeviceApi& api_;
  int device_;
  void* event_ = nullptr;
};

}  // namespace rcoll
