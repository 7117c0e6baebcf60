#include "python/python_store.h"

#include "error.h"
#include "python/gil.h"

namespace py = pybind11;

namespace rcoll::python {

namespace {

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

}  // namespace

PythonStore::~PythonStore() {
  // A destructor must not take the GIL while the interpreter finalizes
  // (python/gil.h): then the reference is left to the dying interpreter.
  if (interpreterFinalizing()) {
    store_.release();
    return;
  }
  py::gil_scoped_acquire gil;
  store_ = py::object();
}

void PythonStore::set(const std::string& key, const std::vector<uint8_t>& value) {
  py::gil_scoped_acquire gil;
  call([&] { store_.attr("set")(key, py::bytes(reinterpret_cast<const char*>(value.data()), value.size())); });
}

std::vector<uint8_t> PythonStore::get(const std::string& key, std::chrono::milliseconds timeout) {
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

int64_t PythonStore::add(const std::string& key, int64_t delta) {
  py::gil_scoped_acquire gil;
  int64_t result = 0;
  call([&] { result = store_.attr("add")(key, delta).cast<int64_t>(); });
  return result;
}

}  // namespace rcoll::python
