// rcoll._core's view of the flight recorder (flight_recorder.h): the dump as
// bytes or as a file.
#pragma once

#include <pybind11/pybind11.h>

namespace rcoll::python {

void bindFlightRecorder(pybind11::module_& m);

}  // namespace rcoll::python
