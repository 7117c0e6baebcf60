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


def test_byte_swapped_arrays_are_refused():
    # '>f4' is named float32 too: reducing its bytes as native floats would be silently wrong.
    swapped = np.zeros(4, np.dtype(np.float32).newbyteorder(">" if np.little_endian else "<"))
    with pytest.raises(_core.InvalidArgumentError, match="byte order"):
        dtype_code(swapped, 1, "allreduce")


# The one-call path of a blocking in-place allreduce (Communicator.allreduce_array)
# must take exactly the arrays the full path takes, and decline the rest.
def test_allreduce_array_fast_path_takes_plain_arrays_and_declines_the_rest():
    import rcoll
    from rcoll import spawn
    comm = rcoll.Communicator(0, 1, master_addr="127.0.0.1", master_port=spawn.free_port(), timeout=30)
    try:
        for dtype in DTYPES:
            builtin = dtype != BFLOAT16  # an extension dtype: the full path finds it by name
            for shape in [(0,), (1,), (7,), (3, 5), ()]:
                a = np.ones(shape, dtype)
                assert comm._comm.allreduce_array(a, "sum", None) == builtin, (dtype, shape)
                assert comm._comm.allreduce_array(a, "max", 5.0) == builtin, (dtype, shape)
                assert (comm.allreduce(a, "max") == 1).all()
        base = np.ones(10, np.float32)
        readonly = np.ones(4, np.float32)
        readonly.flags.writeable = False
        swapped = np.ones(4, np.dtype(np.float32).newbyteorder(">" if np.little_endian else "<"))
        declined = [(base[::2], "sum", None), (readonly, "sum", None), (swapped, "sum", None),
                    (base.view(_Subclass), "sum", None), (memoryview(base), "sum", None), (base, "SUM", None),
                    (base, "nope", None), (base, "sum", "soon"), (np.ones(3, np.complex64), "sum", None)]
        for array, op, timeout in declined:
            assert not comm._comm.allreduce_array(array, op, timeout), (array, op, timeout)
        # ... and the full path then answers: a result, or the usual error.
        assert comm.allreduce(base.view(_Subclass), "SUM").sum() == 10
        with pytest.raises(_core.InvalidArgumentError, match="not C-contiguous"):
            comm.allreduce(base[::2])
        with pytest.raises(_core.InvalidArgumentError, match="read-only"):
            comm.allreduce(readonly)
        with pytest.raises(_core.InvalidArgumentError, match="unknown reduce op"):
            comm.allreduce(base, "nope")
        with pytest.raises(_core.InvalidArgumentError, match="avg"):
            comm.allreduce(np.ones(3, np.int32), "avg")  # refused by the core on either path
    finally:
        comm.shutdown()
