// RDMA device, port and GID discovery and selection (no verbs types here, so
// the bindings and `python -m rcoll info` can use it).
//
// Selection follows NCCL's conventions, because users already know them:
// RCOLL_IB_HCA is a comma-separated list of `name[:port]` entries matched as
// name prefixes (`=` before the list: exact names; `^` before it: exclude
// those), and without it the first ACTIVE port of the first device wins. On
// RoCE the GID index decides which IP/UDP encapsulation the packets get:
// RCOLL_IB_GID_INDEX wins, else the table is scanned for a RoCE v2 entry with
// an IPv4-mapped address (routable, what switches are configured for), then
// RoCE v2 IPv6, then RoCE v1; link-local (fe80::) and empty entries are
// skipped because they only work inside one L2 domain or not at all.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config.h"

namespace rcoll {

struct GidDescription {
  int index = 0;
  std::string address;  // IPv6 text form; IPv4-mapped entries print as ::ffff:a.b.c.d
  std::string type;     // "IB", "RoCE v1", "RoCE v2" or "" when unknown
  std::string netdev;   // the Ethernet device behind a RoCE GID, when known
  bool ipv4_mapped = false;
  bool link_local = false;
};

struct PortDescription {
  int port = 0;
  std::string state;  // "ACTIVE", "DOWN", ...
  bool active = false;
  std::string link_layer;  // "InfiniBand" or "Ethernet"
  int active_mtu = 0;      // bytes
  int lid = 0;
  uint64_t max_msg_size = 0;
  std::vector<GidDescription> gids;  // non-empty entries only
  int chosen_gid = -1;               // what rcoll would use (-1: none usable)
  std::string gid_reason;            // why that one, or why none
};

struct DeviceDescription {
  std::string name;
  std::string error;  // set when the device could not be opened or queried
  std::string firmware;
  uint64_t max_mr_size = 0;
  int max_qp = 0;
  int max_qp_wr = 0;
  int max_sge = 0;
  int max_cqe = 0;
  std::vector<PortDescription> ports;
};

// Everything `info` prints about RDMA on this host.
struct RdmaReport {
  bool library_loaded = false;
  std::string library;
  std::string error;  // why verbs cannot be used at all
  std::vector<DeviceDescription> devices;
  std::string selection;  // "rxe0:1 GID 1 (...)" or why nothing is selected
  std::string gpudirect;  // what GPUDirect RDMA support was found
};
RdmaReport describeRdma(const Config& config);

// The port the verbs transport would use on this host.
struct IbPortChoice {
  bool ok = false;
  std::string why_not;  // when !ok: a sentence a user can act on
  std::string device;
  int port = 0;
  int gid_index = -1;  // -1 on InfiniBand ports without GRH routing
  std::string gid_reason;
  bool ethernet = false;  // RoCE: every packet needs the GRH
};
IbPortChoice chooseIbPort(const Config& config);
// Every port the verbs transport would use (rails_transport.h): without
// RCOLL_IB_HCA the first usable one, with it every usable one it names, in
// device and port order. One entry with !ok (and why) when there is none.
std::vector<IbPortChoice> chooseIbPorts(const Config& config);

// The GID rcoll picks among `gids` (see the file comment); -1 with the reason
// in *reason when none is usable. `override_index` >= 0 is RCOLL_IB_GID_INDEX;
// `family` (AF_INET, AF_INET6 or 0 for either) is RCOLL_IB_ADDR_FAMILY.
int chooseGid(const std::vector<GidDescription>& gids, int override_index, int family, std::string* reason);

// A GID's 16 bytes: whether they hold an IPv4 address (::ffff:a.b.c.d, the
// RoCE v2 GID of an IPv4 address), and as text.
bool isIpv4MappedGid(const uint8_t* raw);
std::string gidText(const uint8_t* raw);

// True when `device`:`port` passes an RCOLL_IB_HCA filter ("" passes all).
bool hcaFilterAccepts(const std::string& filter, const std::string& device, int port);

}  // namespace rcoll
