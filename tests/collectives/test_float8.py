"""float8_e4m3fn and float8_e5m2 (csrc/float8.h): every pair of values, every
reduce op, bit for bit against ml_dtypes, which rounds as torch's Tensor.to()
does (nearest-even; not saturating: e4m3fn overflows to NaN, e5m2 to inf)."""
import numpy as np
import pytest

from collectives import float8_workers as w
from rcoll import spawn

ml_dtypes = pytest.importorskip("ml_dtypes")

OPS = ["sum", "prod", "min", "max", "avg"]


def _expected(dtype, op):
    codes = np.arange(256, dtype=np.uint8)
    a = np.tile(codes, 256).view(dtype).astype(np.float32)
    b = np.repeat(codes, 256).view(dtype).astype(np.float32)
    if op == "avg":  # sum rounded to the format, then divided in float32 and rounded again (as documented)
        with np.errstate(invalid="ignore", over="ignore"):
            total = (a + b).astype(dtype).astype(np.float32)
            return (total / np.float32(2)).astype(dtype)
    with np.errstate(invalid="ignore", over="ignore"):  # inf * 0, overflows: the cases under test
        combined = {"sum": a + b, "prod": a * b, "min": np.minimum(a, b), "max": np.maximum(a, b)}[op]
        return combined.astype(dtype)


def _nan(values):
    return np.isnan(values.astype(np.float32))


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_every_pair_of_values_reduces_as_ml_dtypes_rounds(name):
    dtype = np.dtype(getattr(ml_dtypes, name))
    results = spawn.run(w.every_pair, 2, name, OPS, timeout=120)
    for op in OPS:
        want = _expected(dtype, op)
        for rank, result in enumerate(results):
            got = np.frombuffer(result[op], dtype=np.uint8).view(dtype)
            same = (got.view(np.uint8) == want.view(np.uint8)) | (_nan(got) & _nan(want))
            if op in ("min", "max"):  # which zero wins a -0/+0 tie is not numpy's contract either
                same |= (got.astype(np.float32) == 0) & (want.astype(np.float32) == 0)
            bad = np.flatnonzero(~same)
            assert bad.size == 0, (
                f"rank {rank} {name} {op}: {bad.size} of 65536 differ, first at pair "
                f"({bad[0] % 256:#04x}, {bad[0] // 256:#04x}): got {got.view(np.uint8)[bad[0]]:#04x}, "
                f"want {want.view(np.uint8)[bad[0]]:#04x}")
            # NaN is the format's own quiet NaN with its sign, as torch and ml_dtypes make it.
            assert np.array_equal(got.view(np.uint8)[_nan(got)] & 0x7f, want.view(np.uint8)[_nan(want)] & 0x7f)
