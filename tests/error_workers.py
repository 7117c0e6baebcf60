"""Per-rank bodies of the failure tests. Each returns (error class name, message) or a result."""
import os
import threading
import time

import numpy as np

import rcoll


def _outcome(fn):
    t0 = time.monotonic()
    try:
        value = fn()
        return ("ok", value, time.monotonic() - t0)
    except rcoll.RcollError as e:
        return (type(e).__name__, str(e), time.monotonic() - t0)


def mismatch(rank, world, kind):
    """Rank 1 calls something different from the others. Returns the first
    outcome and, if that op succeeded, the outcome of the next one."""
    comm = rcoll.init(timeout=20)
    first = _mismatched_call(comm, rank, kind)
    if first[0] != "ok":
        return first
    # A rank that only sent (a broadcast root) cannot have seen the mismatch;
    # its next op must fail with it.
    second = _outcome(lambda: comm.barrier())
    return second[0], second[1], first[2] + second[2]


def _mismatched_call(comm, rank, kind):
    odd = rank == 1
    n = 1000 + (1 if odd and kind == "count" else 0)
    dtype = np.float64 if odd and kind == "dtype" else np.float32
    x = np.ones(n, dtype)
    if kind == "op_kind" and odd:
        return _outcome(lambda: comm.broadcast(x, root=0))
    if kind == "reduce_op":
        return _outcome(lambda: comm.allreduce(x, "max" if odd else "sum"))
    if kind == "root":
        return _outcome(lambda: comm.broadcast(x, root=1 if odd else 0))
    return _outcome(lambda: comm.allreduce(x))


def dead_peer(rank, world):
    """The last rank dies (no clean shutdown) in the middle of the job."""
    comm = rcoll.init(timeout=30)
    comm.allreduce(np.ones(10, np.float32))
    if rank == world - 1:
        os._exit(3)
    time.sleep(0.3)
    big = np.ones(4 << 20, np.float32)
    first = _outcome(lambda: comm.allreduce(big))
    later = _outcome(lambda: comm.allreduce(np.ones(4, np.float32)))
    return first, later


def silent_peer(rank, world):
    """Rank 1 never joins the collective: rank 0 times out naming it."""
    comm = rcoll.init()
    if rank == 1:
        time.sleep(4)
        # By now rank 0 has given up and told us why.
        return _outcome(lambda: comm.allreduce(np.ones(8, np.float32), timeout=10))
    return _outcome(lambda: comm.allreduce(np.ones(8, np.float32), timeout=1.5))


def abort_from_thread(rank, world):
    comm = rcoll.init()
    if rank == 1:
        time.sleep(3)
        return ("ok", None, 0)
    threading.Timer(0.5, comm.abort, args=("test abort",)).start()
    first = _outcome(lambda: comm.allreduce(np.ones(8, np.float32), timeout=60))
    later = _outcome(lambda: comm.barrier())
    return first, later


def late_rank(rank, world, delay):
    """The last rank joins late, so that strays can knock on rank 0's door first."""
    if rank == world - 1:
        time.sleep(delay)
    comm = rcoll.init()
    x = np.arange(1000, dtype=np.float32) * (rank + 1)
    comm.allreduce(x)
    return bool(np.array_equal(x, np.arange(1000, dtype=np.float32) * sum(range(1, world + 1))))


def bad_arguments(rank, world):
    """Every bad call raises InvalidArgumentError (a ValueError) and the communicator still works."""
    comm = rcoll.init()
    messages = []
    bad_calls = [
        lambda: comm.allreduce(np.ones((4, 4), np.float32)[:, 0]),           # non-contiguous
        lambda: comm.allreduce(np.frombuffer(b"\0" * 16, np.float32)),        # read-only
        lambda: comm.allreduce(np.ones(4, np.complex64)),                     # dtype
        lambda: comm.allreduce(np.ones(4, np.int16)),                         # dtype
        lambda: comm.allreduce(np.ones(4, np.float32), "bxor"),               # op x dtype
        lambda: comm.allreduce(np.ones(4, np.int32), "avg"),                  # op x dtype
        lambda: comm.allreduce(np.ones(4, np.float32), "median"),             # op
        lambda: comm.allreduce(np.ones(4, np.float32), out=np.ones(5, np.float32)),  # size
        lambda: comm.allreduce(np.ones(4, np.float32), out=np.ones(4, np.float64)),  # dtype of out
        lambda: comm.allgather(np.ones(4, np.float32), out=np.ones(4, np.float32)),
        lambda: comm.reduce_scatter(np.ones(world * 3 + 1, np.float32)),
        lambda: comm.broadcast(np.ones(4, np.float32), root=world),
        lambda: comm.allreduce("not a buffer"),
    ]
    for call in bad_calls:
        try:
            call()
            messages.append(None)
        except ValueError as e:
            messages.append((isinstance(e, rcoll.InvalidArgumentError), str(e)))
    x = np.ones(4, np.float32)
    comm.allreduce(x)
    return messages, x.tolist()


def peer_aborts_while_idle(rank, world):
    """Rank 1 aborts while rank 0 sits between ops: rank 0's next op fails at once."""
    comm = rcoll.init(timeout=30)
    comm.barrier()
    if rank == 1:
        comm.abort("rank 1 gave up")
        time.sleep(2)
        return ("ok", None, 0)
    time.sleep(1)  # the abort message arrives while no op is running
    return _outcome(lambda: comm.allreduce(np.ones(8, np.float32)))
