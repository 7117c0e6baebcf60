"""The numpy-facing helpers of the small-op path (python/rcoll/_buffers.py)."""
import numpy as np
import pytest
from support.reference import BFLOAT16, DTYPES

from rcoll import _core
from rcoll._buffers import address, dtype_code


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
    from rcoll._ops import ALLREDUCE
    comm = rcoll.Communicator(0, 1, master_addr="127.0.0.1", master_port=spawn.free_port(), timeout=30)
    try:
        for dtype in DTYPES:
            # extension dtypes (bfloat16, float8; NPY_USERDEF on): the full path finds them by name
            builtin = dtype.num < 256
            for shape in [(0,), (1,), (7,), (3, 5), ()]:
                a = np.ones(shape, dtype)
                assert comm._comm.run_arrays(ALLREDUCE, a, None, "sum", 0, None) == builtin, (dtype, shape)
                assert comm._comm.run_arrays(ALLREDUCE, a, None, "max", 0, 5.0) == builtin, (dtype, shape)
                assert (comm.allreduce(a, "max") == 1).all()
        base = np.ones(10, np.float32)
        readonly = np.ones(4, np.float32)
        readonly.flags.writeable = False
        swapped = np.ones(4, np.dtype(np.float32).newbyteorder(">" if np.little_endian else "<"))
        declined = [(base[::2], "sum", None), (readonly, "sum", None), (swapped, "sum", None),
                    (base.view(_Subclass), "sum", None), (memoryview(base), "sum", None), (base, "SUM", None),
                    (base, "nope", None), (base, "sum", "soon"), (np.ones(3, np.complex64), "sum", None)]
        for array, op, timeout in declined:
            assert not comm._comm.run_arrays(ALLREDUCE, array, None, op, 0, timeout), (array, op, timeout)
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


# Out of place and asynchronous, the same call returns the queued op's Work;
# what it cannot take is declined (False) for the full path, as in place.
def test_array_fast_path_runs_out_of_place_and_async_ops():
    import rcoll
    from rcoll import spawn
    from rcoll._ops import ALLREDUCE, BROADCAST
    comm = rcoll.Communicator(0, 1, master_addr="127.0.0.1", master_port=spawn.free_port(), timeout=30)
    fast = comm._comm
    try:
        a = np.arange(6, dtype=np.float32)
        for kind, op in ((ALLREDUCE, "max"), (BROADCAST, None)):
            out = np.zeros(6, np.float32)
            assert fast.run_arrays(kind, a, out, op, 0, None) is True
            assert (out == a).all()
            out[...] = 0
            work = fast.run_arrays(kind, a, out, op, 0, 5.0, False)
            assert work is not False and work.wait(10) and (out == a).all()
            for bad in (np.zeros(6, np.float64), np.zeros(5, np.float32), np.zeros(12, np.float32)[::2]):
                assert fast.run_arrays(kind, a, bad, op, 0, None, False) is False
        # the public calls take this path and keep the arrays of async ops until they end
        out = np.zeros(6, np.float32)
        handle = comm.allreduce(a, "sum", out=out, async_op=True)
        assert handle.wait() is out and (out == a).all()
        assert (comm.broadcast(a, 0, out=np.zeros(6, np.float32)) == a).all()
    finally:
        comm.shutdown()


# The rooted ops' one-call path: the root passes its output (reduce, gather)
# or the whole input (scatter), the others None there.
def test_rooted_fast_paths_take_plain_arrays_and_decline_the_rest():
    import rcoll
    from rcoll import spawn
    from rcoll._ops import GATHER, REDUCE, SCATTER
    comm = rcoll.Communicator(0, 1, master_addr="127.0.0.1", master_port=spawn.free_port(), timeout=30)
    fast = comm._comm
    try:
        a = np.arange(6, dtype=np.float32)
        out = np.zeros(6, np.float32)
        assert fast.run_arrays(REDUCE, a, out, "max", 0, None) is True and (out == a).all()
        out[...] = 0
        assert fast.run_arrays(GATHER, a, out, None, 0, None) is True and (out == a).all()
        out[...] = 0
        work = fast.run_arrays(SCATTER, a, out, None, 0, None, False)
        assert work is not False and work.wait(10) and (out == a).all()
        readonly = np.ones(6, np.float32)
        readonly.flags.writeable = False
        for kind, array, dst, root in [(REDUCE, readonly, None, 0),  # in place on the root: must be writable
                                       (REDUCE, a, out, 1), (GATHER, a, out, -1),  # not a rank
                                       (GATHER, a, np.zeros(5, np.float32), 0), (SCATTER, a, readonly, 0),
                                       (SCATTER, a, np.zeros(6, np.float64), 0), (GATHER, a, out, np.int64(0))]:
            assert fast.run_arrays(kind, array, dst, "sum", root, None) is False, (kind, root)
        # the public calls, whichever path they take
        assert (comm.gather(a, 0).reshape(-1) == a).all()
        assert (comm.scatter(a, 0, out=np.zeros(6, np.float32)) == a).all()
        assert (comm.reduce(a.copy(), "sum", 0) == a).all()
    finally:
        comm.shutdown()


