"""Per-rank bodies of the failure tests. Each returns (error class name, message) or a result."""
import os
import threading
import time

import numpy as np

import rcoll
from rcoll._ops import GATHER, REDUCE, SCATTER
from support.collective_workers import open_sockets


def _outcome(fn):
    t0 = time.monotonic()
    try:
        value = fn()
        return ("ok", value, time.monotonic() - t0)
    except rcoll.RcollError as e:
        return (type(e).__name__, str(e), time.monotonic() - t0)


def mismatch(rank, world, kind, barrier_first=False):
    """Rank 1 calls something different from the others. Returns the first
    outcome and, if that op succeeded, the outcome of the next one.

    barrier_first: every rank is past rendezvous before the odd call, so that
    ranks that detect it without waiting for everyone (rank 0 hosts the store)
    cannot exit under a rank that is still connecting."""
    comm = rcoll.init(rank, world, timeout=20)
    if barrier_first:
        comm.barrier()
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
    if kind == "window_vs_ring":
        # allreduce goes through the shared windows on one host, gather through
        # the transport: the window ranks must see rank 1 run something else.
        return _outcome(lambda: comm.gather(x, root=0) if odd else comm.allreduce(x))
    if kind == "reduce_root":
        return _outcome(lambda: comm.reduce(x, root=1 if odd else 0))
    if kind == "gather_root":
        return _outcome(lambda: comm.gather(x, root=1 if odd else 0))
    if kind == "scatter_root":
        root = 1 if odd else 0
        full = np.ones(comm.size * n, dtype) if rank == root else None
        return _outcome(lambda: comm.scatter(full, root=root, out=x))
    if kind == "alltoallv_count":
        # Every pair moves 3 elements, except that rank 1 expects 4 from rank
        # (1 + 1) % size, which sends 3.
        sender = 2 % comm.size
        send_counts = [3] * comm.size
        recv_counts = [4 if odd and j == sender else 3 for j in range(comm.size)]
        return _outcome(lambda: comm.alltoall(np.ones(3 * comm.size, dtype), send_counts=send_counts,
                                              recv_counts=recv_counts))
    return _outcome(lambda: comm.allreduce(x))


def dead_peer(rank, world):
    """The last rank dies (no clean shutdown) in the middle of the job."""
    comm = rcoll.init(rank, world, timeout=30)
    comm.allreduce(np.ones(10, np.float32))
    if rank == world - 1:
        os._exit(3)
    time.sleep(0.3)
    big = np.ones(4 << 20, np.float32)
    first = _outcome(lambda: comm.allreduce(big))
    later = _outcome(lambda: comm.allreduce(np.ones(4, np.float32)))
    return first, later


def handles_dropped_by_an_exception(rank, world):
    """Ranks 0 and 1 exchange 32 MiB asynchronously, then a collective fails
    (the last rank has left): the exception unwinds past the Handles and the
    arrays. The op's arrays must outlive them (a segfault in the transport's
    copy, before InFlight). Reports the error, then exits normally."""
    import gc

    def exchange(comm):
        big = np.full(8 << 20, rank, np.float32)
        got = np.empty_like(big)
        comm.send(big, rank ^ 1, async_op=True)  # Handles dropped at once
        comm.recv(got, rank ^ 1, async_op=True)
        comm.allreduce(np.ones(4, np.int64))  # fails: the last rank is gone

    def run():
        comm = rcoll.init(rank, world, timeout=30)
        return "left" if rank == world - 1 else _outcome(lambda: exchange(comm))

    outcome = run()  # the communicator is dropped here: it aborts what still runs, then frees the arrays
    gc.collect()
    return outcome


def silent_peer(rank, world):
    """Rank 1 never joins the collective: rank 0 times out naming it."""
    comm = rcoll.init(rank, world)
    if rank == 1:
        time.sleep(4)
        # By now rank 0 has given up and told us why. A small allreduce at
        # world 2 is one exchange, and rank 0's half of it was sent before it
        # gave up: rank 1 may still complete it (with the right result), and
        # must then learn the cause from its next op, at once.
        first = _outcome(lambda: comm.allreduce(np.ones(8, np.float32), timeout=10))
        if first[0] == "ok":
            assert (first[1] == 2).all(), first
            return _outcome(lambda: comm.allreduce(np.ones(8, np.float32), timeout=10))
        return first
    return _outcome(lambda: comm.allreduce(np.ones(8, np.float32), timeout=1.5))


