"""What every rank of a backend runs: each (op, size) in turn, warm-up
iterations, a barrier, timed iterations, then one more op on freshly filled
buffers whose result is checked element by element. The same code whether
rcoll.spawn, mpirun or `ip netns exec` started the rank (launched_rank)."""
from __future__ import annotations

import sys
import time

from .check import count_wrong, expected
from .mpi_adapter import MpiRank
from .ops import DTYPES, layout
from .rcoll_adapter import RcollRank
from .torch_adapter import GlooRank, TorchRcollRank

RANK_CLASSES = {"rcoll": RcollRank, "torch-rcoll": TorchRcollRank, "gloo": GlooRank, "mpi": MpiRank, "mpi-shm": MpiRank}


def default_iters(nbytes: int) -> int:
    """About 0.3-1 s per size on loopback: many iterations when small, few when large."""
    return max(5, min(200, int(2e8 / max(nbytes, 1))))


def default_warmup(iters: int) -> int:
    return max(2, min(20, iters // 10))


def rank_main(rank, world, backend, cfg):
    """One rank of one backend: every (op, size). Module level, so spawned processes can import it."""
    b = RANK_CLASSES[backend](cfg["op_timeout"])
    esize = DTYPES[cfg["dtype"]]
    rows = []
    total = len(cfg["ops"]) * len(cfg["sizes"])
    try:
        for op in cfg["ops"]:
            for size in cfg["sizes"]:
                size_used, n_in, n_out = layout(op, size, world, esize)
                row = {"op": op, "bytes": size_used, "count": size_used // esize, "dtype": cfg["dtype"],
                       "rank": rank}
                if n_in == 0:
                    row["error"] = f"size {size} is smaller than world*element size"
                    rows.append(row)
                    continue
                iters = cfg["iters"] or default_iters(size_used)
                warmup = cfg["warmup"] if cfg["warmup"] is not None else default_warmup(iters)
                row.update(iters=iters, warmup=warmup)
                try:
                    call, fill, result = b.setup(op, cfg["dtype"], n_in, n_out)
                    fill()
                    b.run(call, warmup, cfg["async"])
                    b.barrier()
                    t0 = time.perf_counter()
                    b.run(call, iters, cfg["async"])
                    elapsed = time.perf_counter() - t0
                    fill()
                    b.barrier()
                    call(False)
                    row["wrong"] = count_wrong(result(), expected(op, rank, world, n_in, n_out))
                    row["time_us"] = elapsed / iters * 1e6
                except Exception as exc:  # an op the backend lacks: record it, go on with the next op
                    row["error"] = f"{type(exc).__name__}: {exc}"
                    rows.append(row)
                    if rank == 0:
                        print(f"[{backend}] {op} {size_used} B: FAILED: {row['error']}", file=sys.stderr, flush=True)
                    break
                rows.append(row)
                if rank == 0:
                    print(f"[{backend} world {world} {len(rows)}/{total}] {op:<14} {size_used:>10} B "
                          f"{row['time_us']:10.1f} us (rank 0, {iters} iters)", file=sys.stderr, flush=True)
    finally:
        try:
            b.close()
        except Exception:
            pass
    return rows
