"""Per-rank bodies of the multi-process collective tests (importable by spawned ranks).

Each worker runs a whole sweep inside one job and returns a list of failure
descriptions, so one process start covers hundreds of cases.
"""
import os
import time

import numpy as np

import rcoll
from support.reference import DTYPES, OPS, differences, make_input, reduced, same, stacked, supported


def sizes_for(world):
    # 0, 1, odd, smaller than the world, not divisible by it, and many segments
    # (the tests shrink RCOLL_CHUNK_BYTES so that this stays fast).
    sizes = {0, 1, 7, 1000, 1003, 5000}
    if world > 1:
        sizes.add(world - 1)
        sizes.add(3 * world + 1)
    return sorted(sizes)


def barrier_waits(rank, world, late_seconds=0.03):
    """Each rank in turn enters the barrier late: no rank may leave it before
    the late one entered (one process's clock: ranks are threads)."""
    comm = rcoll.init(rank, world)
    failures = []
    for late in range(world):
        if rank == late:
            time.sleep(late_seconds)
        entered = time.monotonic()
        comm.barrier()
        left = time.monotonic()
        times = comm.allgather(np.array([entered, left])).reshape(world, 2)
        if left < times[late, 0]:
            failures.append(f"rank {rank} left the barrier {times[late, 0] - left:.4f} s before rank {late} entered")
    comm.shutdown()
    return world, failures


def allreduce_sweep(rank, world, seed=1):
    comm = rcoll.init(rank, world)
    failures = []
    case = 0
    for dtype in DTYPES:
        for op in OPS:
            if not supported(dtype, op):
                continue
            for n in sizes_for(world):
                case += 1
                x = make_input(seed, rank, dtype, n, op)
                expected = reduced(seed, world, dtype, n, op)
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
                    failures.append(f"allreduce {dtype} {op} n={n} in_place={in_place}: {differences(got, expected)}")
    return case, failures


def reduce_scatter_sweep(rank, world, seed=2):
    comm = rcoll.init(rank, world)
    failures = []
    case = 0
    for dtype in DTYPES:
        for op in OPS:
            if not supported(dtype, op):
                continue
            for n in (0, 1, 7, 1001):
                case += 1
                x = make_input(seed, rank, dtype, n * world, op)
                expected = reduced(seed, world, dtype, n * world, op)
                got = comm.reduce_scatter(x, op)
                if not same(got, expected[rank * n:(rank + 1) * n]):
                    failures.append(f"reduce_scatter {dtype} {op} n={n}: wrong result")
    return case, failures


def allgather_sweep(rank, world, seed=3):
    comm = rcoll.init(rank, world)
    failures = []
    case = 0
    for dtype in DTYPES:
        for n in sizes_for(world):
            for in_place in (False, True):
                case += 1
                expected = stacked(seed, world, dtype, n, "max")
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
    comm = rcoll.init(rank, world)
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
    comm = rcoll.init(rank, world)
    failures = []
    cases = [(np.dtype("float32"), "sum"), (np.dtype("float16"), "sum"), (np.dtype("int64"), "max"),
             (np.dtype("float64"), "avg"), (np.dtype("uint8"), "bxor")]
    n_bytes = 3 * (1 << 20) + 12
    for dtype, op in cases:
        n = n_bytes // dtype.itemsize
        x = make_input(seed, rank, dtype, n, op)
        expected = reduced(seed, world, dtype, n, op)
        if not same(comm.allreduce(x.copy(), op), expected):
            failures.append(f"large allreduce {dtype} {op} n={n}: wrong result")
        per_rank = n // world
        rs = comm.reduce_scatter(x[:per_rank * world], op)
        if not same(rs, expected[rank * per_rank:(rank + 1) * per_rank]):
            # x[:per_rank*world] reduced equals expected's prefix only elementwise: same values.
            failures.append(f"large reduce_scatter {dtype} {op}: wrong result")
        g = comm.allgather(x[:per_rank])
        if not same(g, stacked(seed, world, dtype, n, op)[:, :per_rank]):
            failures.append(f"large allgather {dtype}: wrong result")
        b = x.copy()
        comm.broadcast(b, root=world - 1)
        if not same(b, make_input(seed, world - 1, dtype, n, op)):
            failures.append(f"large broadcast {dtype}: wrong result")
    return len(cases), failures