def abort_from_thread(rank, world):
    comm = rcoll.init(rank, world)
    if rank == 1:
        time.sleep(3)
        return ("ok", None, 0)
    threading.Timer(0.5, comm.abort, args=("test abort",)).start()
    first = _outcome(lambda: comm.allreduce(np.ones(8, np.float32), timeout=60))
    later = _outcome(lambda: comm.barrier())
    return first, later


def late_rank(rank, world, delay):
    """The last rank is late to connect (after every rank agreed on the transport
    and the others opened their listeners), so strays knock on rank 0's door first."""
    import os

    from support.collective_workers import DuckStore

    class LateStore(DuckStore):
        def get(self, key):
            if rank == world - 1 and key.endswith("/addr"):  # the table of addresses (csrc/mesh.cc allGather)
                time.sleep(delay)
            return super().get(key)

    store = LateStore("127.0.0.1", int(os.environ["MASTER_PORT"]), rank)
    comm = rcoll.Communicator(rank, world, store=store)
    x = np.arange(1000, dtype=np.float32) * (rank + 1)
    comm.allreduce(x)
    return bool(np.array_equal(x, np.arange(1000, dtype=np.float32) * sum(range(1, world + 1))))


def bad_arguments(rank, world):
    """Every bad call raises InvalidArgumentError (a ValueError) and the communicator still works."""
    comm = rcoll.init(rank, world)
    messages = []
    bad_calls = [
        lambda: comm.allreduce(np.ones((4, 4), np.float32)[:, 0]),           # non-contiguous
        lambda: comm.allreduce(np.frombuffer(b"\0" * 16, np.float32)),        # read-only
        lambda: comm.allreduce(np.ones(4, np.complex64)),                     # dtype
        lambda: comm.allreduce(np.ones(4, np.longdouble)),                    # dtype (80-bit, no core type)
        lambda: comm.allreduce(np.ones(4, np.float32), "bxor"),               # op x dtype
        lambda: comm.allreduce(np.ones(4, np.int32), "avg"),                  # op x dtype
        lambda: comm.allreduce(np.ones(4, np.float32), "median"),             # op
        lambda: comm.allreduce(np.ones(4, np.float32), out=np.ones(5, np.float32)),  # size
        lambda: comm.allreduce(np.ones(4, np.float32), out=np.ones(4, np.float64)),  # dtype of out
        lambda: comm.allgather(np.ones(4, np.float32), out=np.ones(4, np.float32)),
        lambda: comm.reduce_scatter(np.ones(world * 3 + 1, np.float32)),
        lambda: comm.broadcast(np.ones(4, np.float32), root=world),
        lambda: comm.allreduce("not a buffer"),
        lambda: comm.reduce(np.ones(4, np.float32), root=world),
        lambda: comm.reduce(np.ones(4, np.float32), "bxor", root=0),
        lambda: comm.reduce(np.ones(4, np.float32), root=0, out=np.ones(5, np.float32)) if rank == 0
        else comm.reduce(np.ones(4, np.float32), root=-1),
        lambda: comm.gather(np.ones(4, np.float32), root=-1),
        lambda: comm.gather(np.ones(4, np.float32), root=0, out=np.ones(4, np.float32)) if rank == 0
        else comm.gather(np.ones((4, 4), np.float32)[:, 0], root=0),
        lambda: comm.scatter(np.ones(world * 3 + 1, np.float32), root=0),  # not divisible / no out elsewhere
        lambda: comm.scatter(None, root=0, out=np.ones(3, np.float32)) if rank == 0
        else comm.scatter(None, root=0, out=np.frombuffer(b"\0" * 12, np.float32)),
        lambda: comm.alltoall(np.ones(world * 3 + 1, np.float32)),
        lambda: comm.alltoall(np.ones(6, np.float32), send_counts=[6], recv_counts=[6]),
        lambda: comm.alltoall(np.ones(6, np.float32), send_counts=[3] * world),
        lambda: comm.alltoall(np.ones(6, np.float32), send_counts=[7, -1], recv_counts=[3, 3]),
        lambda: comm.alltoall(np.ones(6, np.float32), send_counts=[2, 2], recv_counts=[3, 3]),
        lambda: comm.alltoall(np.ones(6, np.float32), send_counts=[3.0, 3], recv_counts=[3, 3]),
        lambda: comm.alltoall(np.ones((2, 3), np.float32), out=np.ones(6, np.float64)),
        (lambda a: lambda: comm.alltoall(a, out=a))(np.ones(6, np.float32)),
        # The core's own checks, reached through the raw module.
        lambda: comm._comm.alltoall(0, 0, [1] * world, [0] * world, [1] * world, [0] * world, 0, 0.0),
        lambda: comm._comm.alltoall(8, 64, [0] * world, [-1] * world, [0] * world, [0] * world, 0, 0.0),
        lambda: comm._comm.alltoall(8, 64, [1] * world, [2 ** 62] * world, [1] * world, [0] * world, 6, 0.0),
        lambda: comm._comm.alltoall(8, 64, [1] * world, [0] * world, [2] * world, [0] * world, 0, 0.0),
        lambda: comm._comm.alltoall(8, 64, [1] * (world + 1), [0] * world, [1] * world, [0] * world, 0, 0.0),
        lambda: comm._comm.alltoall(64, 64, [1] * world, [0] * world, [1] * world, [0] * world, 0, 0.0),
        lambda: comm._comm.collective(REDUCE, 0, 0, 4, 0, 0, 0, 0.0),
        lambda: comm._comm.collective(GATHER, 64, 0, 4, 0, 0, world, 0.0),
        lambda: comm._comm.collective(SCATTER, 0, 64, 4, 0, 0, 0, 0.0) if rank == 0
        else comm._comm.collective(SCATTER, 64, 0, 4, 0, 0, 0, 0.0),
        lambda: comm._comm.collective(GATHER, 64, 64, 2 ** 62, 6, 0, 0, 0.0),
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
    comm = rcoll.init(rank, world, timeout=30)
    comm.barrier()
    if rank == 1:
        comm.abort("rank 1 gave up")
        time.sleep(2)
        return ("ok", None, 0)
    time.sleep(1)  # the abort message arrives while no op is running
    return _outcome(lambda: comm.allreduce(np.ones(8, np.float32)))


def p2p_mismatch(rank, world, kind):
    """A send and a recv that disagree on the tag, the size or the dtype."""
    comm = rcoll.init(rank, world, timeout=20)
    if rank == 0:
        return _outcome(lambda: comm.send(np.ones(10, np.float32), 1, tag=1))
    if kind == "tag":
        return _outcome(lambda: comm.recv(np.empty(10, np.float32), 0, tag=2))
    if kind == "count":
        return _outcome(lambda: comm.recv(np.empty(11, np.float32), 0, tag=1))
    return _outcome(lambda: comm.recv(np.empty(10, np.int32), 0, tag=1))


def p2p_bad_peer(rank, world):
    comm = rcoll.init(rank, world)
    errors = []
    for call in (lambda: comm.send(np.ones(2), rank), lambda: comm.send(np.ones(2), world),
                 lambda: comm.recv(np.ones(2), -1), lambda: comm.send(np.ones(2), 1 - rank, tag=-1)):
        try:
            call()
            errors.append(None)
        except ValueError as e:
            errors.append(str(e))
    comm.barrier()
    return errors


def shutdown_from_thread(rank, world):
    """shutdown() from another thread: an op that can finish does; one that cannot
    is aborted once the grace period is over, not at its own (long) timeout."""
    comm = rcoll.init(rank, world, timeout=60)
    done = comm.allreduce(np.ones(1000, np.float32), async_op=True)
    done.wait()
    if rank == 1:
        time.sleep(4)  # never joins the next op
        return ("ok", None, 0)
    stuck = comm.allreduce(np.ones(8, np.float32), async_op=True)
    threading.Timer(0.3, comm.shutdown, kwargs={"grace": 0.5}).start()
    return _outcome(lambda: stuck.wait())


def sockets_per_peer_differ(rank, world, differ=True):
    """Rank 1 asks for two TCP sockets per peer (differ) and the others for
    one. Returns the outcome of an allreduce and the sockets the process holds."""
    os.environ["RCOLL_SOCKETS_PER_PEER"] = "2" if differ and rank == 1 else "1"

    def run():
        comm = rcoll.init(rank, world, timeout=20)
        total = float(comm.allreduce(np.ones(1 << 16, dtype=np.float32))[0])
        sockets = open_sockets()
        comm.barrier()
        return total, sockets
    return _outcome(run)
