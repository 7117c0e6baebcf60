// How the rest of the core reaches the verbs transport without its types, so
// that a build without rdma-core headers links the same callers
// (verbs_unavailable.cc answers "not built" there).
#pragma once

#include <memory>
#include <string>

#include "config.h"
#include "rdma/ib_device.h"
#include "transport.h"

namespace rcoll {

std::unique_ptr<Transport> makeVerbsTransport(const ConnectInfo& info, const Config& config,
                                              const std::string& bind_host, const IbPortChoice& port);

}  // namespace rcoll
