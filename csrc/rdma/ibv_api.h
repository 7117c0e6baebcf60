// The libibverbs entry points rcoll calls, resolved with dlopen/dlvsym.
//
// The types are rcoll's own declarations of the verbs ABI (verbs_abi.h), so
// neither building nor importing needs rdma-core: nothing here is linked. Symbols are looked up at the version
// rdma-core exports today (IBVERBS_1.1), because libibverbs also keeps IBVERBS_1.0 compatibility versions of the same
// names with another ABI, which a plain dlsym may return. The data-path calls (post_send, post_recv, poll_cq,
// req_notify_cq) jump through the provider's table of operations (verbs_abi.h), so they need no symbol.
#pragma once

#include <string>

#include "rdma/verbs_abi.h"

namespace rcoll {

struct IbvApi {
  std::string library;  // the file that was loaded

  ibv_device** (*get_device_list)(int*);
  void (*free_device_list)(ibv_device**);
  const char* (*get_device_name)(ibv_device*);
  ibv_context* (*open_device)(ibv_device*);
  int (*close_device)(ibv_context*);
  int (*query_device)(ibv_context*, ibv_device_attr*);
  int (*query_port)(ibv_context*, uint8_t, ibv_port_attr*);
  int (*query_gid)(ibv_context*, uint8_t, int, ibv_gid*);
  ibv_pd* (*alloc_pd)(ibv_context*);
  int (*dealloc_pd)(ibv_pd*);
  ibv_mr* (*reg_mr)(ibv_pd*, void*, size_t, int);
  int (*dereg_mr)(ibv_mr*);
  ibv_comp_channel* (*create_comp_channel)(ibv_context*);
  int (*destroy_comp_channel)(ibv_comp_channel*);
  ibv_cq* (*create_cq)(ibv_context*, int, void*, ibv_comp_channel*, int);
  int (*destroy_cq)(ibv_cq*);
  int (*get_cq_event)(ibv_comp_channel*, ibv_cq**, void**);
  void (*ack_cq_events)(ibv_cq*, unsigned int);
  ibv_qp* (*create_qp)(ibv_pd*, ibv_qp_init_attr*);
  int (*modify_qp)(ibv_qp*, ibv_qp_attr*, int);
  int (*destroy_qp)(ibv_qp*);
  const char* (*wc_status_str)(ibv_wc_status);
  int (*get_async_event)(ibv_context*, ibv_async_event*);
  void (*ack_async_event)(ibv_async_event*);

  // Optional (newer rdma-core): null when the library lacks them.
  int (*query_gid_ex)(ibv_context*, uint32_t, uint32_t, ibv_gid_entry*, uint32_t, size_t);
  ibv_mr* (*reg_dmabuf_mr)(ibv_pd*, uint64_t, size_t, uint64_t, int, int);
};

// The loaded API, or null with the reason in *why (library missing, too old).
// Loads once per process; thread-safe.
const IbvApi* ibvApi(std::string* why);

}  // namespace rcoll
