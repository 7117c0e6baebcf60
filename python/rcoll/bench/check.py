"""The check op's input pattern and expected values (numpy, float64), and the
count of wrong elements: each rank fills its input with small integers that
every dtype holds exactly, so any difference is an error, not rounding.
"""
from __future__ import annotations

import numpy as np

PATTERN_PERIOD = 13  # input element i of rank r is (i % 13) + r + 1: small integers, exact in every dtype


def pattern(rank: int, n: int, offset: int = 0) -> np.ndarray:
    return (np.arange(offset, offset + n, dtype=np.int64) % PATTERN_PERIOD + rank + 1).astype(np.float64)


def expected(op: str, rank: int, world: int, n_in: int, n_out: int) -> np.ndarray:
    if op == "allreduce":
        return sum(pattern(r, n_in) for r in range(world))
    if op == "broadcast":
        return pattern(0, n_in)
    if op == "allgather":
        return np.concatenate([pattern(r, n_in) for r in range(world)])
    if op == "reduce_scatter":
        return sum(pattern(r, n_out, offset=rank * n_out) for r in range(world))
    raise ValueError(op)


def count_wrong(got64: np.ndarray, want: np.ndarray) -> int:
    if got64.shape != want.shape:
        return int(max(got64.size, want.size))
    return int(np.count_nonzero(got64 != want))
