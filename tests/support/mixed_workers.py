"""Per-rank bodies of tests/collectives/test_mixed.py: rings whose edges use different
transports (shared memory inside a host, the network between hosts)."""
import os
import signal
import time

import numpy as np

import rcoll
from support.reference import DTYPES, make_input, same


def report(rank, world):
    """This rank's transport and per-rank edges, after traffic on every edge."""
    comm = rcoll.init(rank, world, timeout=60)
    x = np.full(100_003, rank + 1, np.float64)
    comm.allreduce(x)
    ok = bool((x == world * (world + 1) / 2).all())
    everyone = comm.alltoall(np.arange(world, dtype=np.int64) + 100 * rank)  # one message on every edge
    ok &= everyone.tolist() == [100 * j + rank for j in range(world)]
    out = (comm.transport, comm.transports, ok)
    comm.shutdown()
    return out


def barrier_and_ring_messages(rank, world):
    """Barriers, and send/recv around the ring and across it (every kind of edge
    in a mixed layout), every dtype, sizes 0, 1, odd and large."""
    comm = rcoll.init(rank, world, timeout=60)
    failures = []
    for _ in range(5):
        comm.barrier()
    for step in range(1, world):
        to, frm = (rank + step) % world, (rank - step) % world
        for dtype in DTYPES:
            for n in (0, 1, 1001, 300_001):
                x = make_input(step, rank, dtype, n, "max")
                got = np.empty_like(x)
                h = comm.recv(got, frm, tag=step, async_op=True)
                comm.send(x, to, tag=step)
                h.wait()
                if not same(got, make_input(step, frm, dtype, n, "max")):
                    failures.append(f"step {step}: {dtype} n={n} from rank {frm}")
        comm.barrier()
    comm.shutdown()
    return 1, failures


def killed_mid_collective(rank, world, victim):
    comm = rcoll.init(rank, world, timeout=60)
    comm.allreduce(np.ones(10, np.float32))
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.2)
    start = time.monotonic()
    try:
        comm.allreduce(np.ones(4 << 20, np.float32))
    except rcoll.RcollError as exc:
        return type(exc).__name__, str(exc), time.monotonic() - start, comm.transports
    return "no error", "", 0.0, comm.transports


def abort_reaches_everyone(rank, world, aborter):
    """`aborter` aborts while the others sit in an allreduce that waits for it:
    each raises with its text."""
    comm = rcoll.init(rank, world, timeout=60)
    comm.allreduce(np.ones(10, np.float32))
    start = time.monotonic()
    if rank == aborter:
        time.sleep(0.5)
        comm.abort(f"rank {rank} gives up on purpose")
    try:
        comm.allreduce(np.ones(1 << 20, np.float32))
    except rcoll.RcollError as exc:
        return type(exc).__name__, str(exc), time.monotonic() - start
    return "no error", "", 0.0


def init_outcome(rank, world):
    try:
        comm = rcoll.init(rank, world, timeout=30)
    except rcoll.RcollError as exc:
        return type(exc).__name__, str(exc)
    comm.shutdown()
    return "ok", ""


def torch_all_reduce(rank, world):
    """torch.distributed with backend "rcoll" over the ring this rank's RCOLL_HOSTID gives."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import rcoll.torch_backend  # noqa: F401

    dist.init_process_group("rcoll", init_method="env://", timeout=timedelta(seconds=60))
    failures = []
    for dtype in (torch.float32, torch.float64, torch.int64, torch.bfloat16):
        for n in (0, 1, 7, 1001, 1 << 20):
            t = (torch.arange(n) % 13 + rank).to(dtype)
            want = sum((torch.arange(n) % 13 + r).to(torch.float64) for r in range(world)).to(dtype)
            dist.all_reduce(t)
            if not torch.equal(t, want):
                failures.append(f"all_reduce {dtype} n={n}")
    transports = _rcoll_group(dist)._comm.transports
    dist.destroy_process_group()
    return failures, transports


def _rcoll_group(dist):
    """The RcollProcessGroup behind torch's default group."""
    import torch

    pg = dist.distributed_c10d._get_default_group()
    if hasattr(pg, "_comm"):
        return pg
    return pg._get_backend(torch.device("cpu"))


def idle_wait_cpu(rank, world):
    """The last rank arrives 2 s late: the others wait inside an allreduce. Returns
    the CPU seconds this process spent in that wait (all threads) and its wall time:
    a composite transport must sleep in poll(), not spin, and wake when data comes."""
    comm = rcoll.init(rank, world, timeout=60)
    comm.allreduce(np.ones(10, np.float32))
    if rank == world - 1:
        time.sleep(2.0)
    cpu0, wall0 = time.process_time(), time.monotonic()
    x = np.full(1000, rank + 1, np.float32)
    comm.allreduce(x)
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    ok = bool((x == world * (world + 1) / 2).all())
    name = comm.transport
    comm.shutdown()
    return name, cpu, wall, ok


def topology(rank, world):
    comm = rcoll.init(rank, world, timeout=60)
    comm.barrier()
    return comm.topology


def allreduce_allgather_then_shutdown(rank, world):
    """An allreduce above the recursive doubling size, an allgather above
    Bruck's and one below it (for the algorithms they take, in the
    timeline); shutdown closes the trace file."""
    comm = rcoll.init(rank, world, timeout=60)
    x = np.full(1 << 16, rank + 1, np.float32)
    comm.allreduce(x)
    ok = bool((x == world * (world + 1) / 2).all())
    for n in (1 << 13, 3):
        gathered = comm.allgather(np.full(n, rank, np.int64))
        ok &= gathered.ravel().tolist() == [r for r in range(world) for _ in range(n)]
    comm.shutdown()
    return ok


def long_schedules(rank, world):
    """Allreduce, reduce_scatter and allgather with many more segments per block
    than the executor's send window (64) holds, exact against numpy: with small
    chunks and small shared-memory rings, sends inside a host wait on their
    receiver while sends across wait in the same window (issue #20 review)."""
    comm = rcoll.init(rank, world, timeout=60)
    n = 1 << 20
    x = (np.arange(n, dtype=np.int64) * (rank + 3) % 1009).astype(np.int32)
    expected = sum((np.arange(n, dtype=np.int64) * (r + 3) % 1009) for r in range(world)).astype(np.int32)
    failures = []
    got = comm.allreduce(x.copy())
    if not same(got, expected):
        failures.append("allreduce differs")
    shard = comm.reduce_scatter(x)
    if not same(shard, expected.reshape(world, -1)[rank]):
        failures.append("reduce_scatter differs")
    gathered = comm.allgather(x[: n // 2])
    want = np.concatenate([(np.arange(n // 2, dtype=np.int64) * (r + 3) % 1009).astype(np.int32) for r in range(world)])
    if not same(gathered.reshape(-1), want):
        failures.append("allgather differs")
    comm.shutdown()
    return 1, failures
