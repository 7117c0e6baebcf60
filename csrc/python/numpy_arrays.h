// Reading plain numpy arrays without numpy's headers, for the one-call fast path.
//
// numpy's array object starts with PyObject_HEAD, the data pointer and the
// fields up to `flags`; its dtype object with the fields up to `type_num`.
// Those prefixes are numpy's stable ABI (PyArray_DATA and friends read them),
// shared by numpy 1.x and 2.x. Reading them costs nanoseconds where
// `__array_interface__` builds a dict (microseconds, a real share of a small
// op's latency). Anything not recognised at a glance (subclasses, byte-swapped
// or extension dtypes, strided views) is declined: the Python layer's full
// path then handles it and words any error.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <cstddef>
#include <cstdint>

namespace rcoll::python {

// Remembers numpy.ndarray's type; call once at import.
void rememberNdarrayType(pybind11::handle ndarray_type);

// The data pointer of a numpy array (its first element); raises TypeError for anything else.
uintptr_t ndarrayAddress(pybind11::handle array);

// What the fast path needs of a plain numpy array.
struct FastArray {
  char* data = nullptr;
  size_t count = 0;
  int dtype = -1;  // DataType code
};

// True when `obj` is an exact numpy array, C-contiguous and aligned (and
// writeable when `writable`), of a dtype the core knows at a glance.
bool fastArray(PyObject* obj, bool writable, FastArray* out);

// A reduce op name ("sum", ...) -> its code; -1 for the full path (other spellings, enums).
int fastReduceOp(PyObject* op);

// A timeout argument (None or seconds) as milliseconds (0: the default); false for the full path.
bool fastTimeout(PyObject* timeout, std::chrono::milliseconds* out);

// Seconds (0, negative, NaN or infinite: the default) as whole milliseconds, rounded up.
std::chrono::milliseconds toMillis(double seconds);

}  // namespace rcoll::python
