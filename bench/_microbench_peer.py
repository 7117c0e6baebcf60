"""Shared pieces of bench/test_microbench.py: the op bodies and the rank-1 peer process.

The peer is a separate module (not the test module) so that a spawned process can
import it however pytest imported the tests.
"""
from __future__ import annotations

import os
import queue

import numpy as np

WORLD = 2
DTYPE = np.float32


def make_op(comm, op: str, nbytes: int):
    """(call, check) for one op at one size, nccl-tests sizes: `nbytes` is the per-rank buffer
    for allreduce and broadcast, the gathered output for allgather, the input for reduce_scatter.

    Every call computes the same result (allreduce is out of place, broadcast is idempotent),
    so check() can verify the last one. check() returns the number of wrong elements.
    broadcast's root is the last rank, so rank 0 (the one pytest-benchmark times) receives.
    """
    rank, world = comm.rank, comm.size
    esize = np.dtype(DTYPE).itemsize
    if op in ("allgather", "reduce_scatter"):
        per = max(1, nbytes // (world * esize))
        n_in, n_out = (per, per * world) if op == "allgather" else (per * world, per)
    else:
        n_in = n_out = max(1, nbytes // esize)

    def pattern(r, n, offset=0):
        return (np.arange(offset, offset + n) % 13 + r + 1).astype(DTYPE)

    src = pattern(rank, n_in)
    if op == "allreduce":
        dst = np.zeros(n_out, DTYPE)
        want = sum(pattern(r, n_in).astype(np.float64) for r in range(world))

        def call():
            comm.allreduce(src, "sum", out=dst)
    elif op == "broadcast":
        root = world - 1
        dst = src
        want = pattern(root, n_in).astype(np.float64)

        def call():
            comm.broadcast(src, root)
    elif op == "allgather":
        dst = np.zeros(n_out, DTYPE)
        want = np.concatenate([pattern(r, n_in) for r in range(world)]).astype(np.float64)

        def call():
            comm.allgather(src, out=dst)
    elif op == "reduce_scatter":
        dst = np.zeros(n_out, DTYPE)
        want = sum(pattern(r, n_out, offset=rank * n_out).astype(np.float64) for r in range(world))

        def call():
            comm.reduce_scatter(src, "sum", out=dst)
    else:
        raise ValueError(f"unknown op {op!r}")

    def check():
        return int(np.count_nonzero(dst.astype(np.float64) != want))

    return call, check


def peer_main(port: int, commands, replies, op_timeout: float, idle_timeout: float, env: dict):
    """Rank 1: runs the (op, nbytes, count) commands rank 0 sends, in order, until "stop".

    Replies ("ready",) once connected, then ("done", count, wrong) per command, or
    ("error", text) and exits. Exits by itself if no command comes for idle_timeout s.
    """
    os.environ.update({k: str(v) for k, v in env.items()})
    os.environ.update(RANK="1", WORLD_SIZE=str(WORLD), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    comm = None
    try:
        import rcoll
        comm = rcoll.init(timeout=op_timeout)
        replies.put(("ready",))
        ops = {}
        while True:
            try:
                cmd = commands.get(timeout=idle_timeout)
            except queue.Empty:
                replies.put(("error", f"peer: no command for {idle_timeout} s, exiting"))
                return
            if cmd[0] == "stop":
                break
            _, op, nbytes, count = cmd
            if (op, nbytes) not in ops:
                ops[(op, nbytes)] = make_op(comm, op, nbytes)
            call, check = ops[(op, nbytes)]
            for _ in range(count):
                call()
            replies.put(("done", count, check()))
        comm.shutdown()
        comm = None
    except BaseException as exc:  # reported to rank 0, which fails the test with it
        import traceback
        replies.put(("error", f"peer (rank 1): {type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        if comm is not None:
            try:
                comm.abort("peer exiting after an error")
            except Exception:
                pass
