"""The numpy-facing helpers of the small-op path (python/rcoll/_buffers.py)."""
import numpy as np
import pytest

from rcoll import _core
from rcoll._buffers import address, dtype_code

from reference import BFLOAT16, DTYPES


class _Subclass(np.ndarray):
    pass


def _interface_address(a):
    return a.__array_interface__["data"][0]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_array_address_is_the_data_pointer(dtype):
    base = np.zeros(64, dtype)
    arrays = [base, base[5:], base[5:9], base[:0], base.reshape(8, 8)[3], np.zeros((), dtype),
              base[7:].view(_Subclass)]
    for a in arrays:
        assert address(a) == _interface_address(a), (a.shape, a.dtype)


def test_array_address_refuses_what_is_not_an_ndarray():
    for obj in (b"bytes", bytearray(4), memoryview(bytearray(4)), [1, 2], None, 3):
        with pytest.raises(TypeError, match="not a numpy array"):
            _core.array_address(obj)


def test_dtype_codes_match_the_core_names():
    for dtype in DTYPES:
        assert dtype_code(np.zeros(1, dtype), 0, "test") == _core.DTYPES[dtype.name]
    if BFLOAT16 is not None:  # an extension dtype: found by name
        assert dtype_code(np.zeros(1, BFLOAT16), 0, "test") == _core.DTYPES["bfloat16"]
    with pytest.raises(_core.InvalidArgumentError, match="rank 3: allreduce: dtype complex64 is not supported"):
        dtype_code(np.zeros(1, np.complex64), 3, "allreduce")
