#include "python/environment_bindings.h"

#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "config.h"
#include "device_runtime.h"
#include "edge_plan.h"
#include "error.h"
#include "log.h"
#include "net_interfaces.h"
#include "rdma/ib_device.h"
#include "socket_util.h"
#include "topology.h"

namespace py = pybind11;

namespace rcoll::python {

namespace {
const void* ptr(uintptr_t address) { return reinterpret_cast<const void*>(address); }
}  // namespace

void bindEnvironment(py::module_& m) {
  m.def(
      "config_vars",
      [] {
        std::vector<std::tuple<std::string, std::string, std::string>> out;
        for (const ConfigVar& v : configVars()) out.emplace_back(v.name, v.default_value, v.meaning);
        return out;
      },
      "Every RCOLL_* variable: (name, default, meaning).");

  m.def(
      "log",
      [](const std::string& level, const std::string& message) {
        const LogLevel l = level == "WARN" ? LogLevel::kWarn : level == "INFO" ? LogLevel::kInfo : LogLevel::kTrace;
        if (logLevel() >= l) logMessage(l, message);
      },
      py::arg("level"), py::arg("message"),
      "A line on stderr in rcoll's format at `level` (WARN, INFO or TRACE), shown when RCOLL_DEBUG lets it through.");

  m.def(
      "settings",
      [](const Settings& overrides) {
        const Config config = Config::fromEnvironment(overrides);
        auto seconds = [](std::chrono::milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; };
        py::dict d;
        d["connect_timeout"] = seconds(config.connect_timeout);
        d["timeout"] = seconds(config.timeout);
        d["shutdown_timeout"] = seconds(config.shutdown_timeout);
        d["device_runtime"] = config.device_runtime;
        d["elastic_join"] = config.elastic_join;
        d["horovod_idle_cycle"] = seconds(config.horovod_idle_cycle);
        d["watch_interval"] = seconds(config.watch_interval);
        d["trace_dir"] = config.trace_dir;
        d["stats_file"] = config.stats_file;
        d["metrics_port"] = config.metrics_port;
        d["straggler_ms"] = config.straggler_ms;
        d["slow_link_ratio"] = config.slow_link_ratio;
        return d;
      },
      py::arg("overrides") = Settings{},
      "The settings the Python layer reads, as the core parses them (`overrides` first, then the environment): "
      "connect_timeout, timeout, shutdown_timeout (seconds), device_runtime (a module name), elastic_join and "
      "horovod_idle_cycle (seconds), watch_interval (seconds), trace_dir, stats_file, metrics_port, straggler_ms and "
      "slow_link_ratio. Raises "
      "ConfigError "
      "on a bad value.");

  m.def(
      "host_identity",
      [] {
        Config config = Config::fromEnvironment();
        return py::make_tuple(hostIdentity(config), !config.host_id.empty());
      },
      "This rank's host identity for the per-edge transport choice, and whether RCOLL_HOSTID set it.");

  m.def(
      "data_interfaces",
      [](const std::string& preferred, int rank, const Settings& overrides) {
        const Config config = Config::fromEnvironment(overrides);
        const DataInterfaces chosen =
            chooseDataInterfaces(config.socket_ifname, config.socket_family, interfaceAddresses(), preferred, rank);
        py::list addresses;
        for (const InterfaceAddress& a : chosen.chosen) addresses.append(a.describe());
        py::dict d;
        d["chosen"] = addresses;
        d["why"] = chosen.why;
        return d;
      },
      py::arg("preferred") = "", py::arg("rank") = 0, py::arg("overrides") = Settings{},
      "The interfaces this rank's data sockets would use (RCOLL_SOCKET_IFNAME, RCOLL_SOCKET_FAMILY; `preferred`: "
      "the address that reaches the store, listed first): {chosen: ['eth0 192.0.2.2/24', ...], why: the INFO "
      "line}. Raises ConfigError as a communicator would.");

  m.def(
      "source_address_for",
      [](const std::string& host) {
        std::string address = sourceAddressFor(host);
        return address.empty() ? std::string("127.0.0.1") : address;
      },
      "The local address (IPv4 or IPv6) that routes to `host` (127.0.0.1 if none does).");

  m.def(
      "rdma_report",
      [] {
        RdmaReport r = describeRdma(Config::fromEnvironment());
        py::dict d;
        d["library_loaded"] = r.library_loaded;
        d["library"] = r.library;
        d["error"] = r.error;
        d["selection"] = r.selection;
        d["gpudirect"] = r.gpudirect;
        py::list devices;
        for (const DeviceDescription& dev : r.devices) {
          py::dict dd;
          dd["name"] = dev.name;
          dd["error"] = dev.error;
          dd["firmware"] = dev.firmware;
          dd["max_mr_size"] = dev.max_mr_size;
          dd["max_qp"] = dev.max_qp;
          dd["max_qp_wr"] = dev.max_qp_wr;
          dd["max_sge"] = dev.max_sge;
          dd["max_cqe"] = dev.max_cqe;
          py::list ports;
          for (const PortDescription& p : dev.ports) {
            py::dict pd;
            pd["port"] = p.port;
            pd["state"] = p.state;
            pd["active"] = p.active;
            pd["link_layer"] = p.link_layer;
            pd["active_mtu"] = p.active_mtu;
            pd["lid"] = p.lid;
            pd["max_msg_size"] = p.max_msg_size;
            pd["chosen_gid"] = p.chosen_gid;
            pd["gid_reason"] = p.gid_reason;
            py::list gids;
            for (const GidDescription& g : p.gids) {
              py::dict gd;
              gd["index"] = g.index;
              gd["address"] = g.address;
              gd["type"] = g.type;
              gd["netdev"] = g.netdev;
              gd["ipv4_mapped"] = g.ipv4_mapped;
              gd["link_local"] = g.link_local;
              gids.append(gd);
            }
            pd["gids"] = gids;
            ports.append(pd);
          }
          dd["ports"] = ports;
          devices.append(dd);
        }
        d["devices"] = devices;
        return d;
      },
      "Everything known about RDMA here: library, devices, ports, GID tables, the port and GID rcoll "
      "would use and why, and GPUDirect RDMA support.");

  // The device runtime (device_api.h): _core never loads CUDA itself; rcoll._cuda
  // hands its table over as a capsule.
  m.def(
      "set_device_api",
      [](py::capsule capsule) {
        if (std::string(capsule.name() ? capsule.name() : "") != RCOLL_DEVICE_API_CAPSULE) {
          throwError(ErrorKind::kConfig, std::string("set_device_api: expected a capsule named ") +
                                             RCOLL_DEVICE_API_CAPSULE + ", got '" +
                                             (capsule.name() ? capsule.name() : "") + "'");
        }
        installDeviceApi(capsule.get_pointer<const DeviceApi>());
      },
      py::arg("capsule"), "Installs the device runtime's function table (a capsule from rcoll._cuda).");
  m.def(
      "device_api_name",
      []() -> std::optional<std::string> {
        const DeviceApi* api = installedDeviceApi();
        return api != nullptr ? std::optional<std::string>(api->name) : std::nullopt;
      },
      "Name of the installed device runtime, or None.");
  m.def(
      "device_of_pointer",
      [](uintptr_t address) {
        const DeviceApi* api = installedDeviceApi();
        if (api == nullptr)
          throwError(ErrorKind::kInvalidArgument, "device_of_pointer: no device runtime is installed");
        int device = -1;
        deviceCheck(*api, api->pointer_device(ptr(address), &device), "device_of_pointer");
        return device;
      },
      py::arg("address"), "The device that owns device memory at `address`.");

  m.attr("COMPILER") = py::str(
#if defined(__clang__)
      "clang " __clang_version__
#elif defined(__GNUC__)
      "gcc " __VERSION__
#else
      "unknown"
#endif
  );
}

}  // namespace rcoll::python
