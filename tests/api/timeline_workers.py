"""Rank body for tests/api/test_timeline.py."""
import numpy as np

import rcoll


def some_ops(rank, world):
    comm = rcoll.init(timeout=60)
    comm.allreduce(np.ones(1 << 18, np.float32))  # several segments: reduce slices
    comm.allgather(np.ones(10))
    comm.barrier()
    if rank == 0:
        comm.send(np.ones(5), 1)
    elif rank == 1:
        comm.recv(np.empty(5), 0)
    comm.shutdown()  # closes the timeline file
    return True


def two_communicators(rank, world, port):
    """Two communicators in one process (as torch sub-groups are): one trace file each."""
    first = rcoll.init(timeout=60)
    second = rcoll.init(timeout=60, master_port=port)
    first.allreduce(np.ones(4, np.float32))
    second.allgather(np.ones(3))
    second.shutdown()
    first.shutdown()
    return True
