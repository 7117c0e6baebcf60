#include "python/numpy_arrays.h"

#include <cmath>
#include <cstring>

#include "dtype.h"

namespace rcoll::python {

namespace {

struct NumpyArrayFields {
  PyObject_HEAD char* data;
  int nd;
  Py_ssize_t* dimensions;
  Py_ssize_t* strides;
  PyObject* base;
  PyObject* descr;
  int flags;
};
struct NumpyDescrPrefix {
  PyObject_HEAD PyTypeObject* typeobj;
  char kind;
  char type;
  char byteorder;
  char former_flags;
  int type_num;
};
constexpr int kNpyContiguousAligned = 0x0001 | 0x0100;                          // NPY_ARRAY_{C_CONTIGUOUS,ALIGNED}
constexpr int kNpyContiguousAlignedWriteable = kNpyContiguousAligned | 0x0400;  // ... and NPY_ARRAY_WRITEABLE

PyTypeObject* g_ndarray_type = nullptr;

// numpy type number -> DataType code, -1 for the full path (bfloat16 is an extension dtype).
int fastDataType(PyObject* descr) {
  const auto* d = reinterpret_cast<const NumpyDescrPrefix*>(descr);
  if (d->byteorder == '>') return -1;  // byte-swapped
  switch (d->type_num) {
    case 0:
      return static_cast<int>(DataType::kBool);  // NPY_BOOL
    case 1:
      return static_cast<int>(DataType::kInt8);  // NPY_BYTE
    case 2:
      return static_cast<int>(DataType::kUInt8);  // NPY_UBYTE
    case 3:
      return static_cast<int>(DataType::kInt16);  // NPY_SHORT
    case 4:
      return static_cast<int>(DataType::kUInt16);  // NPY_USHORT
    case 5:
      return static_cast<int>(DataType::kInt32);  // NPY_INT
    case 6:
      return static_cast<int>(DataType::kUInt32);  // NPY_UINT
    case 7:
      return sizeof(long) == 8 ? static_cast<int>(DataType::kInt64) : -1;  // NPY_LONG
    case 8:
      return sizeof(long) == 8 ? static_cast<int>(DataType::kUInt64) : -1;  // NPY_ULONG
    case 9:
      return static_cast<int>(DataType::kInt64);  // NPY_LONGLONG
    case 10:
      return static_cast<int>(DataType::kUInt64);  // NPY_ULONGLONG
    case 11:
      return static_cast<int>(DataType::kFloat32);  // NPY_FLOAT
    case 12:
      return static_cast<int>(DataType::kFloat64);  // NPY_DOUBLE
    case 23:
      return static_cast<int>(DataType::kFloat16);  // NPY_HALF
    default:
      return -1;
  }
}

}  // namespace

void rememberNdarrayType(pybind11::handle ndarray_type) {
  g_ndarray_type = reinterpret_cast<PyTypeObject*>(ndarray_type.inc_ref().ptr());  // held for the process
}

uintptr_t ndarrayAddress(pybind11::handle array) {
  if (!PyObject_TypeCheck(array.ptr(), g_ndarray_type)) throw pybind11::type_error("array_address: not a numpy array");
  return reinterpret_cast<uintptr_t>(reinterpret_cast<NumpyArrayFields*>(array.ptr())->data);
}

bool fastArray(PyObject* obj, bool writable, FastArray* out) {
  if (Py_TYPE(obj) != g_ndarray_type) return false;  // subclasses, buffers, device arrays
  const auto* fields = reinterpret_cast<const NumpyArrayFields*>(obj);
  const int need = writable ? kNpyContiguousAlignedWriteable : kNpyContiguousAligned;
  if ((fields->flags & need) != need) return false;
  out->dtype = fastDataType(fields->descr);
  if (out->dtype < 0) return false;
  out->data = fields->data;
  out->count = 1;
  for (int i = 0; i < fields->nd; ++i) out->count *= static_cast<size_t>(fields->dimensions[i]);
  return true;
}

int fastReduceOp(PyObject* op) {
  if (!PyUnicode_CheckExact(op)) return -1;
  const char* name = PyUnicode_AsUTF8(op);
  if (name == nullptr) {
    PyErr_Clear();
    return -1;
  }
  for (int i = 0; i < kNumReduceOps; ++i) {
    if (std::strcmp(name, reduceOpName(static_cast<ReduceOp>(i))) == 0) return i;
  }
  return -1;
}

std::chrono::milliseconds toMillis(double seconds) {
  if (!(seconds > 0) || std::isinf(seconds)) return std::chrono::milliseconds(0);
  return std::chrono::milliseconds(static_cast<long long>(std::ceil(seconds * 1000.0)));
}

bool fastTimeout(PyObject* timeout, std::chrono::milliseconds* out) {
  double seconds = 0;
  if (timeout != Py_None) {
    seconds = PyFloat_AsDouble(timeout);
    if (seconds == -1.0 && PyErr_Occurred()) {
      PyErr_Clear();
      return false;
    }
  }
  *out = toMillis(seconds);
  return true;
}

}  // namespace rcoll::python
