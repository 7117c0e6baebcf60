"""Rank bodies for tests/collectives/test_float8.py (spawned: must be importable)."""
import numpy as np

import rcoll


def every_pair(rank, world, dtype_name, ops):
    """Rank 0 holds every float8 value 256 times over, rank 1 each value 256
    times in a row: a world-2 allreduce combines every pair once. Returns, per
    op, the result's bytes (checked against ml_dtypes by the test)."""
    import ml_dtypes

    dtype = np.dtype(getattr(ml_dtypes, dtype_name))
    codes = np.arange(256, dtype=np.uint8)
    mine = np.tile(codes, 256) if rank == 0 else np.repeat(codes, 256)
    comm = rcoll.init(rank, world)
    out = {}
    for op in ops:
        x = mine.view(dtype).copy()
        comm.allreduce(x, op=op)
        out[op] = x.view(np.uint8).tobytes()
    comm.shutdown()
    return out
