// How the rest of the core reaches the verbs transport without seeing its
// types (verbs objects, the loader).
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
