// The Python module rcoll._core: a thin layer over the C++ core.
//
// Buffers cross as integer addresses plus element counts; the Python layer
// (python/rcoll) checks arrays and keeps them alive until their op completes.
// The GIL is released whenever this module blocks or data moves.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <optional>

#include "agreed_reduce.h"
#include "communicator.h"
#include "config.h"
#include "device_runtime.h"
#include "dtype.h"
#include "error.h"
#include "op_kind.h"
#include "python/environment_bindings.h"
#include "python/gil.h"
#include "python/numpy_arrays.h"
#include "python/python_store.h"
#include "python/quick_lane.h"
#include "python/trace_bindings.h"
#include "tcp_store.h"
#include "topology.h"
#include "transport.h"
#include "work.h"

namespace py = pybind11;
using namespace rcoll;
using namespace pybind11::literals;
using rcoll::python::FastArray;
using rcoll::python::fastArray;
using rcoll::python::fastReduceOp;
using rcoll::python::fastTimeout;
using rcoll::python::PythonStore;
using rcoll::python::releasingGil;
using rcoll::python::toMillis;
using rcoll::python::withoutGil;

namespace {

Launch launchFor(bool blocking) { return blocking ? Launch::kCallerWaits : Launch::kQueued; }

// The fast path's common end: the op runs with the GIL released, the caller
// waiting (it may run inline); its error, if any, is raised by wait().
template <typename Issue>
bool runBlocking(const Issue& issue) {
  withoutGil([&] { issue()->wait(std::chrono::milliseconds(-1)); });
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

OpKind toOpKind(int value) {
  const OpTraits* traits = findOpTraits(static_cast<OpKind>(value));
  if (value < 0 || value > 255 || traits == nullptr) {
    throwError(ErrorKind::kInvalidArgument, "unknown collective code " + std::to_string(value));
  }
  return traits->kind;
}

// Where a device op's buffers are: -1 for host memory.
std::optional<DeviceOpArgs> deviceArgs(int device, uintptr_t stream) {
  if (device < 0) return std::nullopt;
  DeviceOpArgs args;
  args.device = device;
  args.stream = reinterpret_cast<void*>(stream);
  return args;
}

// The one-call path of the collectives users time: plain numpy arrays
// (numpy_arrays.h) of one dtype and matching sizes. allreduce and broadcast run
// in place (`out` None) or into `out`; allgather and reduce_scatter into `out`;
// reduce, gather and scatter as the numpy API passes them (below).
// Blocking: runs the op (on this thread when nothing is queued) and returns
// True; else returns its Work. False, having done nothing, for anything else
// (the Python layer's full path then answers).
py::object runArrays(Communicator& c, int kind, py::handle array, py::handle out, py::handle op, py::handle root,
                     py::handle timeout, bool blocking) {
  const py::object declined = py::bool_(false);
  FastArray src, dst;
  std::chrono::milliseconds limit;
  if (!fastTimeout(timeout.ptr(), &limit)) return declined;
  int op_code = 0;
  long root_rank = 0;
  size_t count = 0;
  const size_t world = static_cast<size_t>(c.size());
  // allreduce and broadcast: `out` None is in place, so the input receives.
  auto sameShaped = [&](bool src_receives) {
    if (out.is_none()) {
      if (!fastArray(array.ptr(), src_receives, &src)) return false;
      dst = src;
    } else if (!fastArray(array.ptr(), false, &src) || !fastArray(out.ptr(), true, &dst) || src.dtype != dst.dtype ||
               src.count != dst.count) {
      return false;
    }
    count = src.count;
    return true;
  };
  // Rooted ops: a root the full path need not word an error for.
  auto readRoot = [&] {
    if (!PyLong_CheckExact(root.ptr())) return false;
    root_rank = PyLong_AsLong(root.ptr());
    if (root_rank < 0 || root_rank >= c.size()) {  // (-1 also when it overflowed) the full path words the error
      PyErr_Clear();
      return false;
    }
    return true;
  };
  switch (static_cast<OpKind>(kind)) {
    case OpKind::kAllreduce:
      op_code = fastReduceOp(op.ptr());
      if (op_code < 0 || !sameShaped(true)) return declined;
      break;
    case OpKind::kBroadcast:
      if (!readRoot() || !sameShaped(root_rank != c.rank())) return declined;
      break;
    case OpKind::kAllgather:
      if (!fastArray(array.ptr(), false, &src) || !fastArray(out.ptr(), true, &dst) || src.dtype != dst.dtype ||
          dst.count != src.count * world) {
        return declined;
      }
      count = src.count;
      break;
    case OpKind::kReduceScatter:
      op_code = fastReduceOp(op.ptr());
      if (op_code < 0 || !fastArray(array.ptr(), false, &src) || !fastArray(out.ptr(), true, &dst) ||
          src.dtype != dst.dtype || src.count != dst.count * world) {
        return declined;
      }
      count = dst.count;
      break;
    // The rooted ops: only the root passes `out` (reduce, gather) or the
    // whole input (scatter); the other ranks pass None there.
    case OpKind::kReduce:
      op_code = fastReduceOp(op.ptr());
      if (op_code < 0 || !readRoot()) return declined;
      if (root_rank == c.rank()) {
        if (!sameShaped(true)) return declined;
      } else if (!out.is_none() || !fastArray(array.ptr(), false, &src)) {
        return declined;
      }
      count = src.count;
      break;
    case OpKind::kGather:
      if (!readRoot() || !fastArray(array.ptr(), false, &src)) return declined;
      if (root_rank == c.rank()
              ? !fastArray(out.ptr(), true, &dst) || src.dtype != dst.dtype || dst.count != src.count * world
              : !out.is_none()) {
        return declined;
      }
      count = src.count;
      break;
    case OpKind::kScatter:
      if (!readRoot() || !fastArray(out.ptr(), true, &dst)) return declined;
      if (root_rank == c.rank()
              ? !fastArray(array.ptr(), false, &src) || src.dtype != dst.dtype || src.count != dst.count * world
              : !array.is_none()) {
        return declined;
      }
      src.dtype = dst.dtype;
      count = dst.count;
      break;
    default:
      return declined;
  }
  auto issue = [&](Launch launch) {
    return c.collective(static_cast<OpKind>(kind), src.data, dst.data, count, static_cast<DataType>(src.dtype),
                        static_cast<ReduceOp>(op_code), static_cast<int>(root_rank), limit, launch);
  };
  if (blocking) {
    runBlocking([&] { return issue(Launch::kCallerWaits); });
    return py::bool_(true);
  }
  return py::cast(withoutGil([&] { return issue(Launch::kQueued); }));
}

const void* ptr(uintptr_t address) { return reinterpret_cast<const void*>(address); }
void* mptr(uintptr_t address) { return reinterpret_cast<void*>(address); }

// A negotiating front end's rounds (agreed_reduce.h) over its fixed offer
// and agreed buffers: bound once, then one call per round with what changes.
struct AgreedRound {
  std::shared_ptr<Communicator> comm;
  AgreedReduceArgs args;
};

// The error that ended `c`, as an instance of the exception class of its kind; None while it is healthy.
py::object communicatorError(const Communicator& c) {
  const std::string message = c.poisonMessage();
  if (message.empty()) return py::none();
  return py::reinterpret_borrow<py::object>(g_errors[static_cast<int>(c.poisonKind())])(message);
}

}  // namespace

PYBIND11_MODULE(_core, m) {
  m.doc() = "rcoll C++ core (internal: use the rcoll package)";

  rcoll::python::rememberNdarrayType(py::module_::import("numpy").attr("ndarray"));
  m.def("array_address", &rcoll::python::ndarrayAddress, "The data pointer of a numpy array (its first element).");

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
  // The op table (op_kind.h), for the front ends: one entry per collective.
  py::dict collectives;
  int rows = 0;
  const OpTraits* table = opTraitsTable(&rows);
  for (int i = 0; i < rows; ++i) {
    const OpTraits& t = table[i];
    py::dict row;
    row["code"] = static_cast<int>(t.kind);
    row["reduces"] = t.reduces;
    row["rooted"] = t.rooted;
    row["per_rank_blocks"] = t.per_rank_blocks;
    row["on_device"] = t.on_device;
    collectives[opKindName(t.kind)] = row;
  }
  m.attr("OPS") = collectives;
  m.def("reduce_unsupported_reason",
        [](int dtype, int op) { return reduceUnsupportedReason(toDataType(dtype), toReduceOp(op)); });

  rcoll::python::bindEnvironment(m);
  rcoll::python::bindFlightRecorder(m);

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
      .def_property_readonly("local_address", &TcpStoreClient::localAddress)
      .def_property_readonly("address", &TcpStoreClient::address);

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

  rcoll::python::bindQuickLane(m);

  py::class_<AgreedRound>(m, "AgreedRound")
      .def(
          "__call__",
          [](AgreedRound& r, size_t offer_bytes, int64_t tag, uintptr_t input, uintptr_t out, size_t count, int dtype,
             int op) {
            AgreedReduceArgs args = r.args;
            args.offer_bytes = offer_bytes;
            args.tag = tag;
            if (tag >= 0) {
              args.input = ptr(input);
              args.out = mptr(out);
              args.count = count;
              args.dtype = toDataType(dtype);
              args.op = toReduceOp(op);
            }
            return withoutGil([&] { return agreeAndReduce(*r.comm, args); });
          },
          "offer_bytes"_a, "tag"_a, "input"_a = 0, "out"_a = 0, "count"_a = 0, "dtype"_a = 0, "op"_a = 0,
          "One round over the first `offer_bytes` of the buffers (the same on every rank): `agreed` becomes the "
          "AND of every rank's offer; True when every rank handed in its input "
          "under `tag` (-1: none), that candidate is agreed, and `out` holds the inputs reduced in rank order.");

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
      .def_property_readonly("horovod_inline_bytes",
                             [](const Communicator& c) { return c.config().horovod_inline_bytes; })
      // The collectives validate and enqueue. With blocking=True the caller is
      // about to wait, so a host op may run right here (Launch::kCallerWaits):
      // the GIL is released for the call either way.
      .def("collective",
           releasingGil([](Communicator& c, int kind, uintptr_t send, uintptr_t recv, size_t count, int dtype, int op,
                           int root, double timeout, bool blocking, int device, uintptr_t stream) {
             const std::optional<DeviceOpArgs> where = deviceArgs(device, stream);
             return c.collective(toOpKind(kind), ptr(send), mptr(recv), count, toDataType(dtype), toReduceOp(op), root,
                                 toMillis(timeout), launchFor(blocking), where ? &*where : nullptr);
           }),
           "kind"_a, "send"_a, "recv"_a, "count"_a, "dtype"_a, "op"_a, "root"_a, "timeout"_a, "blocking"_a = false,
           "device"_a = -1, "stream"_a = 0,
           "Any collective but alltoall, by its code in OPS: buffers as addresses, counts in elements, dtype and "
           "op by their codes (op ignored where the kind does not reduce, root where it has none), timeout in "
           "seconds (0: the communicator's). device >= 0: the buffers are on that GPU, and the op is ordered after "
           "the work queued on `stream` (0: the legacy default stream).")
      .def(
          "agreed_round",
          [](std::shared_ptr<Communicator> c, uintptr_t offer, uintptr_t agreed, size_t candidates_at,
             size_t payload_capacity) {
            AgreedRound round{std::move(c), {}};
            round.args.offer = reinterpret_cast<const uint8_t*>(offer);
            round.args.agreed = reinterpret_cast<uint8_t*>(agreed);
            round.args.candidates_at = candidates_at;
            round.args.payload_capacity = payload_capacity;
            return round;
          },
          "offer"_a, "agreed"_a, "candidates_at"_a, "payload_capacity"_a,
          "An AgreedRound over these buffers (addresses; they must outlive it): agreement on a bit vector and "
          "a small allreduce in one collective (agreed_reduce.h).")
      .def("alltoall",
           releasingGil([](Communicator& c, uintptr_t send, uintptr_t recv, const std::vector<int64_t>& send_counts,
                           const std::vector<int64_t>& send_displs, const std::vector<int64_t>& recv_counts,
                           const std::vector<int64_t>& recv_displs, int dtype, double timeout, bool blocking,
                           int device, uintptr_t stream) {
             const std::optional<DeviceOpArgs> where = deviceArgs(device, stream);
             return c.allToAll(ptr(send), mptr(recv), send_counts, send_displs, recv_counts, recv_displs,
                               toDataType(dtype), toMillis(timeout), launchFor(blocking), where ? &*where : nullptr);
           }),
           "send"_a, "recv"_a, "send_counts"_a, "send_displs"_a, "recv_counts"_a, "recv_displs"_a, "dtype"_a,
           "timeout"_a, "blocking"_a = false, "device"_a = -1, "stream"_a = 0,
           "alltoallv: counts and displacements in elements, one per rank (lists of ints); device and stream as "
           "for collective().")
      .def("monitored_barrier", releasingGil([](Communicator& c, double timeout, bool wait_all_ranks) {
             c.monitoredBarrier(toMillis(timeout), wait_all_ranks);
           }),
           "timeout"_a, "wait_all_ranks"_a = false,
           "A barrier whose timeout on rank 0 names the ranks that did not come (the lowest, or with "
           "wait_all_ranks every one); blocking.")
      .def("run_arrays", &runArrays, "kind"_a, "array"_a, "out"_a, "op"_a, "root"_a, "timeout"_a, "blocking"_a = true,
           "allreduce or broadcast in place (out None) or into `out`, allgather or reduce_scatter into `out`, "
           "reduce, gather and scatter (None where this rank passes no buffer), of plain numpy arrays: True once done "
           "(blocking), else the op's Work; False (nothing done) when they "
           "need the full Python path.")
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
      .def(
          "edge_traffic",
          [](const Communicator& c) {
            py::list out;
            for (const EdgeTraffic& t : c.edgeTraffic()) {
              py::dict d;
              d["peer"] = t.peer;
              d["direction"] = t.outgoing ? "out" : "in";
              d["transport"] = t.transport;
              d["bytes"] = t.bytes;
              d["seconds"] = static_cast<double>(t.nanos) / 1e9;
              out.append(d);
            }
            return out;
          },
          "What the large transfers over each edge reached so far: per peer (rank in this communicator), "
          "direction ('in': measured as this rank received, 'out': as it sent), transport, bytes, and seconds "
          "they were on the way (edge_meter.h).")
      .def_property_readonly("rendezvous_prefix", &Communicator::rendezvousPrefix)
      .def("set_trace_group", &Communicator::setTraceGroup, py::arg("name"), py::arg("desc"),
           py::arg("global_ranks") = std::vector<int>{},
           "How the flight recorder names this communicator: a group name and description (torch's) and the "
           "members' global ranks in rank order.")
      .def("error", &communicatorError,
           "The error that ended this communicator, as an rcoll.RcollError instance; None while it is healthy.")
      .def_property_readonly("caches_registrations", &Communicator::cachesRegistrations)
      .def("invalidate_memory", releasingGil([](Communicator& c, uintptr_t data, size_t bytes) {
             c.invalidateMemory(reinterpret_cast<const void*>(data), bytes);
           }),
           "Drops cached RDMA registrations of memory that is being freed.");
}
