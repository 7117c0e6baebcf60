"""Deterministic inputs and exact numpy references for the collective tests.

Every rank regenerates every other rank's input from a seed, so each rank can
check its own result without any extra communication. Values are chosen so
that any summation order gives the same bits: small integers for sum and avg,
factors of +-1 and 2 for prod, anything for min/max and the bitwise ops.
"""
import functools
import os

import numpy as np

try:
    import ml_dtypes
    BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
    FLOAT8 = [np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(ml_dtypes.float8_e5m2)]
except ImportError:  # bfloat16 and float8 cases are skipped without ml_dtypes
    BFLOAT16 = None
    FLOAT8 = []

DTYPES = [np.dtype(n) for n in ("float16", "float32", "float64", "int8", "uint8", "int16", "uint16", "int32",
                                "uint32", "int64", "uint64", "bool")]
if BFLOAT16 is not None:
    DTYPES.insert(1, BFLOAT16)
DTYPES += FLOAT8
# numpy has no float type of these: they are computed in float32 and rounded once.
NARROW_FLOATS = [d for d in [np.dtype(np.float16), BFLOAT16, *FLOAT8] if d is not None]
OPS = ["sum", "prod", "min", "max", "avg", "band", "bor", "bxor"]
SEEDED_DTYPES, SEEDED_OPS = list(DTYPES), list(OPS)  # inputs are seeded by these, whatever the matrix

# TEST_MATRIX=paths (a test's variable, not an rcoll setting): the suites that
# rerun the matrices for what lies under the reductions (the sanitized core,
# the verbs transport in the Soft-RoCE guest) take one dtype of each element
# size, narrow float and integer, and the reduce ops whose handling differs
# (avg divides after the sum; max is no sum): the other pairs only run other
# kernels, which the main suite checks on every transport, and the sanitized
# C++ unit of the kernels (test_cpp.py's test_reduce_kernels) under ASan/UBSan.
if os.environ.get("TEST_MATRIX") == "paths":
    DTYPES = [d for d in DTYPES if d.name in ("float16", "float32", "float64", "int8", "int64")]
    OPS = ["sum", "max", "avg"]
elif os.environ.get("TEST_MATRIX", "full") != "full":
    raise ValueError(f"TEST_MATRIX={os.environ['TEST_MATRIX']}: full (the default) or paths")


def is_float(dtype):
    return dtype.kind == "f" or dtype in NARROW_FLOATS


def supported(dtype, op):
    if op in ("band", "bor", "bxor"):
        return not is_float(dtype)
    if op == "avg":
        return is_float(dtype)
    return True


# Ranks that run as threads of one process (tests/support/rank_threads.py) each
# regenerate every rank's input: a small cache makes that once per process.
# make_input returns a copy (bodies write into their inputs); stacked() and
# reduced() return the cached, read-only arrays themselves.
CACHED_ELEMENTS = 1 << 16


def make_input(seed, rank, dtype, n, op="sum"):
    if n > CACHED_ELEMENTS:
        return _generate(seed, rank, dtype, n, op)
    return _cached_input(seed, rank, dtype, n, op).copy()


@functools.lru_cache(maxsize=1024)
def _cached_input(seed, rank, dtype, n, op):
    x = _generate(seed, rank, dtype, n, op)
    x.flags.writeable = False
    return x


def _generate(seed, rank, dtype, n, op):
    rng = np.random.default_rng([seed, rank, n, SEEDED_DTYPES.index(dtype) if dtype in SEEDED_DTYPES else 0,
                                 SEEDED_OPS.index(op)])
    if dtype == np.bool_:
        return rng.integers(0, 2, n).astype(np.bool_)
    signed = dtype.kind in "fi" or dtype in NARROW_FLOATS
    if op in ("sum", "avg"):
        # float8 holds every integer up to 8 (e5m2) exactly: partial sums of
        # up to 8 ranks' -1/0/1 are exact in any order.
        lo, hi = (-1, 2) if dtype in FLOAT8 else (-3, 4) if signed else (0, 4)
        return rng.integers(lo, hi, n).astype(np.float64).astype(dtype)
    if op == "prod":
        choices = np.array([1, 2, -1] if signed else [1, 2, 3])
        return choices[rng.integers(0, len(choices), n)].astype(np.float64).astype(dtype)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return rng.integers(info.min, info.max, n, endpoint=True, dtype=dtype)
    if dtype in FLOAT8:  # min/max: anything finite of the format
        return (rng.standard_normal(n) * 8).astype(np.float32).astype(dtype)
    return rng.standard_normal(n).astype(np.float32).astype(dtype) * 100


def reduce_reference(stack, dtype, op, world):
    """Reduces axis 0 of `stack` the way rcoll defines each op."""
    if dtype == np.bool_:
        if op in ("sum", "max", "bor"):
            return np.logical_or.reduce(stack, axis=0)
        if op in ("prod", "min", "band"):
            return np.logical_and.reduce(stack, axis=0)
        return np.logical_xor.reduce(stack, axis=0)
    if op == "avg":
        compute = np.float64 if dtype == np.float64 else np.float32
        total = np.add.reduce(stack.astype(np.float64), axis=0).astype(compute)
        return (total / compute(world)).astype(dtype)
    ufunc = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
             "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}[op]
    if dtype in NARROW_FLOATS:
        # Exact in float32 for the chosen values, then one rounding.
        return ufunc.reduce(stack.astype(np.float32), axis=0).astype(dtype)
    return ufunc.reduce(stack, axis=0, dtype=dtype)


def same(a, b):
    """Bitwise equality that treats NaN == NaN."""
    a = np.asarray(a)
    b = np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if is_float(a.dtype):
        fa, fb = a.astype(np.float64), b.astype(np.float64)
        return bool(np.all((fa == fb) | (np.isnan(fa) & np.isnan(fb))))
    return bool(np.array_equal(a, b))


def differences(got, expected, limit=5):
    """'wrong at [i, ...]: got [...] expected [...]' for the first mismatching elements."""
    bad = np.flatnonzero(np.asarray(got).astype(np.float64) != np.asarray(expected).astype(np.float64))[:limit]
    got, expected = np.asarray(got).ravel(), np.asarray(expected).ravel()
    return f"wrong at {bad.tolist()}: got {got[bad].tolist()} expected {expected[bad].tolist()}"


def stacked(seed, world, dtype, n, op="sum"):
    """Every rank's input, one row each (read-only when cached)."""
    if n > CACHED_ELEMENTS:
        return np.stack([_generate(seed, r, dtype, n, op) for r in range(world)])
    return _cached_stack(seed, world, dtype, n, op)


def reduced(seed, world, dtype, n, op):
    """The exact result of reducing every rank's input with `op` (read-only when cached)."""
    if n > CACHED_ELEMENTS:
        return reduce_reference(stacked(seed, world, dtype, n, op), dtype, op, world)
    return _cached_reduction(seed, world, dtype, n, op)


@functools.lru_cache(maxsize=256)
def _cached_stack(seed, world, dtype, n, op):
    x = np.stack([_cached_input(seed, r, dtype, n, op) for r in range(world)])
    x.flags.writeable = False
    return x


@functools.lru_cache(maxsize=256)
def _cached_reduction(seed, world, dtype, n, op):
    x = reduce_reference(_cached_stack(seed, world, dtype, n, op), dtype, op, world)
    x.flags.writeable = False
    return x