# The same one-call paths of broadcast, allgather and reduce_scatter.
def test_other_fast_paths_take_plain_arrays_and_decline_the_rest():
    import rcoll
    from rcoll import spawn
    from rcoll._ops import ALLGATHER, BROADCAST, REDUCE_SCATTER
    comm = rcoll.Communicator(0, 1, master_addr="127.0.0.1", master_port=spawn.free_port(), timeout=30)
    fast = comm._comm
    try:
        for dtype in DTYPES:
            builtin = dtype.num < 256
            for shape in [(0,), (1,), (7,), (3, 5), ()]:
                a = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape).astype(dtype)
                out = np.zeros(a.size, dtype)
                assert fast.run_arrays(BROADCAST, a, None, None, 0, None) == builtin, (dtype, shape)
                assert fast.run_arrays(ALLGATHER, a, out, None, 0, 5.0) == builtin, (dtype, shape)
                if builtin:
                    assert (out == a.reshape(-1)).all(), (dtype, shape)
                out[...] = 0
                assert fast.run_arrays(REDUCE_SCATTER, a, out, "max", 0, None) == builtin, (dtype, shape)
                if builtin:
                    assert (out == a.reshape(-1)).all(), (dtype, shape)
                # and the public calls, whichever path they take, give the same
                assert (comm.allgather(a).reshape(-1) == a.reshape(-1)).all()
                assert comm.allgather(a).shape == (1,) + a.shape
                assert (comm.broadcast(a, 0) == a).all()
        base = np.ones(10, np.float32)
        readonly = np.ones(4, np.float32)
        readonly.flags.writeable = False
        out4 = np.zeros(4, np.float32)
        # broadcast: the root may pass a read-only array (it only sends), not a bad root
        assert fast.run_arrays(BROADCAST, readonly, None, None, 0, None)
        for array, root, timeout in [(base[::2], 0, None), (base.view(_Subclass), 0, None), (base, 1, None),
                                     (base, -1, None), (base, np.int64(0), None), (base, 2**70, None),
                                     (base, 0, "soon"), (memoryview(base), 0, None)]:
            assert not fast.run_arrays(BROADCAST, array, None, None, root, timeout), (array, root, timeout)
        # allgather / reduce_scatter: out must be writeable, of the input's dtype and size
        for src, out in [(out4, readonly), (readonly, np.zeros(3, np.float32)), (out4, np.zeros(4, np.float64)),
                         (base[::2], np.zeros(5, np.float32)), (out4, np.zeros(8, np.float32)[::2]),
                         (out4.view(_Subclass), np.zeros(4, np.float32))]:
            assert not fast.run_arrays(ALLGATHER, src, out, None, 0, None), (src, out)
            assert not fast.run_arrays(REDUCE_SCATTER, src, out, "sum", 0, None), (src, out)
        assert not fast.run_arrays(REDUCE_SCATTER, out4, np.zeros(4, np.float32), "nope", 0, None)
        # ... and the full path then words the error
        with pytest.raises(_core.InvalidArgumentError, match="root 1 is not a rank"):
            comm.broadcast(base, 1)
        with pytest.raises(_core.InvalidArgumentError, match="out has dtype float64"):
            comm.allgather(out4, out=np.zeros(4, np.float64))
        with pytest.raises(_core.InvalidArgumentError, match="read-only"):
            comm.reduce_scatter(out4, out=readonly)
        with pytest.raises(_core.InvalidArgumentError, match="unknown reduce op"):
            comm.reduce_scatter(out4, "nope")
        with pytest.raises(_core.InvalidArgumentError, match="avg"):
            comm.reduce_scatter(np.ones(4, np.int32), "avg")  # refused by the core on either path
    finally:
        comm.shutdown()
