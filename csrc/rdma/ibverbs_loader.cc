#include "rdma/ibverbs_loader.h"

#include <dlfcn.h>

#include <cstdlib>
#include <mutex>

namespace rcoll {

namespace {

// The verbs ABI types are opaque here: only pointers to them cross this file.
struct ibv_device;
using GetDeviceListFn = ibv_device** (*)(int*);
using FreeDeviceListFn = void (*)(ibv_device**);
using GetDeviceNameFn = const char* (*)(ibv_device*);

struct Library {
  void* handle = nullptr;
  std::string path;
  std::string error;
  GetDeviceListFn get_device_list = nullptr;
  FreeDeviceListFn free_device_list = nullptr;
  GetDeviceNameFn get_device_name = nullptr;
};

Library load() {
  Library lib;
  std::vector<std::string> candidates;
  if (const char* override_path = std::getenv("RCOLL_IBVERBS_LIB")) {
    if (*override_path != '\0') candidates.push_back(override_path);
  }
  candidates.push_back("libibverbs.so.1");
  candidates.push_back("libibverbs.so");
  for (const std::string& path : candidates) {
    lib.handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (lib.handle != nullptr) {
      lib.path = path;
      break;
    }
    const char* why = dlerror();
    lib.error += (lib.error.empty() ? "" : "; ") + std::string(why ? why : path.c_str());
  }
  if (lib.handle == nullptr) return lib;
  lib.error.clear();
  // Versioned lookups as rdma-core exports them (IBVERBS_1.1), plain names as a fallback.
  auto sym = [&](const char* name) -> void* {
    void* p = dlvsym(lib.handle, name, "IBVERBS_1.1");
    return p != nullptr ? p : dlsym(lib.handle, name);
  };
  lib.get_device_list = reinterpret_cast<GetDeviceListFn>(sym("ibv_get_device_list"));
  lib.free_device_list = reinterpret_cast<FreeDeviceListFn>(sym("ibv_free_device_list"));
  lib.get_device_name = reinterpret_cast<GetDeviceNameFn>(sym("ibv_get_device_name"));
  if (!lib.get_device_list || !lib.free_device_list || !lib.get_device_name) {
    lib.error = lib.path + " lacks the ibv_get_device_list/ibv_get_device_name entry points";
  }
  return lib;
}

const Library& library() {
  static const Library lib = load();
  return lib;
}

}  // namespace

IbverbsProbe probeIbverbs() {
  const Library& lib = library();
  IbverbsProbe probe;
  probe.library = lib.path;
  probe.error = lib.error;
  probe.loaded = lib.handle != nullptr && lib.error.empty();
  if (!probe.loaded) return probe;
  int count = 0;
  ibv_device** list = lib.get_device_list(&count);
  if (list == nullptr) {
    probe.error = "ibv_get_device_list failed (is the RDMA kernel driver loaded?)";
    return probe;
  }
  for (int i = 0; i < count; ++i) probe.devices.emplace_back(lib.get_device_name(list[i]));
  lib.free_device_list(list);
  return probe;
}

}  // namespace rcoll
