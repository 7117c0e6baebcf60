"""The Open MPI backend of the sweep (mpi, mpi-shm), inside one rank: mpi4py's
buffer calls on numpy arrays. Its ranks are started by mpirun (mpi_launch)."""
from __future__ import annotations

import numpy as np

from .check import pattern


class MpiRank:
    """Open MPI through mpi4py (numpy buffers); only runs under mpirun (see mpi_launch.run_mpi)."""
    name = "mpi"
    TYPES = {"float32": "FLOAT", "float64": "DOUBLE", "int32": "INT32_T", "int64": "INT64_T"}

    def __init__(self, timeout):
        from mpi4py import MPI  # MPI_Init happens here (mpi4py's default)
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.world = self.comm.Get_rank(), self.comm.Get_size()
        # MPI has no per-op timeout; mpi_launch.run_mpi bounds the whole run (--timeout) instead

    def setup(self, op, dtype, n_in, n_out):
        MPI, comm = self.MPI, self.comm
        if dtype not in self.TYPES:  # Open MPI 4.1 has no (portable) float16 / bfloat16 reductions
            raise NotImplementedError(f"dtype {dtype} is not supported by the mpi backend "
                                      f"(use one of {', '.join(self.TYPES)})")
        mt = getattr(MPI, self.TYPES[dtype])
        src = np.empty(n_in, np.dtype(dtype))
        dst = src if op in ("allreduce", "broadcast") else np.empty(n_out, np.dtype(dtype))
        s, d = [src, mt], [dst, mt]
        if op == "allreduce":  # in place, as for the other backends
            call = lambda a: (comm.Iallreduce if a else comm.Allreduce)(MPI.IN_PLACE, s, MPI.SUM)  # noqa: E731
        elif op == "broadcast":
            call = lambda a: (comm.Ibcast if a else comm.Bcast)(s, root=0)  # noqa: E731
        elif op == "allgather":
            call = lambda a: (comm.Iallgather if a else comm.Allgather)(s, d)  # noqa: E731
        else:
            call = lambda a: (comm.Ireduce_scatter_block if a else comm.Reduce_scatter_block)(s, d, MPI.SUM)  # noqa: E731

        def fill():
            src[...] = pattern(self.rank, n_in).astype(src.dtype)
            if dst is not src:
                dst[...] = 0
        return call, fill, lambda: dst.astype(np.float64)

    def run(self, call, iters, use_async):
        if use_async:
            self.MPI.Request.Waitall([call(True) for _ in range(iters)])
        else:
            for _ in range(iters):
                call(False)

    def barrier(self):
        self.comm.Barrier()

    def close(self):
        pass  # mpi4py finalizes MPI at exit
