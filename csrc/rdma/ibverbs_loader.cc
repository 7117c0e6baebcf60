// Run-time loading of libibverbs (ibv_api.h): no link-time dependency, so the
// module imports on machines without rdma-core. RCOLL_IBVERBS_LIB first, then
// libibverbs.so.1, then libibverbs.so; only the entry points rcoll uses are resolved.
#include <dlfcn.h>

#include <cstdlib>
#include <vector>

#include "config.h"
#include "rdma/ibv_api.h"

namespace rcoll {

namespace {

struct Loaded {
  IbvApi api{};
  bool ok = false;
  std::string error;
};

Loaded load() {
  Loaded out;
  std::vector<std::string> candidates;
  const std::string override_path = environmentValue("RCOLL_IBVERBS_LIB");
  if (!override_path.empty()) candidates.push_back(override_path);
  candidates.push_back("libibverbs.so.1");
  candidates.push_back("libibverbs.so");
  void* handle = nullptr;
  for (const std::string& path : candidates) {
    handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) {
      out.api.library = path;
      break;
    }
    const char* why = dlerror();
    out.error += (out.error.empty() ? "" : "; ") + std::string(why ? why : path.c_str());
  }
  if (handle == nullptr) {
    out.error = "libibverbs could not be loaded (" + out.error +
                "); install rdma-core (libibverbs1 and the "
                "provider package, e.g. ibverbs-providers) or set RCOLL_IBVERBS_LIB";
    return out;
  }
  std::string missing;
  auto sym = [&](const char* name, const char* version, bool required) -> void* {
    void* p = dlvsym(handle, name, version);
    if (p == nullptr) p = dlsym(handle, name);  // a library built without symbol versions
    if (p == nullptr && required) missing += std::string(missing.empty() ? "" : ", ") + name;
    return p;
  };
  IbvApi& a = out.api;
#define RCOLL_IBV_REQUIRED(field, name) a.field = reinterpret_cast<decltype(a.field)>(sym(name, "IBVERBS_1.1", true))
  RCOLL_IBV_REQUIRED(get_device_list, "ibv_get_device_list");
  RCOLL_IBV_REQUIRED(free_device_list, "ibv_free_device_list");
  RCOLL_IBV_REQUIRED(get_device_name, "ibv_get_device_name");
  RCOLL_IBV_REQUIRED(open_device, "ibv_open_device");
  RCOLL_IBV_REQUIRED(close_device, "ibv_close_device");
  RCOLL_IBV_REQUIRED(query_device, "ibv_query_device");
  RCOLL_IBV_REQUIRED(query_port, "ibv_query_port");
  RCOLL_IBV_REQUIRED(query_gid, "ibv_query_gid");
  RCOLL_IBV_REQUIRED(alloc_pd, "ibv_alloc_pd");
  RCOLL_IBV_REQUIRED(dealloc_pd, "ibv_dealloc_pd");
  RCOLL_IBV_REQUIRED(reg_mr, "ibv_reg_mr");
  RCOLL_IBV_REQUIRED(dereg_mr, "ibv_dereg_mr");
  RCOLL_IBV_REQUIRED(create_comp_channel, "ibv_create_comp_channel");
  RCOLL_IBV_REQUIRED(destroy_comp_channel, "ibv_destroy_comp_channel");
  RCOLL_IBV_REQUIRED(create_cq, "ibv_create_cq");
  RCOLL_IBV_REQUIRED(destroy_cq, "ibv_destroy_cq");
  RCOLL_IBV_REQUIRED(get_cq_event, "ibv_get_cq_event");
  RCOLL_IBV_REQUIRED(ack_cq_events, "ibv_ack_cq_events");
  RCOLL_IBV_REQUIRED(get_async_event, "ibv_get_async_event");
  RCOLL_IBV_REQUIRED(ack_async_event, "ibv_ack_async_event");
  RCOLL_IBV_REQUIRED(create_qp, "ibv_create_qp");
  RCOLL_IBV_REQUIRED(modify_qp, "ibv_modify_qp");
  RCOLL_IBV_REQUIRED(destroy_qp, "ibv_destroy_qp");
  RCOLL_IBV_REQUIRED(wc_status_str, "ibv_wc_status_str");
#undef RCOLL_IBV_REQUIRED
  a.query_gid_ex = reinterpret_cast<decltype(a.query_gid_ex)>(sym("_ibv_query_gid_ex", "IBVERBS_1.11", false));
  a.reg_dmabuf_mr = reinterpret_cast<decltype(a.reg_dmabuf_mr)>(sym("ibv_reg_dmabuf_mr", "IBVERBS_1.12", false));
  if (!missing.empty()) {
    out.error = out.api.library + " lacks " + missing + " (rdma-core too old?)";
    return out;
  }
  out.ok = true;
  return out;
}

const Loaded& loaded() {
  static const Loaded once = load();  // thread-safe initialisation (C++11 statics)
  return once;
}

}  // namespace

const IbvApi* ibvApi(std::string* why) {
  const Loaded& l = loaded();
  if (!l.ok && why != nullptr) *why = l.error;
  return l.ok ? &l.api : nullptr;
}

}  // namespace rcoll
