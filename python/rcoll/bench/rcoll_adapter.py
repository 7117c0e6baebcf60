"""The rcoll backend of the sweep, inside one rank: rcoll's numpy API."""
from __future__ import annotations

import numpy as np

from .check import pattern


class RcollRank:
    name = "rcoll"

    def __init__(self, timeout):
        import rcoll
        self.comm = rcoll.init(timeout=timeout)
        self.rank, self.world = self.comm.rank, self.comm.size

    def np_dtype(self, dtype):
        if dtype == "bfloat16":
            import ml_dtypes  # noqa: F401  (rcoll takes bfloat16 through ml_dtypes)
            return np.dtype(ml_dtypes.bfloat16)
        return np.dtype(dtype)

    def setup(self, op, dtype, n_in, n_out):
        dt = self.np_dtype(dtype)
        src = np.empty(n_in, dt)
        dst = src if op in ("allreduce", "broadcast") else np.empty(n_out, dt)
        comm = self.comm
        if op == "allreduce":
            call = lambda a: comm.allreduce(src, "sum", async_op=a)  # noqa: E731
        elif op == "broadcast":
            call = lambda a: comm.broadcast(src, 0, async_op=a)  # noqa: E731
        elif op == "allgather":
            call = lambda a: comm.allgather(src, out=dst, async_op=a)  # noqa: E731
        else:
            call = lambda a: comm.reduce_scatter(src, "sum", out=dst, async_op=a)  # noqa: E731

        def fill():
            src[...] = pattern(self.rank, n_in).astype(dt)
            if dst is not src:
                dst[...] = np.zeros(n_out, dt)
        return call, fill, lambda: np.asarray(dst).astype(np.float64)

    def run(self, call, iters, use_async):
        if use_async:
            handles = [call(True) for _ in range(iters)]
            for h in handles:
                h.wait()
        else:
            for _ in range(iters):
                call(False)

    def barrier(self):
        self.comm.barrier()

    def close(self):
        self.comm.shutdown()
