#include "rdma/ib_device.h"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "error.h"
#include "name_filter.h"
#include "rdma/ibv_api.h"

namespace rcoll {

namespace {

std::string readSysfs(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

bool pathExists(const std::string& path) {
  struct stat st {};
  return ::stat(path.c_str(), &st) == 0;
}

const char* portStateName(ibv_port_state state) {
  switch (state) {
    case IBV_PORT_NOP:
      return "NOP";
    case IBV_PORT_DOWN:
      return "DOWN";
    case IBV_PORT_INIT:
      return "INIT";
    case IBV_PORT_ARMED:
      return "ARMED";
    case IBV_PORT_ACTIVE:
      return "ACTIVE";
    case IBV_PORT_ACTIVE_DEFER:
      return "ACTIVE_DEFER";
  }
  return "UNKNOWN";
}

int mtuBytes(ibv_mtu mtu) {
  switch (mtu) {
    case IBV_MTU_256:
      return 256;
    case IBV_MTU_512:
      return 512;
    case IBV_MTU_1024:
      return 1024;
    case IBV_MTU_2048:
      return 2048;
    case IBV_MTU_4096:
      return 4096;
  }
  return 0;
}

std::string gidType(const IbvApi& api, ibv_context* ctx, const std::string& dev, int port, int index) {
  if (api.query_gid_ex != nullptr) {
    ibv_gid_entry entry{};
    if (api.query_gid_ex(ctx, static_cast<uint32_t>(port), static_cast<uint32_t>(index), &entry, 0, sizeof(entry)) ==
        0) {
      switch (entry.gid_type) {
        case IBV_GID_TYPE_IB:
          return "IB";
        case IBV_GID_TYPE_ROCE_V1:
          return "RoCE v1";
        case IBV_GID_TYPE_ROCE_V2:
          return "RoCE v2";
      }
    }
  }
  // Older rdma-core: the kernel says it in sysfs ("RoCE v2", "IB/RoCE v1").
  std::string t = readSysfs("/sys/class/infiniband/" + dev + "/ports/" + std::to_string(port) + "/gid_attrs/types/" +
                            std::to_string(index));
  if (t == "RoCE v2") return t;
  if (t == "IB/RoCE v1") return "RoCE v1";
  return "";
}

void describePort(const IbvApi& api, ibv_context* ctx, const std::string& dev, int port_num, int override_gid,
                  int family, PortDescription* out) {
  ibv_port_attr attr{};
  out->port = port_num;
  if (api.query_port(ctx, static_cast<uint8_t>(port_num), &attr) != 0) {
    out->state = "UNKNOWN";
    out->gid_reason = "ibv_query_port failed";
    return;
  }
  out->state = portStateName(attr.state);
  out->active = attr.state == IBV_PORT_ACTIVE;
  out->link_layer = attr.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand";
  out->active_mtu = mtuBytes(attr.active_mtu);
  out->lid = attr.lid;
  out->max_msg_size = attr.max_msg_sz;
  for (int i = 0; i < attr.gid_tbl_len; ++i) {
    ibv_gid gid{};
    if (api.query_gid(ctx, static_cast<uint8_t>(port_num), i, &gid) != 0) continue;
    static const uint8_t kZero[16] = {};
    if (std::memcmp(gid.raw, kZero, sizeof(kZero)) == 0) continue;  // unused entry
    GidDescription g;
    g.index = i;
    g.address = gidText(gid.raw);
    g.ipv4_mapped = isIpv4MappedGid(gid.raw);
    g.link_local = gid.raw[0] == 0xfe && (gid.raw[1] & 0xc0) == 0x80;
    g.type = attr.link_layer == IBV_LINK_LAYER_ETHERNET ? gidType(api, ctx, dev, port_num, i) : "IB";
    g.netdev = readSysfs("/sys/class/infiniband/" + dev + "/ports/" + std::to_string(port_num) + "/gid_attrs/ndevs/" +
                         std::to_string(i));
    out->gids.push_back(g);
  }
  if (attr.link_layer == IBV_LINK_LAYER_ETHERNET) {
    out->chosen_gid = chooseGid(out->gids, override_gid, family, &out->gid_reason);
  } else {
    // InfiniBand routes by LID inside a subnet; the GRH (and so a GID) is only
    // needed across subnets, which RCOLL_IB_GID_INDEX can ask for.
    out->chosen_gid = override_gid;
    out->gid_reason = override_gid >= 0 ? "RCOLL_IB_GID_INDEX (global routing)" : "InfiniBand: LID routing, no GID";
  }
}

DeviceDescription describeDevice(const IbvApi& api, ibv_device* device, const Config& config) {
  DeviceDescription d;
  d.name = api.get_device_name(device);
  ibv_context* ctx = api.open_device(device);
  if (ctx == nullptr) {
    d.error = "ibv_open_device failed: " + std::string(std::strerror(errno));
    return d;
  }
  ibv_device_attr attr{};
  if (api.query_device(ctx, &attr) != 0) {
    d.error = "ibv_query_device failed";
  } else {
    d.firmware = attr.fw_ver;
    d.max_mr_size = attr.max_mr_size;
    d.max_qp = attr.max_qp;
    d.max_qp_wr = attr.max_qp_wr;
    d.max_sge = attr.max_sge;
    d.max_cqe = attr.max_cqe;
    for (int p = 1; p <= attr.phys_port_cnt; ++p) {
      d.ports.emplace_back();
      describePort(api, ctx, d.name, p, config.ib_gid_index, config.ib_addr_family, &d.ports.back());
    }
  }
  api.close_device(ctx);
  return d;
}

std::vector<DeviceDescription> describeAll(const IbvApi& api, const Config& config, std::string* why) {
  std::vector<DeviceDescription> out;
  int count = 0;
  ibv_device** list = api.get_device_list(&count);
  if (list == nullptr) {
    const int err = errno;
    *why = "ibv_get_device_list failed: " + std::string(std::strerror(err)) +
           (err == ENOSYS ? " (this kernel has no RDMA support: ib_uverbs is not loaded or not built)"
                          : " (is the RDMA kernel driver loaded?)");
    return out;
  }
  for (int i = 0; i < count; ++i) out.push_back(describeDevice(api, list[i], config));
  api.free_device_list(list);
  if (out.empty()) *why = "no RDMA devices (ibv_devices lists none)";
  return out;
}

std::string gpuDirectSupport(const IbvApi* api) {
  void* cuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL | RTLD_NOLOAD);
  if (cuda == nullptr) cuda = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
  const bool driver = cuda != nullptr;
  if (cuda != nullptr) dlclose(cuda);
  const bool peermem = pathExists("/sys/module/nvidia_peermem") || pathExists("/sys/kernel/mm/memory_peers/nv_mem");
  const bool dmabuf = api != nullptr && api->reg_dmabuf_mr != nullptr;
  std::string out;
  if (!driver) return "not possible: no NVIDIA driver (libcuda.so.1 not found)";
  if (dmabuf)
    out = "possible through dma-buf (ibv_reg_dmabuf_mr present; needs a GPU, driver and NIC with dma-buf support)";
  if (peermem) out += std::string(out.empty() ? "possible" : ";") + " through nvidia-peermem (module loaded)";
  if (out.empty()) out = "not possible: libibverbs lacks ibv_reg_dmabuf_mr and nvidia-peermem is not loaded";
  return out;
}

}  // namespace

bool hcaFilterAccepts(const std::string& filter, const std::string& device, int port) {
  return NameFilter(filter).accepts(device, port);
}

bool isIpv4MappedGid(const uint8_t* raw) {
  static const uint8_t kMappedPrefix[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
  return std::memcmp(raw, kMappedPrefix, sizeof(kMappedPrefix)) == 0;
}

std::string gidText(const uint8_t* raw) {
  char text[INET6_ADDRSTRLEN] = {};
  inet_ntop(AF_INET6, raw, text, sizeof(text));
  return text;
}

int chooseGid(const std::vector<GidDescription>& gids, int override_index, int family, std::string* reason) {
  if (override_index >= 0) {
    for (const GidDescription& g : gids) {
      if (g.index == override_index) {
        *reason = strFormat("RCOLL_IB_GID_INDEX=%d (%s %s)", override_index, g.type.c_str(), g.address.c_str());
        return override_index;
      }
    }
    *reason = strFormat("RCOLL_IB_GID_INDEX=%d names an empty GID table entry", override_index);
    return -1;
  }
  // Lower rank = better; link-local entries, and those of the other family
  // where RCOLL_IB_ADDR_FAMILY names one, are never chosen automatically.
  auto score = [family](const GidDescription& g) {
    if (g.link_local) return 99;
    if ((family == AF_INET && !g.ipv4_mapped) || (family == AF_INET6 && g.ipv4_mapped)) return 99;
    if (g.type == "RoCE v2") return g.ipv4_mapped ? 0 : 1;
    if (g.type == "RoCE v1") return g.ipv4_mapped ? 2 : 3;
    return 4;  // type unknown (old kernel)
  };
  const GidDescription* best = nullptr;
  for (const GidDescription& g : gids) {
    if (score(g) < 99 && (best == nullptr || score(g) < score(*best))) best = &g;
  }
  if (best == nullptr) {
    *reason = family == AF_UNSPEC
                  ? "no routable GID (only link-local or empty entries: give the RoCE netdev an IP address, "
                    "or set RCOLL_IB_GID_INDEX)"
                  : strFormat(
                        "no routable GID of RCOLL_IB_ADDR_FAMILY's family (%s: give the RoCE netdev an "
                        "address of that family, or leave RCOLL_IB_ADDR_FAMILY unset)",
                        family == AF_INET ? "IPv4" : "IPv6");
    return -1;
  }
  static const char* kWhy[] = {"RoCE v2 with an IPv4-mapped address", "RoCE v2 (IPv6)", "RoCE v1, IPv4-mapped",
                               "RoCE v1", "GID type unknown"};
  *reason = strFormat("index %d: %s %s%s%s (%s%s)", best->index, best->type.empty() ? "?" : best->type.c_str(),
                      best->address.c_str(), best->netdev.empty() ? "" : " on ", best->netdev.c_str(),
                      kWhy[score(*best)], family == AF_UNSPEC ? "" : ", RCOLL_IB_ADDR_FAMILY");
  return best->index;
}

std::vector<IbPortChoice> chooseIbPorts(const Config& config) {
  IbPortChoice failed;
  std::string why;
  const IbvApi* api = ibvApi(&why);
  if (api == nullptr) {
    failed.why_not = why;
    return {failed};
  }
  std::vector<DeviceDescription> devices = describeAll(*api, config, &why);
  if (devices.empty()) {
    failed.why_not = why;
    return {failed};
  }
  std::vector<IbPortChoice> chosen;
  std::string seen;
  for (const DeviceDescription& d : devices) {
    for (const PortDescription& p : d.ports) {
      seen += strFormat("%s%s:%d %s", seen.empty() ? "" : ", ", d.name.c_str(), p.port, p.state.c_str());
      if (!hcaFilterAccepts(config.ib_hca, d.name, p.port) || !p.active) continue;
      const bool ethernet = p.link_layer == "Ethernet";
      if (ethernet && p.chosen_gid < 0) {
        seen += " (" + p.gid_reason + ")";
        continue;
      }
      IbPortChoice choice;
      choice.ok = true;
      choice.device = d.name;
      choice.port = p.port;
      choice.gid_index = p.chosen_gid;
      choice.gid_reason = p.gid_reason;
      choice.ethernet = ethernet;
      chosen.push_back(choice);
      // Without RCOLL_IB_HCA, the first usable port; with it, every one it names.
      if (config.ib_hca.empty()) return chosen;
    }
  }
  if (!chosen.empty()) return chosen;
  failed.why_not =
      strFormat("no usable ACTIVE port%s%s (ports: %s)",
                config.ib_hca.empty() ? "" : " matching RCOLL_IB_HCA=", config.ib_hca.c_str(), seen.c_str());
  return {failed};
}

IbPortChoice chooseIbPort(const Config& config) { return chooseIbPorts(config).front(); }

RdmaReport describeRdma(const Config& config) {
  RdmaReport report;
  const IbvApi* api = ibvApi(&report.error);
  report.gpudirect = gpuDirectSupport(api);
  if (api == nullptr) {
    report.selection = "none: " + report.error;
    return report;
  }
  report.library_loaded = true;
  report.library = api->library;
  report.devices = describeAll(*api, config, &report.error);
  for (const IbPortChoice& choice : chooseIbPorts(config)) {
    if (!choice.ok) {
      report.selection = "none: " + choice.why_not;
      break;
    }
    report.selection += strFormat("%s%s:%d, GID %s", report.selection.empty() ? "" : "; ", choice.device.c_str(),
                                  choice.port, choice.gid_reason.c_str());
  }
  return report;
}

}  // namespace rcoll
