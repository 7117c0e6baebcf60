"""Rank bodies for the verbs tests (tests/rdma/test_verbs.py), run inside the Soft-RoCE guest."""
import gc
import time

import numpy as np
from support.runtime_connect_workers import exchange_with_every_peer

import rcoll


def transport_of(rank, world):
    comm = rcoll.init(rank, world, timeout=60)
    x = np.full(1000, rank + 1, np.float32)
    comm.allreduce(x)
    assert (x == world * (world + 1) / 2).all()
    return comm.transport


def edges_metered(rank, world):
    """What the verbs transport's meter says after an allreduce whose segments
    are large enough to count (csrc/edge_meter.h): one edge out to each ring
    neighbour that carried bytes, in some time."""
    comm = rcoll.init(rank, world, timeout=60)
    x = np.full(1 << 20, rank + 1, np.float32)
    comm.allreduce(x)
    assert (x == world * (world + 1) / 2).all()
    return sorted((e["peer"], e["direction"], e["transport"], e["bytes"] >= 1 << 20, e["seconds"] > 0)
                  for e in comm._comm.edge_traffic())


def recv_from_any_over_verbs(rank, world):
    """Verbs cannot show a message before its receive is posted (the sender waits
    for the receiver's credit): a receive from any source says so and names the
    way out, and the communicator goes on working."""
    comm = rcoll.init(rank, world, timeout=60)
    message = None
    try:
        comm.recv(np.empty(1), None)
    except ValueError as e:
        message = str(e)
    x = np.ones(4, np.float32)
    comm.allreduce(x)
    return message, x.tolist()


def buffer_reuse_and_free(rank, world, rounds=30):
    """The registration cache: the same buffer every step (hits), then buffers freed
    and re-allocated at once, so that addresses are reused by other pages."""
    comm = rcoll.init(rank, world, timeout=120)
    expect = world * (world + 1) / 2
    bucket = np.zeros(300_000, np.float32)
    for i in range(rounds):
        bucket[:] = rank + 1 + i
        comm.allreduce(bucket)
        assert (bucket == expect + world * i).all(), i
    for i in range(rounds):
        fresh = np.full(250_000 + 1000 * (i % 3), rank + 1 + i, np.float64)  # malloc reuses freed chunks
        comm.allreduce(fresh)
        assert (fresh == expect + world * i).all(), i
        del fresh
        gc.collect()
    # Memory the Python layer cannot watch (a bytearray) is dropped after each op.
    for i in range(5):
        raw = bytearray(np.full(4096, rank + i, np.int32).tobytes())
        view = np.frombuffer(raw, np.int32)
        comm.allreduce(view)
        assert (view == sum(range(world)) + world * i).all()
    return True


def killed_mid_collective(rank, world):
    comm = rcoll.init(rank, world, timeout=60)
    comm.allreduce(np.ones(10, np.float32))
    if rank == world - 1:
        import os
        os._exit(3)
    time.sleep(0.3)
    start = time.monotonic()
    try:
        comm.allreduce(np.ones(1 << 20, np.float32))
    except rcoll.RcollError as exc:
        return type(exc).__name__, str(exc), time.monotonic() - start
    return "no error", "", 0.0


def every_pair_named(rank, world):
    """exchange_with_every_peer (by name: verbs cannot receive from any source),
    then an alltoall and an allreduce: with a host per rank, most pairs
    connect on first use, some in the middle of the alltoall."""
    comm = rcoll.init(rank, world, timeout=120)
    exchange_with_every_peer(comm, rank, world)
    out = comm.alltoall(np.arange(world, dtype=np.int64) + 100 * rank)
    assert out.tolist() == [100 * p + rank for p in range(world)], out
    assert (comm.allreduce(np.ones(8, np.float32)) == world).all()
    comm.shutdown()
    return True


def gone_during_the_queue_pair_exchange(rank, world):
    """Rank 0 sends to rank 1, which never receives: rank 1's connector makes
    the connection, but its idle point-to-point thread never swaps queue
    pairs, and the process exits. Rank 0's send fails naming rank 1, without
    waiting for the timeout."""
    comm = rcoll.init(rank, world, timeout=60)
    comm.barrier()
    if rank == 1:
        time.sleep(3)
        import os
        os._exit(3)
    start = time.monotonic()
    try:
        comm.send(np.ones(4, np.float32), 1)
    except rcoll.RcollError as exc:
        return type(exc).__name__, str(exc), time.monotonic() - start
    return "no error", "", time.monotonic() - start


def set_up_and_allreduce(rank, world):
    """The communicator's set-up and one allreduce: ("ok", "", seconds) or the error's class, text and when."""
    start = time.monotonic()
    try:
        comm = rcoll.init(rank, world, timeout=60)
        x = np.ones(4, np.float32)
        comm.allreduce(x)
        comm.shutdown()
    except rcoll.RcollError as exc:
        return type(exc).__name__, str(exc), time.monotonic() - start
    return "ok", "", time.monotonic() - start


def transport_and_gid(rank, world):
    """This rank's transport, whether an allreduce over it was exact, and the port and GID it chose."""
    from rcoll import _core
    comm = rcoll.init(rank, world, timeout=60)
    x = np.full(100_003, rank + 1, np.float64)
    comm.allreduce(x)
    out = (comm.transport, bool((x == world * (world + 1) / 2).all()), _core.rdma_report()["selection"])
    comm.shutdown()
    return out