def async_many(rank, world, n_ops=64):
    """Many ops in flight at once: all complete, in order, with the right results."""
    comm = rcoll.init(rank, world)
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


def streamed_messages(rank, world, n_ops=300):
    """The root streams broadcasts of mixed sizes while the others start late, so
    that many messages queue up in each socket and are read several at a time
    (TCP reads small messages through a per-connection inbox of 8 KiB + a
    header): sizes around that boundary, empty ones and large ones mixed."""
    comm = rcoll.init(rank, world)
    sizes = [0, 1, 7, 2047, 2048, 2049, 2064, 4096, 100, 300000, 5, 2032, 2033, 3]
    failures = []
    if rank != 0:
        time.sleep(0.5)
    handles = []
    for i in range(n_ops):
        n = sizes[i % len(sizes)]
        a = np.full(n, i if rank == 0 else -1, dtype=np.float32)
        handles.append((i, a, comm.broadcast(a, 0, async_op=True)))
    for i, _a, h in handles:
        got = h.wait(timeout=60)
        if got.size and not (got == i).all():
            failures.append(f"broadcast {i} ({got.size} elements): got {got[:3]} expected {i}")
    # and reductions after the stream, through the same connections
    x = np.full(5000, rank + 1, dtype=np.int64)
    comm.allreduce(x)
    if not (x == world * (world + 1) // 2).all():
        failures.append(f"allreduce after the stream: {x[:3]}")
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


def socket_count(rank, world):
    """Sockets this process holds once its communicator is up (and used)."""
    comm = rcoll.init(rank, world)
    out = comm.allreduce(np.ones(4096, dtype=np.float32))
    assert (out == world).all()
    sockets = open_sockets()
    comm.barrier()
    return sockets


def open_sockets():
    """Socket descriptors this process holds."""
    sockets = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            sockets += os.readlink(f"/proc/self/fd/{fd}").startswith("socket:")
        except OSError:
            pass  # the listing's own descriptor, gone by now
    return sockets


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


def rooted_sizes_for(world):
    # 0, 1, odd, smaller than the world, and many segments with SMALL_CHUNKS.
    return sorted({0, 1, 7, max(world - 1, 0), 1000, 5000})


def reduce_sweep(rank, world, seed=6):
    comm = rcoll.init(rank, world)
    failures = []
    case = 0
    for dtype in DTYPES:
        for op in OPS:
            if not supported(dtype, op):
                continue
            for n in rooted_sizes_for(world):
                for root in sorted({0, world - 1}):
                    case += 1
                    x = make_input(seed, rank, dtype, n, op)
                    original = x.copy()
                    mode = case % 3  # 0: in place, 1: out=, 2: in place, async
                    what = f"reduce {dtype} {op} n={n} root={root} mode={mode}"
                    if mode == 1:
                        out = np.zeros_like(x)
                        got = comm.reduce(x, op, root=root, out=out)
                    else:
                        got = comm.reduce(x, op, root, async_op=mode == 2)
                        if mode == 2:
                            got = got.wait(timeout=60)
                    if rank != root:
                        if got is not None:
                            failures.append(f"{what}: a non-root rank got {type(got).__name__}, not None")
                        if not same(x, original):
                            failures.append(f"{what}: a non-root rank's input was modified")
                        continue
                    expected = reduced(seed, world, dtype, n, op)
                    if mode == 1 and not same(x, original):
                        failures.append(f"{what}: out-of-place modified its input")
                    if got is not (out if mode == 1 else x):
                        failures.append(f"{what}: did not return the output array")
                    elif not same(got, expected):
                        failures.append(f"{what}: {differences(got, expected)}")
    return case, failures


def gather_sweep(rank, world, seed=7):
    comm = rcoll.init(rank, world)
    failures = []
    case = 0
    for dtype in DTYPES:
        for n in rooted_sizes_for(world):
            for root in sorted({0, world - 1}):
                for in_place in (False, True):
                    case += 1
                    what = f"gather {dtype} n={n} root={root} in_place={in_place}"
                    x = make_input(seed, rank, dtype, n, "max")
                    if in_place and rank == root:
                        out = np.zeros((world, n), dtype)
                        out[rank] = x
                        got = comm.gather(out[rank], root=root, out=out)
                        if got is not out:
                            failures.append(f"{what}: did not return out")
                    elif in_place:  # non-root: the async path instead
                        got = comm.gather(x, root=root, async_op=True).wait(timeout=60)
                    else:
                        got = comm.gather(x, root=root)
                    if rank != root:
                        if got is not None:
                            failures.append(f"{what}: a non-root rank got {type(got).__name__}, not None")
                    elif not same(got, stacked(seed, world, dtype, n, "max")):
                        failures.append(f"{what}: wrong result")
    return case, failures


def scatter_sweep(rank, world, seed=8):
    comm = rcoll.init(rank, world)
    failures = []
    case = 0
    for dtype in DTYPES:
        for n in rooted_sizes_for(world):
            for root in sorted({0, world - 1}):
                for in_place in (False, True):
                    case += 1
                    what = f"scatter {dtype} n={n} root={root} in_place={in_place}"
                    full = make_input(seed, root, dtype, n * world, "max").reshape(world, n)
                    expected = full[rank].copy()
                    if rank == root:
                        src = full.copy()
                        if in_place:
                            got = comm.scatter(src, root=root, out=src[root])
                            if not same(src, full):
                                failures.append(f"{what}: the root's input changed")
                        else:
                            got = comm.scatter(src, root=root)
                            if got.shape != (n,):
                                failures.append(f"{what}: result shape {got.shape}")
                    else:
                        out = np.zeros(n, dtype)
                        got = comm.scatter(None, root=root, out=out, async_op=in_place)
                        got = got.wait() if in_place else got
                        if got is not out:
                            failures.append(f"{what}: did not return out")
                    if not same(got, expected):
                        failures.append(f"{what}: wrong result")
    return case, failures


def _a2a_block(seed, src, dst, dtype, n):
    """What rank `src` sends rank `dst`: every rank can regenerate it."""
    return make_input(seed * 1000 + dst, src, dtype, n, "max")


def alltoall_sweep(rank, world, seed=9):
    comm = rcoll.init(rank, world)
    failures = []
    case = 0
    for dtype in DTYPES:
        # Equal split, shape (world, n) in and out.
        for n in rooted_sizes_for(world):
            case += 1
            x = np.stack([_a2a_block(seed, rank, j, dtype, n) for j in range(world)])
            original = x.copy()
            got = comm.alltoall(x, async_op=case % 2 == 0)
            got = got.wait() if case % 2 == 0 else got
            expected = np.stack([_a2a_block(seed, j, rank, dtype, n) for j in range(world)])
            if not same(got, expected):
                failures.append(f"alltoall {dtype} n={n}: wrong result")
            if not same(x, original):
                failures.append(f"alltoall {dtype} n={n}: the input changed")
        # alltoallv: irregular counts with zeros, small and many-segment blocks.
        for scale in (1, 151):
            case += 1
            counts = [[((s * 3 + d * 5) % 7) * scale for d in range(world)] for s in range(world)]
            send_counts = counts[rank]
            recv_counts = [counts[j][rank] for j in range(world)]
            blocks = [_a2a_block(seed, rank, j, dtype, send_counts[j]) for j in range(world)]
            x = np.concatenate(blocks)
            out = np.full(sum(recv_counts), 1, dtype) if case % 2 == 0 else None
            got = comm.alltoall(x, send_counts=send_counts, recv_counts=recv_counts, out=out)
            expected = np.concatenate([_a2a_block(seed, j, rank, dtype, recv_counts[j]) for j in range(world)])
            if out is not None and got is not out:
                failures.append(f"alltoallv {dtype} scale={scale}: did not return out")
            if not same(got, expected):
                failures.append(f"alltoallv {dtype} scale={scale} counts={send_counts}/{recv_counts}: wrong result")
    # Everything to one rank, nothing elsewhere; and nothing at all.
    for target in sorted({0, world - 1}):
        case += 1
        send_counts = [50 if j == target else 0 for j in range(world)]
        recv_counts = [50 if rank == target else 0 for _ in range(world)]
        x = _a2a_block(seed, rank, target, np.dtype("float32"), 50)
        got = comm.alltoall(x, send_counts=send_counts, recv_counts=recv_counts)
        expected = np.concatenate([_a2a_block(seed, j, rank, np.dtype("float32"), recv_counts[j])
                                   for j in range(world)])
        if not same(got, expected):
            failures.append(f"alltoallv to rank {target}: wrong result")
    case += 1
    got = comm.alltoall(np.empty(0, np.int32), send_counts=[0] * world, recv_counts=[0] * world)
    if got.shape != (0,):
        failures.append(f"empty alltoallv: shape {got.shape}")
    comm.barrier()
    return case, failures


def large_rooted_sweep(rank, world, seed=10):
    """reduce, gather, scatter and alltoall of a few MiB with the default chunk size."""
    comm = rcoll.init(rank, world)
    failures = []
    cases = 0
    for dtype, op in [(np.dtype("float32"), "sum"), (np.dtype("float64"), "avg"), (np.dtype("int8"), "bxor")]:
        n = (3 * (1 << 20) + 12) // dtype.itemsize
        root = world - 1 if dtype.itemsize != 8 else 0
        cases += 1
        x = make_input(seed, rank, dtype, n, op)
        got = comm.reduce(x.copy(), op, root=root)  # in place on the root
        if rank == root and not same(got, reduced(seed, world, dtype, n, op)):
            failures.append(f"large reduce {dtype} {op}: wrong result")
        per_rank = n // world
        cases += 1
        got = comm.gather(x[:per_rank], root=root)
        if rank == root and not same(got, stacked(seed, world, dtype, n, op)[:, :per_rank]):
            failures.append(f"large gather {dtype}: wrong result")
        cases += 1
        full = make_input(seed, root, dtype, n, op)[:per_rank * world]
        got = comm.scatter(full if rank == root else None, root=root, out=np.empty(per_rank, dtype))
        if not same(got, full[rank * per_rank:(rank + 1) * per_rank]):
            failures.append(f"large scatter {dtype}: wrong result")
        cases += 1
        got = comm.alltoall(x[:per_rank * world].reshape(world, per_rank))
        expected = stacked(seed, world, dtype, n, op)[:, rank * per_rank:(rank + 1) * per_rank]
        if not same(got, expected):
            failures.append(f"large alltoall {dtype}: wrong result")
    return cases, failures


def blocking_exchange(comm, rank, peer, x, y):
    """Sends x to peer and receives y from it with blocking calls, the lower
    rank sending first (the other order on both ends would deadlock)."""
    if rank < peer:
        comm.send(x, peer)
        comm.recv(y, peer)
    else:
        comm.recv(y, peer)
        comm.send(x, peer)


def point_to_point(rank, world):
    """Both directions at once with large messages (a single in-order queue would
    deadlock), interleaved with collectives, and in-order matching of many messages."""
    comm = rcoll.init(rank, world, timeout=60)
    failures = []
    peer = rank ^ 1
    if peer >= world:  # the odd rank out joins the collective only
        total = comm.allreduce(np.ones(4, np.int64))
        return 1, failures if total.tolist() == [world] * 4 else ["collective beside point-to-point"]
    big = np.full(8 << 20, rank, np.float32)  # 32 MiB each way
    got = np.empty_like(big)
    hs = comm.send(big, peer, async_op=True)
    hr = comm.recv(got, peer, async_op=True)
    total = comm.allreduce(np.ones(4, np.int64))  # a collective while the big messages move
    hs.wait()
    hr.wait()
    if not (got == peer).all():
        failures.append("big message content")
    if total.tolist() != [world] * 4:
        failures.append("collective beside point-to-point")
    # Many small messages, several tags, issued before any is received: they match in order.
    sends = [comm.send(np.array([rank * 1000 + i], np.int64), peer, tag=i % 3, async_op=True) for i in range(50)]
    for i in range(50):
        x = np.empty(1, np.int64)
        comm.recv(x, peer, tag=i % 3)
        if x[0] != peer * 1000 + i:
            failures.append(f"message {i}: {x[0]}")
    for h in sends:
        h.wait()
    # Empty messages and every dtype.
    from support.reference import DTYPES
    for dtype in DTYPES:
        for n in (0, 1, 1001):
            x = make_input(7, rank, dtype, n, "max")
            y = np.empty_like(x)
            blocking_exchange(comm, rank, peer, x, y)
            if not same(y, make_input(7, peer, dtype, n, "max")):
                failures.append(f"p2p {dtype} n={n}")
    return 1, failures


def recv_from_any(rank, world):
    """recv(src=None): rank 0 receives every other rank's messages without naming
    the sender, in any arrival order; per sender they stay in order; a named
    receive beside them keeps its own message; tags select; sizes that disagree
    are a MismatchError naming both ranks; nothing to receive times out."""
    comm = rcoll.init(rank, world, timeout=60)
    failures = []
    rounds = 5
    if rank == 0:
        seen = {r: [] for r in range(1, world)}
        for _ in range(rounds * (world - 1)):
            x = np.empty(3, np.int64)
            h = comm.recv(x, None, tag=7, async_op=True)
            h.wait()
            src = h.source_rank
            if src not in seen or x[0] != src:
                failures.append(f"any-source message {x.tolist()} reported from rank {src}")
                continue
            seen[src].append(int(x[1]))
        for r, order in seen.items():
            if order != list(range(rounds)):
                failures.append(f"rank {r}'s messages arrived as {order}")
        # A named receive posted first takes that rank's next message; the
        # any-source one posted after it the other rank's.
        if world >= 3:
            a, b = np.empty(1, np.float32), np.empty(1, np.float32)
            named = comm.recv(b, 1, tag=1, async_op=True)
            any_h = comm.recv(a, None, tag=1, async_op=True)
            named.wait()
            any_h.wait()
            if b[0] != 1.0 or named.source_rank != 1 or a[0] != any_h.source_rank or any_h.source_rank == 1:
                failures.append(f"named {b.tolist()} / any {a.tolist()} from {any_h.source_rank}")
        comm.barrier()
        # Only a message with the tag asked for is taken.
        y = np.empty(1, np.int32)
        h = comm.recv(y, None, tag=5, async_op=True)
        z = np.empty(1, np.int32)
        comm.recv(z, 1, tag=4)
        h.wait()
        if z[0] != 4 or y[0] != 5 or h.source_rank != 1:
            failures.append(f"tags: {z.tolist()} {y.tolist()} from {h.source_rank}")
        comm.barrier()
        # A size that disagrees is a mismatch naming the sender.
        try:
            comm.recv(np.empty(2, np.float64), None, tag=9)
            failures.append("a receive of 2 elements took a message of 3")
        except rcoll.MismatchError as e:
            if "rank 1" not in str(e):
                failures.append(f"mismatch message: {e}")
        return 1, failures
    for i in range(rounds):
        comm.send(np.array([rank, i, 0], np.int64), 0, tag=7)
    if world >= 3 and rank in (1, 2):
        comm.send(np.array([float(rank)], np.float32), 0, tag=1)
    comm.barrier()
    if rank == 1:
        comm.send(np.array([4], np.int32), 0, tag=4)
        comm.send(np.array([5], np.int32), 0, tag=5)
    comm.barrier()
    if rank == 1:
        try:
            comm.send(np.zeros(3), 0, tag=9)
        except rcoll.RcollError:
            pass  # the receiver refused it, and may have told this rank before the send ended
    return 1, failures


def recv_from_any_times_out(rank, world):
    comm = rcoll.init(rank, world)
    outcome = None
    if rank == 0:
        t0 = time.monotonic()
        try:
            comm.recv(np.empty(1), None, tag=3, timeout=1.5)
        except rcoll.TimeoutError as e:
            outcome = (str(e), time.monotonic() - t0)
    return outcome


def allreduce_bits(rank, world, seed=11):
    """Results of float allreduces whose bits depend on the combining order
    (arbitrary values, signed zeros and NaNs): every rank must end with the
    same bytes, whichever algorithm ran. Returns the result bytes per case."""
    comm = rcoll.init(rank, world)
    rng = np.random.default_rng([seed, rank])
    out = []
    for dtype in (np.float16, np.float32, np.float64):
        for op in ("sum", "prod", "min", "max", "avg"):
            for n in (1, 5, 333, 2000):
                x = rng.standard_normal(n).astype(dtype)
                if op in ("min", "max"):
                    x[rng.random(n) < 0.3] = 0.0
                    x[rng.random(n) < 0.3] = -0.0
                    x[rng.random(n) < 0.05] = np.nan
                comm.allreduce(x, op)
                out.append(x.tobytes())
    return out
