#include "python/trace_bindings.h"

#include <pybind11/stl.h>

#include <string>

#include "dtype.h"
#include "error.h"
#include "flight_recorder.h"
#include "op_kind.h"
#include "op_stats.h"
#include "python/gil.h"

namespace py = pybind11;

namespace rcoll::python {

void bindFlightRecorder(py::module_& m) {
  m.def(
      "trace_pickle",
      [](const std::string& reason) {
        std::string data = withoutGil([&] { return FlightRecorder::process().pickled(reason); });
        return py::bytes(data);
      },
      py::arg("reason") = "requested", "The flight recorder's dump (torch's flight-recorder format), pickled.");
  m.def(
      "trace_status",
      [] {
        const FlightRecorder::Status st = withoutGil([] { return FlightRecorder::process().status(); });
        py::dict d;
        d["rank"] = st.rank;
        d["groups"] = st.groups;
        d["last_completed"] = st.last_completed;
        py::list pending;
        for (const FlightRecorder::Pending& p : st.pending) {
          py::dict op;
          op["group"] = p.group;
          op["seq"] = p.seq;
          op["op"] = p.kind == OpKind::kPointToPoint ? (p.is_send ? "send" : "recv") : opKindName(p.kind);
          op["dtype"] = dataTypeName(p.dtype);
          op["count"] = p.count;
          op["root"] = p.root;
          op["state"] = p.started ? "started" : "queued";
          op["created_ns"] = p.created_ns;
          op["started_ns"] = p.started_ns;
          pending.append(op);
        }
        d["pending"] = pending;
        py::list arrivals;
        for (const FlightRecorder::Arrival& a : st.arrivals) {
          const double away_ms = static_cast<double>(a.sample.away_ns) / 1e6;
          arrivals.append(py::make_tuple(
              a.group, a.sample.seq, static_cast<double>(a.sample.wait_ns) / 1e6,
              a.sample.away_ns == ArrivalLog::kUnknown ? py::object(py::none()) : py::object(py::float_(away_ms))));
        }
        d["arrivals"] = arrivals;
        return d;
      },
      "What `python -m rcoll status` shows of this process: rank, groups (names by id), last_completed (by "
      "group id: the last collective that finished) and pending (the ops not finished, oldest first: group, seq, op, "
      "dtype, count, "
      "root or peer, state, created_ns, started_ns) and arrivals (arrival_log.h: per kept collective without a root, "
      "(group, seq, wait ms, away ms or None)).");
  m.def(
      "stats",
      [] {
        py::list out;
        for (const OpStats::Row& r : withoutGil([] { return OpStats::process().rows(); })) {
          py::dict d;
          d["op"] = r.op;
          d["algorithm"] = r.algorithm;
          d["path"] = r.path;
          d["count"] = r.count;
          d["errors"] = r.errors;
          d["bytes"] = r.bytes;
          d["seconds"] = r.seconds;
          d["algbw_gbps"] = r.seconds > 0 ? r.bytes / r.seconds / 1e9 : 0.0;
          d["busbw_gbps"] = r.seconds > 0 ? r.bus_bytes / r.seconds / 1e9 : 0.0;
          out.append(d);
        }
        return out;
      },
      "The counters of every op this process ran (op_stats.h), a dict per op, algorithm and path: count, "
      "errors, bytes (nccl-tests' size, summed), seconds, algbw_gbps and busbw_gbps (GB/s, over the ops' time).");
  m.def(
      "wait_for_failure",
      [](uint64_t seen, double timeout, uint64_t woken) {
        return withoutGil([&] {
          return FlightRecorder::process().waitForFailure(
              seen, std::chrono::milliseconds(static_cast<int64_t>(timeout * 1000.0)), woken);
        });
      },
      py::arg("seen"), py::arg("timeout"), py::arg("woken"),
      "Failures of this process's communicators so far, once more than `seen` (or after `timeout` seconds, or "
      "once wake_watch() was called since watch_wakes() returned `woken`).");
  m.def(
      "watch_wakes", [] { return FlightRecorder::process().wakes(); },
      "How many times wake_watch() was called: read before deciding to wait, and pass to wait_for_failure().");
  m.def(
      "wake_watch", [] { FlightRecorder::process().wake(); },
      "Ends the current wait_for_failure() at once, and any whose `woken` was read before.");

  m.def(
      "dump_trace",
      [](const std::string& path, const std::string& reason) {
        return withoutGil([&] { return FlightRecorder::process().dump(reason, path); });
      },
      py::arg("path") = "", py::arg("reason") = "requested",
      "Writes the flight recorder's dump to `path` (\"\": RCOLL_TRACE_DIR/rcoll_trace_rank_<rank>); returns the "
      "path written, \"\" when there is none.");
}

}  // namespace rcoll::python
