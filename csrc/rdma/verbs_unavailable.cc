// The RDMA entry points of a build made without rdma-core headers: every
// answer says so, and `auto` falls back to TCP.
#include "error.h"
#include "rdma/ib_device.h"
#include "rdma/verbs_factory.h"

namespace rcoll {

namespace {
const char* kNotBuilt = "this rcoll was built without the ibverbs transport (rdma-core headers were missing at build time)";
}

RdmaReport describeRdma(const Config&) {
  RdmaReport report;
  report.error = kNotBuilt;
  report.selection = std::string("none: ") + kNotBuilt;
  report.gpudirect = "not possible: no RDMA transport";
  return report;
}

IbPortChoice chooseIbPort(const Config&) {
  IbPortChoice choice;
  choice.why_not = kNotBuilt;
  return choice;
}

int chooseGid(const std::vector<GidDescription>&, int, std::string* reason) {
  *reason = kNotBuilt;
  return -1;
}

bool hcaFilterAccepts(const std::string&, const std::string&, int) { return false; }

std::unique_ptr<Transport> makeVerbsTransport(const ConnectInfo&, const Config&, const std::string&,
                                              const IbPortChoice&) {
  throwError(ErrorKind::kConfig, kNotBuilt);
}

}  // namespace rcoll
