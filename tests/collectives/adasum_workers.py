"""Rank bodies of test_adasum.py, its inputs and its numpy reference.

Every rank regenerates its input from a seed, so the test process can build
every rank's input and the reference without any of them being sent back.
"""
import time

import numpy as np

import rcoll

try:
    import ml_dtypes

    BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # the bfloat16 cases are skipped without ml_dtypes
    BFLOAT16 = None

# Below sqrt(DBL_MIN) a squared norm counts as zero: that side's coefficient is 1 (Horovod's rule).
_TINY = np.sqrt(np.finfo(np.float64).tiny)


def rank_input(rank, world, dtype, count, kind="random"):
    """Rank `rank`'s input. "random": a vector common to every rank plus half as
    much noise of the rank's own, so that the dot products are far from zero and
    every coefficient matters; "parallel": the same vector times a factor of the
    rank's (Adasum of parallel vectors is their average); "orthogonal": column
    `rank` of an orthonormal basis (Adasum of orthogonal vectors is their sum),
    as Horovod's test_adasum_pytorch.py builds them; "one": rank 0's random vector,
    zeros elsewhere (a zero side enters with coefficient 1 and changes nothing)."""
    dtype = np.dtype(dtype)
    common = np.random.default_rng([world, count, 7]).standard_normal(count)
    own = np.random.default_rng([world, count, 7, rank + 1])
    if kind == "random":
        x = common + 0.5 * own.standard_normal(count)
    elif kind == "parallel":
        x = common * np.random.default_rng([world, 11]).uniform(-2.0, 2.0, world)[rank]
    elif kind == "orthogonal":
        q, _ = np.linalg.qr(np.random.default_rng([world, count, 13]).standard_normal((count, world)))
        x = q[:, rank]
    elif kind == "one":
        x = common if rank == 0 else np.zeros(count)
    else:
        raise ValueError(kind)
    return x.astype(dtype)


def _stored(x, dtype):
    """`x` (float64) as a rank stores it: 16-bit types go through float32 (csrc/adasum_math.cc)."""
    if dtype.itemsize == 2:
        x = x.astype(np.float32)
    return x.astype(dtype).astype(np.float64)


def reference(inputs, dtype):
    """Horovod's Adasum of `inputs` (one array per rank, in rank order), paired
    as its vector halving pairs them: ranks 2i and 2i+1 first, then those pairs
    two by two, and so on; each level's result rounded to `dtype` as the ranks
    store it. In float64 like the ranks' dot products and coefficients."""
    dtype = np.dtype(dtype)
    level = [np.asarray(x, np.float64) for x in inputs]
    while len(level) > 1:
        combined = []
        for a, b in zip(level[::2], level[1::2]):
            dot, a_sq, b_sq = float(a @ b), float(a @ a), float(b @ b)
            a_coeff = 1.0 - dot / a_sq * 0.5 if a_sq >= _TINY else 1.0
            b_coeff = 1.0 - dot / b_sq * 0.5 if b_sq >= _TINY else 1.0
            combined.append(_stored(a_coeff * a + b_coeff * b, dtype))
        level = combined
    return level[0]


def adasum_cases(rank, world, cases):
    """Runs every (dtype name, count, kind) case of `cases`, in place and into
    `out=`; returns this rank's results, in place first then out= for each case.
    The input must be unchanged by out=."""
    comm = rcoll.init(rank, world, timeout=60)
    results = []
    for dtype, count, kind in cases:
        x = rank_input(rank, world, dtype, count, kind)
        out = np.full_like(x, np.nan)
        assert comm.adasum(x, out=out) is out
        assert np.array_equal(x, rank_input(rank, world, dtype, count, kind)), "out= changed the input"
        assert comm.adasum(x) is x
        results.append((x, out))
    comm.shutdown()
    return results


def refusals(rank, world):
    """Adasum's refusals, each (error class name, message): raised at the call,
    before anything is queued, so the communicator still works afterwards."""
    comm = rcoll.init(rank, world, timeout=30)
    calls = [lambda: comm.adasum(np.ones(5, np.float32)),  # refused for the world size when it is not 2^k
             lambda: comm.adasum(np.ones(5, np.int32)),
             lambda: comm.adasum(np.ones(5, np.float32), out=np.ones(5, np.float64)),
             lambda: comm.adasum(np.ones(5, np.float32), out=np.ones(4, np.float32))]
    if BFLOAT16 is not None:
        calls.append(lambda: comm.adasum(np.ones(5, ml_dtypes.float8_e4m3fn)))
    found = []
    for call in calls:
        try:
            call()
            found.append(("ok", ""))
        except rcoll.RcollError as e:
            found.append((type(e).__name__, str(e)))
    x = np.full(3, rank + 1.0)
    comm.allreduce(x)  # still healthy
    comm.shutdown()
    return found, x.tolist()


def _outcome(fn):
    t0 = time.monotonic()
    try:
        fn()
        return ("ok", "", time.monotonic() - t0)
    except rcoll.RcollError as e:
        return (type(e).__name__, str(e), time.monotonic() - t0)


def mismatch(rank, world, kind):
    """Rank 1 calls something else than the others' adasum(float32, count=1000)
    after a barrier (so that no rank fails under one still connecting). Returns
    the outcome of that call, or of the barrier after it where the call passed
    (a rank that never met rank 1's messages learns it there)."""
    comm = rcoll.init(rank, world, timeout=20)
    comm.barrier()
    odd = rank == 1
    x = np.ones(1001 if odd and kind == "count" else 1000, np.float64 if odd and kind == "dtype" else np.float32)
    first = _outcome(lambda: comm.allreduce(x) if odd and kind == "op_kind" else comm.adasum(x))
    if first[0] != "ok":
        return first
    second = _outcome(comm.barrier)
    return second[0], second[1], first[2] + second[2]


def silent_peer(rank, world):
    """Rank 1 never joins: rank 0's adasum times out after 1.5 s, naming it."""
    comm = rcoll.init(rank, world, timeout=20)
    comm.barrier()
    if rank == 1:
        time.sleep(3)  # by now rank 0 has given up and told us why
    return _outcome(lambda: comm.adasum(np.ones(1 << 16, np.float32), timeout=1.5 if rank == 0 else 10))


def dead_peer(rank, world):
    """The last rank dies (no clean shutdown) before the adasum; the others must
    fail with a PeerError naming it, and their next op at once."""
    import os

    comm = rcoll.init(rank, world, timeout=30)
    comm.barrier()
    if rank == world - 1:
        os._exit(3)
    first = _outcome(lambda: comm.adasum(np.ones(1 << 20, np.float32)))
    later = _outcome(lambda: comm.adasum(np.ones(4, np.float32)))
    return first, later
