// What rcoll._core tells about this machine and its settings, apart from any
// communicator: the RCOLL_* variables, the host identity, the RDMA devices, and
// the device runtime that rcoll._cuda installs.
#pragma once

#include <pybind11/pybind11.h>

namespace rcoll::python {

void bindEnvironment(pybind11::module_& m);

}  // namespace rcoll::python
