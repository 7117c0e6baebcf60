// The Python module rcoll._core: a thin layer over the C++ core.
//
// Buffers cross as integer addresses plus element counts; the Python layer
// (python/rcoll) checks arrays and keeps them alive until their op completes.
// The GIL is released whenever this module blocks or data moves.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <optional>

#include "communicator.h"
#include "edge_plan.h"
#include "config.h"
#include "device_runtime.h"
#include "dtype.h"
#include "error.h"
#include "rdma/ib_device.h"
#include "socket_util.h"
#include "tcp_store.h"
#include "topology.h"
#include "python/gil.h"
#include "work.h"

namespace py = pybind11;
using namespace rcoll;
using namespace pybind11::literals;
using rcoll::python::releasingGil;
using rcoll::python::withoutGil;

namespace {

Launch launchFor(bool blocking) { return blocking ? Launch::kCallerWaits : Launch::kQueued; }

// numpy's array object starts with PyObject_HEAD and the data pointer: that
// prefix is numpy's stable ABI (PyArray_DATA reads it) in 1.x and 2.x. Reading
// it costs nanoseconds where `__array_interface__` builds a dict (microseconds,
// a real share of a small op's latency).
struct NumpyArrayPrefix {
  PyObject_HEAD char* data;
};
PyTypeObject* g_ndarray_type = nullptr;

// The blocking in-place allreduce of a plain numpy array is the op whose
// latency users measure, and the Python layer's checks (type, layout, dtype,
// op name) cost more than the op itself between local ranks. allreduce_array
// below does them on numpy's stable struct prefixes, which numpy 1.x and 2.x
// share (PyArrayObject_fields up to `flags`; PyArray_Descr up to `type_num`),
// and answers False for anything it does not recognise at a glance: the full
// Python path then handles it (and words any error).
struct NumpyArrayFields {
  PyObject_HEAD char* data;
  int nd;
  Py_ssize_t* dimensions;
  Py_ssize_t* strides;
  PyObject* base;
  PyObject* descr;
  int flags;
};
struct NumpyDescrPrefix {
  PyObject_HEAD PyTypeObject* typeobj;
  char kind;
  char type;
  char byteorder;
  char former_flags;
  int type_num;
};
constexpr int kNpyContiguousAligned = 0x0001 | 0x0100;                          // NPY_ARRAY_{C_CONTIGUOUS,ALIGNED}
constexpr int kNpyContiguousAlignedWriteable = kNpyContiguousAligned | 0x0400;  // ... and NPY_ARRAY_WRITEABLE

// numpy type number -> DataType code, -1 for the full path (bfloat16 is an extension dtype).
int fastDataType(PyObject* descr) {
  const auto* d = reinterpret_cast<const NumpyDescrPrefix*>(descr);
  if (d->byteorder == '>') return -1;  // byte-swapped
  switch (d->type_num) {
    case 0:
      return static_cast<int>(DataType::kBool);  // NPY_BOOL
    case 1:
      return static_cast<int>(DataType::kInt8);  // NPY_BYTE
    case 2:
      return static_cast<int>(DataType::kUInt8);  // NPY_UBYTE
    case 3:
      return static_cast<int>(DataType::kInt16);  // NPY_SHORT
    case 4:
      return static_cast<int>(DataType::kUInt16);  // NPY_USHORT
    case 5:
      return static_cast<int>(DataType::kInt32);  // NPY_INT
    case 6:
      return static_cast<int>(DataType::kUInt32);  // NPY_UINT
    case 7:
      return sizeof(long) == 8 ? static_cast<int>(DataType::kInt64) : -1;  // NPY_LONG
    case 8:
      return sizeof(long) == 8 ? static_cast<int>(DataType::kUInt64) : -1;  // NPY_ULONG
    case 9:
      return static_cast<int>(DataType::kInt64);  // NPY_LONGLONG
    case 10:
      return static_cast<int>(DataType::kUInt64);  // NPY_ULONGLONG
    case 11:
      return static_cast<int>(DataType::kFloat32);  // NPY_FLOAT
    case 12:
      return static_cast<int>(DataType::kFloat64);  // NPY_DOUBLE
    case 23:
      return static_cast<int>(DataType::kFloat16);  // NPY_HALF
    default:
      return -1;
  }
}

// A reduce op name ("sum", ...) -> its code, -1 for the full path (other spellings, enums).
int fastReduceOp(PyObject* op) {
  if (!PyUnicode_CheckExact(op)) return -1;
  const char* name = PyUnicode_AsUTF8(op);
  if (name == nullptr) {
    PyErr_Clear();
    return -1;
  }
  for (int i = 0; i < kNumReduceOps; ++i) {
    if (std::strcmp(name, reduceOpName(static_cast<ReduceOp>(i))) == 0) return i;
  }
  return -1;
}

std::chrono::milliseconds toMillis(double seconds) {
  if (!(seconds > 0) || std::isinf(seconds)) return std::chrono::milliseconds(0);
  return std::chrono::milliseconds(static_cast<long long>(std::ceil(seconds * 1000.0)));
}

// The fast paths' common end: the op runs with the GIL released, the caller
// waiting (it may run inline); its error, if any, is raised by wait().
template <typename Issue>
bool runBlocking(const Issue& issue) {
  withoutGil([&] { issue()->wait(std::chrono::milliseconds(-1)); });
  return true;
}

// What the fast paths need of a plain numpy array, when it is one they can take.
struct FastArray {
  char* data = nullptr;
  size_t count = 0;
  int dtype = -1;  // DataType code
};

// True when `obj` is an exact numpy array, C-contiguous and aligned (and
// writeable when `writable`), of a dtype the core knows at a glance.
bool fastArray(PyObject* obj, bool writable, FastArray* out) {
  if (Py_TYPE(obj) != g_ndarray_type) return false;  // subclasses, buffers, device arrays
  const auto* fields = reinterpret_cast<const NumpyArrayFields*>(obj);
  const int need = writable ? kNpyContiguousAlignedWriteable : kNpyContiguousAligned;
  if ((fields->flags & need) != need) return false;
  out->dtype = fastDataType(fields->descr);
  if (out->dtype < 0) return false;
  out->data = fields->data;
  out->count = 1;
  for (int i = 0; i < fields->nd; ++i) out->count *= static_cast<size_t>(fields->dimensions[i]);
  return true;
}

// A timeout argument (None or seconds) the fast paths can take without Python.
bool fastTimeout(PyObject* timeout, std::chrono::milliseconds* out) {
  double seconds = 0;
  if (timeout != Py_None) {
    seconds = PyFloat_AsDouble(timeout);
    if (seconds == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
  }
  *out = toMillis(seconds);
  return true;
}

// Python exception classes, created at import, indexed by ErrorKind.
PyObject* g_errors[7] = {};

PyObject* makeError(py::module_& m, const char* name, PyObject* base, PyObject* builtin, const char* doc) {
  py::tuple bases = builtin != nullptr ? py::tuple(py::make_tuple(py::handle(base), py::handle(builtin)))
                                       : py::tuple(py::make_tuple(py::handle(base)));
  std::string qualified = std::string("rcoll.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases.ptr(), nullptr);
  if (type == nullptr) throw py::error_already_set();
  m.attr(name) = py::handle(type);
  return type;
}

DataType toDataType(int value) {
  if (!isValidDataType(value)) throwError(ErrorKind::kInvalidArgument, "unknown dtype code " + std::to_string(value));
  return static_cast<DataType>(value);
}

ReduceOp toReduceOp(int value) {
  if (!isValidReduceOp(value)) {
    throwError(ErrorKind::kInvalidArgument, "unknown reduce op code " + std::to_string(value));
  }
  return static_cast<ReduceOp>(value);
}

// A store implemented in Python: torch.distributed's Store, or any object with
// set(key, bytes), get(key) -> bytes (blocking until the key exists) and
// add(key, int) -> int. An optional wait([keys], timedelta) bounds the wait. The
// communicator calls it from its constructor, with the GIL released, so each
// call takes the GIL back.
class PythonStore : public Store {
 public:
  explicit PythonStore(py::object store) : store_(std::move(store)) {}
  ~PythonStore() override {
    // A destructor must not take the GIL while the interpreter finalizes
    // (python/gil.h): then the reference is left to the dying interpreter.
    if (rcoll::python::interpreterFinalizing()) {
      store_.release();
      return;
    }
    py::gil_scoped_acquire gil;
    store_ = py::object();
  }

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    py::gil_scoped_acquire gil;
    call([&] { store_.attr("set")(key, py::bytes(reinterpret_cast<const char*>(value.data()), value.size())); });
  }

  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    py::gil_scoped_acquire gil;
    std::string value;
    call(
        [&] {
          if (py::hasattr(store_, "wait")) {
            auto timedelta = py::module_::import("datetime").attr("timedelta");
            py::list keys;
            keys.append(key);
            store_.attr("wait")(keys, timedelta(py::arg("milliseconds") = timeout.count()));
          }
          py::object got = store_.attr("get")(key);
          value = py::isinstance<py::str>(got) ? got.cast<std::string>() : std::string(py::bytes(got));
        },
        key);
    return std::vector<uint8_t>(value.begin(), value.end());
  }

  int64_t add(const std::string& key, int64_t delta) override {
    py::gil_scoped_acquire gil;
    int64_t result = 0;
    call([&] { result = store_.attr("add")(key, delta).cast<int64_t>(); });
    return result;
  }

 private:
  // Python errors become RcollErrors (timeouts stay timeouts) so that the
  // communicator's constructor reports them with its usual context.
  template <typename Fn>
  void call(Fn&& fn, const std::string& key = "") {
    try {
      fn();
    } catch (py::error_already_set& e) {
      bool timeout = e.matches(PyExc_TimeoutError) || std::string(e.what()).find("imeout") != std::string::npos;
      std::string what = e.what();
      throw RcollError(timeout ? ErrorKind::kTimeout : ErrorKind::kConfig,
                       "the rendezvous store raised " + what + (key.empty() ? "" : " (key '" + key + "')"));
    }
  }

  py::object store_;
};

OpKind deviceOpKind(const std::string& name) {
  static const std::pair<const char*, OpKind> kKinds[] = {
      {"allreduce", OpKind::kAllreduce}, {"allgather", OpKind::kAllgather}, {"reduce_scatter", OpKind::kReduceScatter},
      {"broadcast", OpKind::kBroadcast}, {"reduce", OpKind::kReduce},       {"gather", OpKind::kGather},
      {"scatter", OpKind::kScatter}};
  for (const auto& kind : kKinds) {
    if (name == kind.first) return kind.second;
  }
  throwError(ErrorKind::kInvalidArgument, "device_collective: unknown collective '" + name + "'");
}

const void* ptr(uintptr_t address) { return reinterpret_cast<const void*>(address); }
void* mptr(uintptr_t address) { return reinterpret_cast<void*>(address); }

// The error that ended `c`, as an instance of the exception class of its kind; None while it is healthy.
py::object communicatorError(const Communicator& c) {
  const std::string message = c.poisonMessage();
  if (message.empty()) return py::none();
  return py::reinterpret_borrow<py::object>(g_errors[static_cast<int>(c.poisonKind())])(message);
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "rcoll C++ core (internal: use the rcoll package)";

  g_ndarray_type =
      reinterpret_cast<PyTypeObject*>(py::object(py::module_::import("numpy").attr("ndarray")).release().ptr());
  m.def(
      "array_address",
      [](py::handle array) -> uintptr_t {
        if (!PyObject_TypeCheck(array.ptr(), g_ndarray_type)) throw py::type_error("array_address: not a numpy array");
        return reinterpret_cast<uintptr_t>(reinterpret_cast<NumpyArrayPrefix*>(array.ptr())->data);
      },
      "The data pointer of a numpy array (its first element).");

  PyObject* base =
      makeError(m, "RcollError", PyExc_RuntimeError, nullptr, "Base class of every error raised by rcoll.");
  g_errors[static_cast<int>(ErrorKind::kGeneric)] = base;
  g_errors[static_cast<int>(ErrorKind::kTimeout)] =
      makeError(m, "TimeoutError", base, PyExc_TimeoutError, "A peer did not answer within the timeout.");
  g_errors[static_cast<int>(ErrorKind::kPeer)] =
      makeError(m, "PeerError", base, nullptr, "A peer died, closed its connection or failed.");
  g_errors[static_cast<int>(ErrorKind::kMismatch)] =
      makeError(m, "MismatchError", base, nullptr, "Ranks called different collectives (op, count, dtype, root).");
  g_errors[static_cast<int>(ErrorKind::kConfig)] =
      makeError(m, "ConfigError", base, nullptr, "Bad RCOLL_* variable or rendezvous set-up.");
  g_errors[static_cast<int>(ErrorKind::kInvalidArgument)] =
      makeError(m, "InvalidArgumentError", base, PyExc_ValueError, "Bad buffer, dtype, reduce op or size.");
  g_errors[static_cast<int>(ErrorKind::kAborted)] =
      makeError(m, "AbortedError", base, nullptr, "The communicator was aborted or shut down.");

  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const RcollError& e) {
      PyErr_SetString(g_errors[static_cast<int>(e.kind())], e.what());
    }
  });

  // Codes shared with the Python layer's dtype/op tables.
  py::dict dtypes, ops;
  for (int i = 0; i < kNumDataTypes; ++i) dtypes[dataTypeName(static_cast<DataType>(i))] = i;
  for (int i = 0; i < kNumReduceOps; ++i) ops[reduceOpName(static_cast<ReduceOp>(i))] = i;
  m.attr("DTYPES") = dtypes;
  m.attr("REDUCE_OPS") = ops;
  m.def("reduce_unsupported_reason",
        [](int dtype, int op) { return reduceUnsupportedReason(toDataType(dtype), toReduceOp(op)); });

  m.def(
      "config_vars",
      [] {
        std::vector<std::tuple<std::string, std::string, std::string>> out;
        for (const ConfigVar& v : configVars()) out.emplace_back(v.name, v.default_value, v.meaning);
        return out;
      },
      "Every RCOLL_* variable: (name, default, meaning).");

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
        return d;
      },
      py::arg("overrides") = Settings{},
      "The settings the Python layer reads, as the core parses them (`overrides` first, then the environment): "
      "connect_timeout, timeout, shutdown_timeout (seconds) and device_runtime (a module name). Raises ConfigError "
      "on a bad value.");

  m.def(
      "host_identity",
      [] {
        Config config = Config::fromEnvironment();
        return py::make_tuple(hostIdentity(config), !config.host_id.empty());
      },
      "This rank's host identity for the per-edge transport choice, and whether RCOLL_HOSTID set it.");

  m.def(
      "source_address_for",
      [](const std::string& host) {
        std::string address = sourceAddressFor(host);
        return address.empty() ? std::string("127.0.0.1") : address;
      },
      "The local IPv4 address that routes to `host` (127.0.0.1 if none does).");

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

  // The calls rendezvous makes, the same on every store (a shrink agrees on its survivors through them).
  py::class_<Store, std::shared_ptr<Store>>(m, "Store")
      .def("set",
           [](Store& s, const std::string& key, const py::bytes& value) {
             std::string v = value;
             withoutGil([&] { s.set(key, std::vector<uint8_t>(v.begin(), v.end())); });
           })
      .def(
          "get",
          [](Store& s, const std::string& key, double timeout) {
            std::vector<uint8_t> v = withoutGil([&] { return s.get(key, toMillis(timeout)); });
            return py::bytes(reinterpret_cast<const char*>(v.data()), v.size());
          },
          "Blocks until `key` exists (raises rcoll.TimeoutError after `timeout` seconds).")
      .def("add", releasingGil(&Store::add));
  py::class_<PythonStore, Store, std::shared_ptr<PythonStore>>(m, "PythonStore")
      .def(py::init<py::object>(), py::arg("store"),
           "Adapts a Python store (torch.distributed.Store or set/get/add duck type) for rendezvous.");

  py::class_<TcpStoreServer>(m, "TcpStoreServer")
      .def(py::init(releasingGil(
               [](const std::string& host, int port) { return std::make_unique<TcpStoreServer>(host, port); })),
           py::arg("host"), py::arg("port"))
      .def_property_readonly("port", &TcpStoreServer::port);

  py::class_<TcpStoreClient, Store, std::shared_ptr<TcpStoreClient>>(m, "TcpStore")
      .def(py::init(releasingGil([](const std::string& host, int port, double timeout) {
             return std::make_shared<TcpStoreClient>(host, port, toMillis(timeout));
           })),
           py::arg("host"), py::arg("port"), py::arg("timeout"))
      .def("check", releasingGil(&TcpStoreClient::check))
      .def_property_readonly("local_address", &TcpStoreClient::localAddress);

  py::class_<CompletionQueue, std::shared_ptr<CompletionQueue>>(m, "CompletionQueue")
      .def(py::init<>())
      .def(
          "pop",
          [](CompletionQueue& q, double timeout) -> std::optional<uint64_t> {
            uint64_t token = 0;
            const bool got = withoutGil(
                [&] { return q.pop(&token, std::chrono::milliseconds(static_cast<long long>(timeout * 1000))); });
            return got ? std::optional<uint64_t>(token) : std::nullopt;
          },
          py::arg("timeout"), "Next finished work's token, or None after `timeout` seconds or once closed.")
      .def("close", &CompletionQueue::close, "Wakes every pop(); later ones return None at once.")
      .def_property_readonly("closed", &CompletionQueue::closed);

  py::class_<Work, std::shared_ptr<Work>>(m, "Work")
      .def("notify", &Work::notifyOnCompletion, py::arg("queue"), py::arg("token"),
           "Push `token` to `queue` when done; False if already done.")
      .def(
          "wait",
          [](Work& w, std::optional<double> timeout) {
            auto limit = timeout ? std::chrono::milliseconds(static_cast<long long>(std::max(0.0, *timeout) * 1000))
                                 : std::chrono::milliseconds(-1);
            return withoutGil([&] { return w.wait(limit); });
          },
          py::arg("timeout") = py::none())
      .def(
          "stream_wait",
          [](Work& w, uintptr_t stream) {
            if (!w.deviceCompletion()) return false;
            w.deviceCompletion()->streamWait(mptr(stream),
                                             strFormat("op #%llu", static_cast<unsigned long long>(w.seq())));
            return true;
          },
          py::arg("stream"),
          "Device ops: work queued on `stream` after this call waits for the op's completion event (no host "
          "wait). False for host ops, which have no event.")
      .def_property_readonly(
          "device", [](const Work& w) { return w.deviceCompletion() ? w.deviceCompletion()->device() : -1; },
          "The device of a device op, -1 for host ops.")
      .def("is_completed", &Work::isCompleted)
      .def(
          "succeeded", [](const Work& w) { return w.isCompleted() && !w.failed(); },
          "Completed without an error (one call for the small-op paths).")
      .def("failed", &Work::failed)
      .def("error_message", &Work::errorMessage)
      .def_property_readonly("seq", &Work::seq)
      .def_property_readonly("source_rank", &Work::sourceRank,
                             "recv: the sender (known once a receive from any source has matched), else -1.");

  py::class_<Communicator, std::shared_ptr<Communicator>>(m, "Communicator")
      .def(py::init(releasingGil([](std::shared_ptr<Store> store, int rank, int size, const std::string& name,
                                    double timeout, const std::string& bind_hint, const Settings& settings) {
             CommunicatorOptions options;
             options.name = name;
             options.timeout = toMillis(timeout);
             options.bind_hint = bind_hint;
             options.settings = settings;
             return std::make_shared<Communicator>(std::move(store), rank, size, options);
           })),
           py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("name") = "default", py::arg("timeout") = 0.0,
           py::arg("bind_hint") = "", py::arg("settings") = Settings{})
      .def_property_readonly("rank", &Communicator::rank)
      .def_property_readonly("size", &Communicator::size)
      .def_property_readonly("transport", &Communicator::transportName)
      .def_property_readonly("transports", &Communicator::transports)
      .def_property_readonly(
          "topology",
          [](const Communicator& c) {
            const Topology& t = c.topology();
            py::dict d;
            d["hosts"] = t.ranks_on_host;
            d["host_of"] = t.host_of;
            d["local_rank"] = t.local_rank;
            d["host_order"] = t.host_order;
            d["text"] = t.describe();
            d["algorithms"] = c.algorithms();
            return d;
          },
          "Where the ranks are (topology.h): hosts (each host's ranks), host_of, local_rank, host_order (the "
          "rings' order), text (\"2 hosts: [0 2] [1 3]\") and algorithms (which ones the collectives use, "
          "and why); every rank computes the same.")
      .def_property_readonly("device_path", &Communicator::devicePath)
      .def_property_readonly("timeout", [](const Communicator& c) { return c.defaultTimeout().count() / 1000.0; })
      .def_property_readonly("chunk_bytes", [](const Communicator& c) { return c.config().chunk_bytes; })
      // The collectives validate and enqueue. With blocking=True the caller is
      // about to wait, so the op may run right here (Launch::kCallerWaits): the
      // GIL is released for the call either way.
      .def("allreduce",
           releasingGil([](Communicator& c, uintptr_t send, uintptr_t recv, size_t count, int dtype, int op,
                           double timeout, bool blocking) {
             return c.allreduce(ptr(send), mptr(recv), count, toDataType(dtype), toReduceOp(op), toMillis(timeout),
                                launchFor(blocking));
           }),
           "send"_a, "recv"_a, "count"_a, "dtype"_a, "op"_a, "timeout"_a, "blocking"_a = false)
      .def(
          "allreduce_array",
          [](Communicator& c, py::handle array, py::handle op, py::handle timeout) -> bool {
            FastArray a;
            std::chrono::milliseconds limit;
            const int op_code = fastReduceOp(op.ptr());
            if (op_code < 0 || !fastArray(array.ptr(), true, &a) || !fastTimeout(timeout.ptr(), &limit)) return false;
            return runBlocking([&] {
              return c.allreduce(a.data, a.data, a.count, static_cast<DataType>(a.dtype),
                                 static_cast<ReduceOp>(op_code), limit, Launch::kCallerWaits);
            });
          },
          "array"_a, "op"_a, "timeout"_a,
          "Blocking in-place allreduce of a plain numpy array; False (nothing done) when the array, op or "
          "timeout needs the full Python path.")
      // The same one-call path for the other collectives users time: blocking,
      // plain numpy arrays of one dtype and matching sizes, else False.
      .def(
          "broadcast_array",
          [](Communicator& c, py::handle array, py::handle root, py::handle timeout) -> bool {
            FastArray a;
            std::chrono::milliseconds limit;
            if (!PyLong_CheckExact(root.ptr())) return false;
            const long r = PyLong_AsLong(root.ptr());
            if (r < 0 || r >= c.size()) {  // (-1 also when it overflowed) the full path words the error
              PyErr_Clear();
              return false;
            }
            if (!fastArray(array.ptr(), r != c.rank(), &a) || !fastTimeout(timeout.ptr(), &limit)) return false;
            return runBlocking([&] {
              return c.broadcast(a.data, a.data, a.count, static_cast<DataType>(a.dtype), static_cast<int>(r), limit,
                                 Launch::kCallerWaits);
            });
          },
          "array"_a, "root"_a, "timeout"_a,
          "Blocking in-place broadcast of a plain numpy array; False (nothing done) when it needs the full path.")
      .def(
          "allgather_arrays",
          [](Communicator& c, py::handle array, py::handle out, py::handle timeout) -> bool {
            FastArray src, dst;
            std::chrono::milliseconds limit;
            if (!fastArray(array.ptr(), false, &src) || !fastArray(out.ptr(), true, &dst) || src.dtype != dst.dtype ||
                dst.count != src.count * static_cast<size_t>(c.size()) || !fastTimeout(timeout.ptr(), &limit)) {
              return false;
            }
            return runBlocking([&] {
              return c.allgather(src.data, dst.data, src.count, static_cast<DataType>(src.dtype), limit,
                                 Launch::kCallerWaits);
            });
          },
          "array"_a, "out"_a, "timeout"_a,
          "Blocking allgather of plain numpy arrays into `out`; False (nothing done) when they need the full path.")
      .def(
          "reduce_scatter_arrays",
          [](Communicator& c, py::handle array, py::handle out, py::handle op, py::handle timeout) -> bool {
            FastArray src, dst;
            std::chrono::milliseconds limit;
            const int op_code = fastReduceOp(op.ptr());
            if (op_code < 0 || !fastArray(array.ptr(), false, &src) || !fastArray(out.ptr(), true, &dst) ||
                src.dtype != dst.dtype || src.count != dst.count * static_cast<size_t>(c.size()) ||
                !fastTimeout(timeout.ptr(), &limit)) {
              return false;
            }
            return runBlocking([&] {
              return c.reduceScatter(src.data, dst.data, dst.count, static_cast<DataType>(src.dtype),
                                     static_cast<ReduceOp>(op_code), limit, Launch::kCallerWaits);
            });
          },
          "array"_a, "out"_a, "op"_a, "timeout"_a,
          "Blocking reduce-scatter of plain numpy arrays into `out`; False (nothing done) when they need the full "
          "path.")
      .def("allgather",
           releasingGil([](Communicator& c, uintptr_t send, uintptr_t recv, size_t count, int dtype, double timeout,
                           bool blocking) {
             return c.allgather(ptr(send), mptr(recv), count, toDataType(dtype), toMillis(timeout),
                                launchFor(blocking));
           }),
           "send"_a, "recv"_a, "count"_a, "dtype"_a, "timeout"_a, "blocking"_a = false)
      .def("reduce_scatter",
           releasingGil([](Communicator& c, uintptr_t send, uintptr_t recv, size_t count, int dtype, int op,
                           double timeout, bool blocking) {
             return c.reduceScatter(ptr(send), mptr(recv), count, toDataType(dtype), toReduceOp(op), toMillis(timeout),
                                    launchFor(blocking));
           }),
           "send"_a, "recv"_a, "count"_a, "dtype"_a, "op"_a, "timeout"_a, "blocking"_a = false)
      .def("broadcast",
           releasingGil([](Communicator& c, uintptr_t send, uintptr_t recv, size_t count, int dtype, int root,
                           double timeout, bool blocking) {
             return c.broadcast(ptr(send), mptr(recv), count, toDataType(dtype), root, toMillis(timeout),
                                launchFor(blocking));
           }),
           "send"_a, "recv"_a, "count"_a, "dtype"_a, "root"_a, "timeout"_a, "blocking"_a = false)
      .def("barrier", releasingGil([](Communicator& c, double timeout, bool blocking) {
             return c.barrier(toMillis(timeout), launchFor(blocking));
           }),
           "timeout"_a, "blocking"_a = false)
      .def("reduce",
           releasingGil([](Communicator& c, uintptr_t send, uintptr_t recv, size_t count, int dtype, int op, int root,
                           double timeout, bool blocking) {
             return c.reduce(ptr(send), mptr(recv), count, toDataType(dtype), toReduceOp(op), root, toMillis(timeout),
                             launchFor(blocking));
           }),
           "send"_a, "recv"_a, "count"_a, "dtype"_a, "op"_a, "root"_a, "timeout"_a, "blocking"_a = false)
      .def("gather",
           releasingGil([](Communicator& c, uintptr_t send, uintptr_t recv, size_t count, int dtype, int root,
                           double timeout, bool blocking) {
             return c.gather(ptr(send), mptr(recv), count, toDataType(dtype), root, toMillis(timeout),
                             launchFor(blocking));
           }),
           "send"_a, "recv"_a, "count"_a, "dtype"_a, "root"_a, "timeout"_a, "blocking"_a = false)
      .def("scatter",
           releasingGil([](Communicator& c, uintptr_t send, uintptr_t recv, size_t count, int dtype, int root,
                           double timeout, bool blocking) {
             return c.scatter(ptr(send), mptr(recv), count, toDataType(dtype), root, toMillis(timeout),
                              launchFor(blocking));
           }),
           "send"_a, "recv"_a, "count"_a, "dtype"_a, "root"_a, "timeout"_a, "blocking"_a = false)
      .def("alltoall",
           releasingGil([](Communicator& c, uintptr_t send, uintptr_t recv, const std::vector<int64_t>& send_counts,
                           const std::vector<int64_t>& send_displs, const std::vector<int64_t>& recv_counts,
                           const std::vector<int64_t>& recv_displs, int dtype, double timeout, bool blocking) {
             return c.allToAll(ptr(send), mptr(recv), send_counts, send_displs, recv_counts, recv_displs,
                               toDataType(dtype), toMillis(timeout), launchFor(blocking));
           }),
           "send"_a, "recv"_a, "send_counts"_a, "send_displs"_a, "recv_counts"_a, "recv_displs"_a, "dtype"_a,
           "timeout"_a, "blocking"_a = false,
           "alltoallv: counts and displacements in elements, one per rank (lists of ints).")
      .def(
          "device_alltoall",
          [](Communicator& c, uintptr_t send, uintptr_t recv, const std::vector<int64_t>& send_counts,
             const std::vector<int64_t>& send_displs, const std::vector<int64_t>& recv_counts,
             const std::vector<int64_t>& recv_displs, int dtype, double timeout, int device, uintptr_t stream) {
            DeviceOpArgs args;
            args.device = device;
            args.stream = mptr(stream);
            return c.allToAll(ptr(send), mptr(recv), send_counts, send_displs, recv_counts, recv_displs,
                              toDataType(dtype), toMillis(timeout), Launch::kQueued, &args);
          },
          "send"_a, "recv"_a, "send_counts"_a, "send_displs"_a, "recv_counts"_a, "recv_displs"_a, "dtype"_a,
          "timeout"_a, "device"_a, "stream"_a,
          "alltoallv on device buffers, ordered after the work queued on `stream` (see device_collective).")
      .def(
          "device_collective",
          [](Communicator& c, const std::string& kind, uintptr_t send, uintptr_t recv, size_t count, int dtype, int op,
             int root, double timeout, int device, uintptr_t stream) {
            DeviceOpArgs args;
            args.device = device;
            args.stream = mptr(stream);
            return c.deviceCollective(deviceOpKind(kind), ptr(send), mptr(recv), count, toDataType(dtype),
                                      toReduceOp(op), root, args, toMillis(timeout));
          },
          py::arg("kind"), py::arg("send"), py::arg("recv"), py::arg("count"), py::arg("dtype"), py::arg("op"),
          py::arg("root"), py::arg("timeout"), py::arg("device"), py::arg("stream"),
          "A collective on device buffers (allreduce, allgather, reduce_scatter, broadcast, reduce, gather, "
          "scatter), ordered after the work queued on `stream` (0: the legacy default stream).")
      .def("send",
           [](Communicator& c, uintptr_t data, size_t count, int dtype, int peer, int tag, double timeout) {
             return c.send(ptr(data), count, toDataType(dtype), peer, tag, toMillis(timeout));
           })
      .def(
          "recv",
          [](Communicator& c, uintptr_t data, size_t count, int dtype, std::optional<int> peer, int tag,
             double timeout) {
            return peer ? c.recv(mptr(data), count, toDataType(dtype), *peer, tag, toMillis(timeout))
                        : c.recvFromAny(mptr(data), count, toDataType(dtype), tag, toMillis(timeout));
          },
          "peer None: from the first rank with an unclaimed message of this tag (Work.source_rank names it).")
      .def("abort", releasingGil(&Communicator::abort), py::arg("reason") = "")
      .def("shutdown", releasingGil([](Communicator& c, double grace) { c.shutdown(toMillis(grace)); }),
           py::arg("grace") = 0.0)
      .def("poison_message", &Communicator::poisonMessage)
      .def_property_readonly("lost_peers", &Communicator::lostPeers)
      .def_property_readonly("rendezvous_prefix", &Communicator::rendezvousPrefix)
      .def("error", &communicatorError,
           "The error that ended this communicator, as an rcoll.RcollError instance; None while it is healthy.")
      .def_property_readonly("caches_registrations", &Communicator::cachesRegistrations)
      .def("invalidate_memory", releasingGil([](Communicator& c, uintptr_t data, size_t bytes) {
             c.invalidateMemory(reinterpret_cast<const void*>(data), bytes);
           }),
           "Drops cached RDMA registrations of memory that is being freed.");
}
