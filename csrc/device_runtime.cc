#include "device_runtime.h"

#include <atomic>

#include "error.h"

namespace rcoll {

namespace {
std::atomic<const DeviceApi*> g_api{nullptr};
}  // namespace

void installDeviceApi(const DeviceApi* api) {
  if (api == nullptr) throwError(ErrorKind::kConfig, "set_device_api: no table given");
  if (api->version != RCOLL_DEVICE_API_VERSION) {
    throwError(ErrorKind::kConfig, strFormat("set_device_api: the table is version %d but this rcoll core "
                                             "speaks version %d; install matching rcoll modules",
                                             api->version, RCOLL_DEVICE_API_VERSION));
  }
  const void* members[] = {
      reinterpret_cast<const void*>(api->set_device),         reinterpret_cast<const void*>(api->pointer_device),
      reinterpret_cast<const void*>(api->stream_create),      reinterpret_cast<const void*>(api->stream_destroy),
      reinterpret_cast<const void*>(api->stream_synchronize), reinterpret_cast<const void*>(api->device_alloc),
      reinterpret_cast<const void*>(api->device_free),        reinterpret_cast<const void*>(api->host_alloc),
      reinterpret_cast<const void*>(api->host_free),          reinterpret_cast<const void*>(api->copy_d2h_async),
      reinterpret_cast<const void*>(api->copy_h2d_async),     reinterpret_cast<const void*>(api->copy_d2d_async),
      reinterpret_cast<const void*>(api->reduce_async),       reinterpret_cast<const void*>(api->scale_divide_async),
      reinterpret_cast<const void*>(api->event_create),       reinterpret_cast<const void*>(api->event_record),
      reinterpret_cast<const void*>(api->event_query),        reinterpret_cast<const void*>(api->event_destroy),
      reinterpret_cast<const void*>(api->stream_wait_event),  reinterpret_cast<const void*>(api->last_error),
      reinterpret_cast<const void*>(api->ipc_handle),         reinterpret_cast<const void*>(api->ipc_open),
      reinterpret_cast<const void*>(api->ipc_close),          reinterpret_cast<const void*>(api->device_id),
      reinterpret_cast<const void*>(api->peer_access),        reinterpret_cast<const void*>(api->gdr_support),
      reinterpret_cast<const void*>(api->dmabuf_export),      reinterpret_cast<const void*>(api->flush_rdma_writes)};
  for (const void* member : members) {
    if (member == nullptr) throwError(ErrorKind::kConfig, "set_device_api: the table has a null function");
  }
  const DeviceApi* expected = nullptr;
  if (!g_api.compare_exchange_strong(expected, api) && expected != api) {
    throwError(ErrorKind::kConfig, strFormat("set_device_api: device API '%s' is already installed; a process "
                                             "uses one device runtime (wanted '%s')",
                                             expected->name, api->name));
  }
}

const DeviceApi* installedDeviceApi() { return g_api.load(std::memory_order_acquire); }

void deviceCheck(const DeviceApi& api, int rc, const std::string& context) {
  if (rc == 0) return;
  const char* why = api.last_error();
  throwError(ErrorKind::kGeneric, context + ": " + (why != nullptr && *why ? why : "device runtime error"));
}

DeviceEvent::DeviceEvent(const DeviceApi& api, int device, const std::string& context) : api_(api), device_(device) {
  const int rc = api_.event_create(device, &event_);
  if (rc != 0) deviceCheck(api_, rc, context + ": creating an event");
}

DeviceEvent::~DeviceEvent() {
  if (event_ != nullptr) (void)api_.event_destroy(event_);
}

void DeviceEvent::record(void* stream, const std::string& context) {
  const int rc = api_.event_record(event_, stream);
  if (rc != 0) deviceCheck(api_, rc, context + ": recording an event");
}

bool DeviceEvent::done(const std::string& context, const char* what) const {
  const int state = api_.event_query(event_);
  if (state == RCOLL_EVENT_FAILED) deviceCheck(api_, 1, context + ": " + what);
  return state == RCOLL_EVENT_DONE;
}

void DeviceEvent::streamWait(void* stream, const std::string& context) const {
  const int rc = api_.stream_wait_event(stream, event_);
  if (rc != 0) deviceCheck(api_, rc, context + ": waiting for an event on a stream");
}

}  // namespace rcoll
