"""Per-rank bodies of the multi-process collective tests (importable by spawned ranks).

Each worker runs a whole sweep inside one job and returns a list of failure
descriptions, so one process start covers hundreds of cases.
"""
import numpy as np

import rcoll
from reference import DTYPES, OPS, make_input, reduce_reference, same, supported


def sizes_for(world):
    # 0, 1, odd, smaller than the world, not divisible by it, and many segments
    # (the tests shrink RCOLL_CHUNK_BYTES so that this stays fast).
    sizes = {0, 1, 7, 1000, 1003, 5000}
    if world > 1:
        sizes.add(world - 1)
        sizes.add(3 * world + 1)
    return sorted(sizes)


def _stack(seed, world, dtype, n, op):
    return np.stack([make_input(seed, r, dtype, n, op) for r in range(world)])


def allreduce_sweep(rank, world, seed=1):
    comm = rcoll.init()
    failures = []
    case = 0
    for dtype in DTYPES:
        for op in OPS:
            if not supported(dtype, op):
                continue
            for n in sizes_for(world):
                case += 1
                x = make_input(seed, rank, dtype, n, op)
                expected = reduce_reference(_stack(seed, world, dtype, n, op), dtype, op, world)
                in_place = case % 2 == 0
                if in_place:
                    got = x.copy()
                    comm.allreduce(got, op)
                else:
                    got = np.empty_like(x)
                    original = x.copy()
                    comm.allreduce(x, op, out=got)
                    if not same(x, original):
                        failures.append(f"allreduce {dtype} {op} n={n}: out-of-place modified its input")
                if not same(got, expected):
                    bad = np.flatnonzero(got.astype(np.float64) != expected.astype(np.float64))[:5]
                    failures.append(f"allreduce {dtype} {op} n={n} in_place={in_place}: wrong at {bad.tolist()}: "
                                    f"got {got[bad].tolist()} expected {expected[bad].tolist()}")
    return case, failures


def reduce_scatter_sweep(rank, world, seed=2):
    comm = rcoll.init()
    failures = []
    case = 0
    for dtype in DTYPES:
        for op in OPS:
            if not supported(dtype, op):
                continue
            for n in (0, 1, 7, 1001):
                case += 1
                x = make_input(seed, rank, dtype, n * world, op)
                expected = reduce_reference(_stack(seed, world, dtype, n * world, op), dtype, op, world)
                got = comm.reduce_scatter(x, op)
                if not same(got, expected[rank * n:(rank + 1) * n]):
                    failures.append(f"reduce_scatter {dtype} {op} n={n}: wrong result")
    return case, failures


def allgather_sweep(rank, world, seed=3):
    comm = rcoll.init()
    failures = []
    case = 0
    for dtype in DTYPES:
        for n in sizes_for(world):
            for in_place in (False, True):
                case += 1
                expected = _stack(seed, world, dtype, n, "max")
                x = make_input(seed, rank, dtype, n, "max")
                if in_place:
                    out = np.zeros((world, n), dtype)
                    out[rank] = x
                    comm.allgather(out[rank], out=out)
                    got = out
                else:
                    got = comm.allgather(x)
                if not same(got, expected):
                    failures.append(f"allgather {dtype} n={n} in_place={in_place}: wrong result")
    return case, failures


def broadcast_sweep(rank, world, seed=4):
    comm = rcoll.init()
    failures = []
    case = 0
    for dtype in DTYPES:
        for n in sizes_for(world):
            for root in sorted({0, world - 1}):
                for in_place in (True, False):
                    case += 1
                    expected = make_input(seed, root, dtype, n, "max")
                    x = make_input(seed, rank, dtype, n, "max")
                    if in_place:
                        comm.broadcast(x, root=root)
                        got = x
                    else:
                        got = np.zeros_like(x)
                        comm.broadcast(x, root=root, out=got)
                    if not same(got, expected):
                        failures.append(f"broadcast {dtype} n={n} root={root} in_place={in_place}: wrong result")
    for _ in range(3):
        comm.barrier()
    return case, failures


