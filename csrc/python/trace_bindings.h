// rcoll._core's view of what the core records of its ops: the flight recorder
// (flight_recorder.h: the dump as bytes or a file, the status, failures) and
// the counters (op_stats.h).
#pragma once

#include <pybind11/pybind11.h>

namespace rcoll::python {

void bindFlightRecorder(pybind11::module_& m);

}  // namespace rcoll::python
