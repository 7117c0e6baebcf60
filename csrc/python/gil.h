// Releasing the GIL around a blocking call, and taking it back outside any destructor.
//
// Why not py::gil_scoped_release (or a call_guard of it): its destructor takes
// the GIL back. A thread that takes the GIL while the interpreter finalizes
// (a daemon thread returning from a wait, say) is ended by CPython with
// pthread_exit, which unwinds the thread's stack with a forced unwind
// (abi::__forced_unwind). A forced unwind that starts inside a destructor,
// which is noexcept, calls std::terminate: the whole process aborts at exit
// ("terminate called without an active exception", SIGABRT), after a job that
// computed everything right. Taking the GIL back in ordinary code, as here,
// lets that unwind run through rcoll's frames and pybind11's dispatcher (which
// rethrows it) to the end of the thread, as it does for a pure-Python thread.
//
// So: every binding that blocks or moves data with the GIL released goes
// through withoutGil() or releasingGil(), never through gil_scoped_release.
#pragma once

#include <pybind11/pybind11.h>

#if defined(__GLIBCXX__)
#include <cxxabi.h>
#endif

#include <type_traits>
#include <utility>

namespace rcoll::python {

// True once the interpreter has begun finalizing: taking the GIL then ends the thread.
inline bool interpreterFinalizing() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsFinalizing() != 0;
#else
  return _Py_IsFinalizing() != 0;
#endif
}

// Runs f() with the GIL released and returns its result with the GIL held.
template <typename F>
auto withoutGil(F&& f) -> std::invoke_result_t<F&> {
  using Result = std::invoke_result_t<F&>;
  PyThreadState* saved = PyEval_SaveThread();
  // On an exception from f, take the GIL back and let it go on. A forced
  // unwind from f (a Python store's callback that found the interpreter
  // finalizing, say) is ending this thread: it goes on without the GIL.
  auto run = [&]() -> Result {
    try {
      return f();
#if defined(__GLIBCXX__)
    } catch (abi::__forced_unwind&) {
      throw;
#endif
    } catch (...) {
      PyEval_RestoreThread(saved);
      throw;
    }
  };
  if constexpr (std::is_void_v<Result>) {
    run();
    PyEval_RestoreThread(saved);  // may end this thread (see above): not in a destructor
  } else {
    Result result = run();
    PyEval_RestoreThread(saved);
    return result;
  }
}

namespace detail {
template <typename F, typename R, typename... Args>
auto releasingGilCall(F f, R (F::*)(Args...) const) {
  return [f = std::move(f)](Args... args) -> R {
    return withoutGil([&]() -> R { return f(std::forward<Args>(args)...); });
  };
}
}  // namespace detail

// A callable for .def() / py::init() with the same signature as `f` (a lambda
// or a member function), whose body runs with the GIL released.
template <typename F>
auto releasingGil(F f) {
  return detail::releasingGilCall(std::move(f), &F::operator());
}
template <typename R, typename C, typename... Args>
auto releasingGil(R (C::*method)(Args...)) {
  return [method](C& self, Args... args) -> R {
    return withoutGil([&]() -> R { return (self.*method)(std::forward<Args>(args)...); });
  };
}

}  // namespace rcoll::python
