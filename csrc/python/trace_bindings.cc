#include "python/trace_bindings.h"

#include <string>

#include "flight_recorder.h"
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
      "dump_trace",
      [](const std::string& path, const std::string& reason) {
        return withoutGil([&] { return FlightRecorder::process().dump(reason, path); });
      },
      py::arg("path") = "", py::arg("reason") = "requested",
      "Writes the flight recorder's dump to `path` (\"\": RCOLL_TRACE_DIR/rcoll_trace_rank_<rank>); returns the "
      "path written, \"\" when there is none.");
}

}  // namespace rcoll::python
