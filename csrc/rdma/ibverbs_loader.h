// Run-time loading of libibverbs (no link-time dependency).
//
// The wheel must import on machines without rdma-core, so the verbs library is
// found with dlopen: RCOLL_IBVERBS_LIB first, then libibverbs.so.1, then
// libibverbs.so. Only the entry points rcoll uses are resolved, by name, as
// NCCL's ibvsymbols does; the verbs transport builds on this.
#pragma once

#include <string>
#include <vector>

namespace rcoll {

struct IbverbsProbe {
  bool loaded = false;
  std::string library;               // the file that was loaded
  std::string error;                 // why it could not be loaded or used
  std::vector<std::string> devices;  // names from ibv_get_device_list
};

// Loads the library (once per process) and lists the RDMA devices it sees.
IbverbsProbe probeIbverbs();

}  // namespace rcoll
