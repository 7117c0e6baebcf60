// rcoll_emulated_device: the host-memory device runtime (emulated_device_api.h)
// as a Python module, for tests only. It hands its table to rcoll's core the
// way rcoll._cuda does (a capsule), so the core and the Python layers carry no
// test code: a rank selects it with RCOLL_DEVICE_RUNTIME=rcoll_emulated_device.
#include <pybind11/pybind11.h>

#include <cstdint>
#include <stdexcept>
#include <string>

#include "device_api.h"
#include "emulated_device_api.h"

namespace py = pybind11;
using rcoll::testing::emulatedDeviceApi;

namespace {

void* asPointer(uintptr_t address) { return reinterpret_cast<void*>(address); }

void check(int status, const char* what) {
  if (status != 0) throw std::runtime_error(std::string(what) + ": " + emulatedDeviceApi()->last_error());
}

}  // namespace

PYBIND11_MODULE(rcoll_emulated_device, m) {
  m.doc() = "rcoll's device runtime emulated in host memory (tests only; tests/device/emulated_device/).";
  m.def(
      "device_api_capsule",
      [] { return py::capsule(static_cast<const void*>(emulatedDeviceApi()), RCOLL_DEVICE_API_CAPSULE); },
      "The device API table for rcoll._core.set_device_api().");
  m.def(
      "stream_create",
      [] {
        void* stream = nullptr;
        check(emulatedDeviceApi()->stream_create(0, &stream), "emulated stream");
        return reinterpret_cast<uintptr_t>(stream);
      },
      "A new emulated stream (a worker thread), as an address.");
  m.def(
      "stream_destroy",
      [](uintptr_t stream) {
        py::gil_scoped_release release;  // joins the stream's worker
        emulatedDeviceApi()->stream_destroy(asPointer(stream));
      },
      py::arg("stream"));
  m.def(
      "delayed_copy",
      [](uintptr_t stream, uintptr_t dst, uintptr_t src, size_t bytes, double delay) {
        check(rcoll::testing::emulatedDelayedCopy(asPointer(stream), asPointer(dst), asPointer(src), bytes, delay),
              "delayed copy");
      },
      py::arg("stream"), py::arg("dst"), py::arg("src"), py::arg("bytes"), py::arg("delay"),
      "On emulated `stream`, after `delay` seconds, copy `bytes` from src to dst.");
}