def large_sweep(rank, world, seed=5):
    """A few MiB per call with the default chunk size: many full-size segments."""
    comm = rcoll.init()
    failures = []
    cases = [(np.dtype("float32"), "sum"), (np.dtype("float16"), "sum"), (np.dtype("int64"), "max"),
             (np.dtype("float64"), "avg"), (np.dtype("uint8"), "bxor")]
    n_bytes = 3 * (1 << 20) + 12
    for dtype, op in cases:
        n = n_bytes // dtype.itemsize
        x = make_input(seed, rank, dtype, n, op)
        expected = reduce_reference(_stack(seed, world, dtype, n, op), dtype, op, world)
        if not same(comm.allreduce(x.copy(), op), expected):
            failures.append(f"large allreduce {dtype} {op} n={n}: wrong result")
        per_rank = n // world
        rs = comm.reduce_scatter(x[:per_rank * world], op)
        if not same(rs, expected[rank * per_rank:(rank + 1) * per_rank]):
            # x[:per_rank*world] reduced equals expected's prefix only elementwise: same values.
            failures.append(f"large reduce_scatter {dtype} {op}: wrong result")
        g = comm.allgather(x[:per_rank])
        if not same(g, _stack(seed, world, dtype, n, op)[:, :per_rank]):
            failures.append(f"large allgather {dtype}: wrong result")
        b = x.copy()
        comm.broadcast(b, root=world - 1)
        if not same(b, make_input(seed, world - 1, dtype, n, op)):
            failures.append(f"large broadcast {dtype}: wrong result")
    return len(cases), failures


def async_many(rank, world, n_ops=64):
    """Many ops in flight at once: all complete, in order, with the right results."""
    comm = rcoll.init()
    arrays = [np.full(257 + i, rank + i, dtype=np.int64) for i in range(n_ops)]
    handles = [comm.allreduce(a, "sum", async_op=True) for a in arrays]
    gathered = comm.allgather(np.array([rank], np.int32), async_op=True)
    seqs = [h.seq for h in handles]
    failures = []
    if seqs != sorted(seqs) or len(set(seqs)) != len(seqs):
        failures.append(f"sequence numbers not increasing: {seqs}")
    # Wait in reverse: completion order must not depend on wait order.
    for i, h in reversed(list(enumerate(handles))):
        got = h.wait(timeout=60)
        want = sum(r + i for r in range(world))
        if not (got == want).all():
            failures.append(f"async op {i}: got {got[:3]} expected {want}")
    if gathered.wait().ravel().tolist() != list(range(world)):
        failures.append("async allgather wrong")
    return n_ops, failures


class DuckStore:
    """A store written in Python (as torch's is, from rcoll's point of view):
    set/get/add only, backed here by a TCP store that rank 0 hosts."""

    def __init__(self, host, port, rank):
        from rcoll import _core
        self.server = _core.TcpStoreServer(host, port) if rank == 0 else None
        self.client = _core.TcpStore(host, port, 30)
        self.calls = 0

    def set(self, key, value):
        self.calls += 1
        self.client.set(key, bytes(value))

    def get(self, key):
        self.calls += 1
        return self.client.get(key, 30)

    def add(self, key, delta):
        self.calls += 1
        return self.client.add(key, delta)


def caller_store(rank, world):
    import os
    store = DuckStore("127.0.0.1", int(os.environ["MASTER_PORT"]), rank)
    comm = rcoll.Communicator(rank, world, store=store, name="custom")
    x = np.full(100, rank, np.int32)
    comm.allreduce(x)
    # Two communicators on one store, alive at once, kept apart by name.
    other = rcoll.Communicator(rank, world, store=store, name="second")
    y = other.allgather(np.array([rank * 10], np.int64))
    return int(x[0]), y.ravel().tolist(), store.calls > 0
