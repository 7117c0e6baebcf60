"""Rank bodies for tests/collectives/test_shm.py."""
import os
import time

import numpy as np

import rcoll


def transport_of(rank, world):
    comm = rcoll.init(timeout=60)
    x = np.full(100_000, rank + 1, np.float64)
    comm.allreduce(x)
    assert (x == world * (world + 1) / 2).all()
    transport = comm.transport
    comm.shutdown()
    return transport


def killed_mid_collective(rank, world):
    comm = rcoll.init(timeout=60)
    comm.allreduce(np.ones(10, np.float32))
    if rank == world - 1:
        os.kill(os.getpid(), 9)
    time.sleep(0.2)
    start = time.monotonic()
    try:
        comm.allreduce(np.ones(4 << 20, np.float32))
    except rcoll.RcollError as exc:
        return type(exc).__name__, str(exc), time.monotonic() - start
    return "no error", "", 0.0
