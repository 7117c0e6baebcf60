"""Turning numpy arrays and buffer-protocol objects into (address, count, dtype code).

The C++ core sees raw memory only; everything a user can get wrong about a
buffer is caught here, before anything is enqueued, with a message that names
the rank and the operation.
"""
from __future__ import annotations

import numpy as np

from . import _core
from ._ops import DTYPES

# numpy dtype name -> core dtype code. bfloat16 arrives through ml_dtypes (or any
# numpy extension dtype that calls itself "bfloat16").
_CODES = DTYPES
# The same keyed by dtype object: hashing a dtype is ~50x cheaper than dtype.name
# (a Python-level property), which matters on the small-op path.
_CODES_BY_DTYPE = {np.dtype(name): code for name, code in _CODES.items() if name in np.sctypeDict}


def as_array(obj, rank: int, opname: str, what: str, writable: bool) -> np.ndarray:
    """A numpy view of `obj` (no copy), checked for layout and writability."""
    if isinstance(obj, np.ndarray):
        arr = obj
    else:
        try:
            arr = np.asarray(memoryview(obj))
        except TypeError:
            raise _core.InvalidArgumentError(
                f"rank {rank}: {opname}: {what} must be a numpy array or a buffer-protocol object, "
                f"got {type(obj).__name__}") from None
    if not arr.flags.c_contiguous:
        raise _core.InvalidArgumentError(
            f"rank {rank}: {opname}: {what} is not C-contiguous (shape {arr.shape}, strides {arr.strides}); "
            f"pass np.ascontiguousarray(...) and copy the result back")
    if writable and not arr.flags.writeable:
        raise _core.InvalidArgumentError(
            f"rank {rank}: {opname}: {what} is read-only but receives the result; pass a writable array "
            f"or an out= array")
    return arr


def dtype_code(arr: np.ndarray, rank: int, opname: str) -> int:
    code = _CODES_BY_DTYPE.get(arr.dtype)
    if code is not None:
        return code
    if not arr.dtype.isnative:  # '>f4' is named float32 too, but its bytes are swapped
        raise _core.InvalidArgumentError(
            f"rank {rank}: {opname}: dtype {arr.dtype.str} is not in this machine's byte order; pass "
            f"arr.astype(arr.dtype.newbyteorder('='))")
    code = _CODES.get(arr.dtype.name)  # bfloat16 and other extension dtypes
    if code is None:
        supported = ", ".join(sorted(_CODES))
        raise _core.InvalidArgumentError(
            f"rank {rank}: {opname}: dtype {arr.dtype} is not supported (supported: {supported})")
    return code


address = _core.array_address  # the data pointer of an ndarray (as_array() made every input one)


class HostBuffer:
    """A checked view of a host buffer, with the fields of _device.DeviceBuffer
    (so that the communicator's collectives are written once for both)."""

    __slots__ = ("obj", "array", "address", "code")

    def __init__(self, obj, rank: int, opname: str, what: str, writable: bool):
        arr = as_array(obj, rank, opname, what, writable)
        self.obj = obj
        self.array = arr
        self.code = dtype_code(arr, rank, opname)
        self.address = address(arr)

    # Read from the array when asked: each field set costs more than most reads.
    @property
    def size(self) -> int:
        return self.array.size

    @property
    def shape(self) -> tuple:
        return self.array.shape

    @property
    def nbytes(self) -> int:
        return self.array.nbytes

    @property
    def dtype_name(self) -> str:  # for messages: numpy's dtype.name costs microseconds
        return self.array.dtype.name


def displacements(counts):
    """Where each rank's block starts: the running sum of the counts before it."""
    out, total = [], 0
    for n in counts:
        out.append(total)
        total += n
    return out
