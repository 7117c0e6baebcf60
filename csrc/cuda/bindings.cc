// The Python module rcoll._cuda: the C API of cuda_reduce.h, one function each.
//
// Compiled by the host C++ compiler without CUDA headers; buffers and streams
// cross as integer addresses (tensor.data_ptr(), stream.cuda_stream), so
// neither this module nor the kernels know about torch. The CUDA runtime is
// linked statically and loads the driver on first use, so importing this
// module works on machines without a GPU or driver: device_count() is then 0
// and probe() says why.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda_reduce.h"
#include "device_api.h"
#include "dtype.h"
#include "python/gil.h"

namespace py = pybind11;
using rcoll::python::withoutGil;

namespace {

// Argument errors become ValueError (rcoll.cuda turns them into
// rcoll.InvalidArgumentError), CUDA failures RuntimeError.
void check(int rc) {
  if (rc == RCOLL_CUDA_SUCCESS) return;
  std::string message = rcollCudaLastError();
  if (rc == RCOLL_CUDA_INVALID_ARGUMENT) throw py::value_error(message);
  throw std::runtime_error(message);
}

void* asPointer(uintptr_t address) { return reinterpret_cast<void*>(address); }

std::vector<std::string> splitCommas(const std::string& text) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(',', start);
    if (end == std::string::npos) end = text.size();
    if (end > start) parts.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return parts;
}

}  // namespace

PYBIND11_MODULE(_cuda, m) {
  m.doc() = "rcoll's CUDA reduction kernels on raw device pointers (see rcoll.cuda for tensors).";

  // The same codes as rcoll._core's tables: both come from csrc/dtype.h.
  py::dict dtypes, ops;
  for (int i = 0; i < rcoll::kNumDataTypes; ++i) {
    dtypes[rcoll::dataTypeName(static_cast<rcoll::DataType>(i))] = i;
  }
  for (int i = 0; i < rcoll::kNumReduceOps; ++i) {
    ops[rcoll::reduceOpName(static_cast<rcoll::ReduceOp>(i))] = i;
  }
  m.attr("DTYPES") = dtypes;
  m.attr("REDUCE_OPS") = ops;

  m.def(
      "reduce",
      [](uintptr_t dst, uintptr_t a, uintptr_t b, size_t count, int dtype, int op, uintptr_t stream) {
        // A launch can block when the stream's queue is full.
        check(withoutGil([&] {
          return rcollCudaReduce(asPointer(dst), asPointer(a), asPointer(b), count, dtype, op, asPointer(stream));
        }));
      },
      py::arg("dst"), py::arg("a"), py::arg("b"), py::arg("count"), py::arg("dtype"), py::arg("op"),
      py::arg("stream") = 0, "Enqueues dst[i] = a[i] (op) b[i] on `stream` (device addresses; avg reduces like sum).");

  m.def(
      "scale_divide",
      [](uintptr_t buf, size_t count, int dtype, size_t divisor, uintptr_t stream) {
        check(
            withoutGil([&] { return rcollCudaScaleDivide(asPointer(buf), count, dtype, divisor, asPointer(stream)); }));
      },
      py::arg("buf"), py::arg("count"), py::arg("dtype"), py::arg("divisor"), py::arg("stream") = 0,
      "Enqueues buf[i] = buf[i] / divisor on `stream` (avg's last step).");

  m.def(
      "probe",
      [] {
        int count = 0;
        const int rc = rcollCudaDeviceCount(&count);
        return std::make_tuple(count, std::string(rc == RCOLL_CUDA_SUCCESS ? "" : rcollCudaLastError()));
      },
      "(device count, reason it is 0 or ''); never raises, never creates a CUDA context.");

  m.def(
      "device_count",
      [] {
        int count = 0;
        (void)rcollCudaDeviceCount(&count);  // 0 on any failure, by contract
        return count;
      },
      "Visible CUDA devices; 0 without a driver or GPU (never raises).");

  m.def(
      "device_capability",
      [](int device) {
        int major = 0, minor = 0;
        check(rcollCudaDeviceCapability(device, &major, &minor));
        return std::make_pair(major, minor);
      },
      py::arg("device"), "(major, minor) compute capability of `device`.");

  m.def(
      "versions",
      [] {
        int runtime = 0, driver = 0;
        (void)rcollCudaVersions(&runtime, &driver);
        return std::make_pair(runtime, driver);
      },
      "(CUDA runtime built with, driver's CUDA version or 0), as 1000*major + 10*minor.");

  m.def(
      "device_api_capsule",
      [] {
        // A static table: the capsule needs no destructor.
        return py::capsule(static_cast<const void*>(rcollCudaDeviceApi()), RCOLL_DEVICE_API_CAPSULE);
      },
      "The device API table (csrc/device_api.h) for rcoll._core.set_device_api(): how the core stages "
      "GPU buffers through pinned host memory without linking CUDA itself.");

  m.def(
      "built_archs", [] { return splitCommas(rcollCudaBuiltArchs()); },
      "Code compiled in: 'sm_XY' machine code, 'compute_XY' PTX (JIT-compiled on newer GPUs).");
}
