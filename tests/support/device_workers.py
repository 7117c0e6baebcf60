"""Per-rank bodies of the device-path tests (tests/device/test_device_collectives.py).

They run with RCOLL_DEVICE_RUNTIME=rcoll_emulated_device: the core's device
runtime is a host-memory emulation (tests/device/emulated_device/), whose streams are
worker threads that finish work late and out of order. The buffers below
expose __cuda_array_interface__ but point at numpy memory, so the whole device
path runs (Python checks, stream events, pinned staging, D2H/H2D copies,
reductions through the device API, completion events) and every result is
checked exactly against numpy. This checks the orchestration, not CUDA.
"""
import os
import time

import numpy as np

import rcoll
from rcoll import _core
from support.collective_workers import _a2a_block
from support.reference import DTYPES, OPS, differences, make_input, reduced, same, stacked, supported


class HostBackedDeviceArray:
    """A __cuda_array_interface__ v3 view of a numpy array (only meaningful with the emulation)."""

    def __init__(self, array, stream=None, readonly=False):
        self.array = array
        self.stream = stream
        self.readonly = readonly

    @property
    def shape(self):
        return self.array.shape

    @property
    def dtype(self):  # names bfloat16, whose typestr ('<V2') does not
        return self.array.dtype

    @property
    def __cuda_array_interface__(self):
        contiguous = self.array.flags.c_contiguous
        return {"version": 3, "shape": self.array.shape, "typestr": self.array.dtype.str,
                "data": (self.array.__array_interface__["data"][0], self.readonly),
                "strides": None if contiguous else self.array.strides, "stream": self.stream}


def dev(array, **kwargs):
    return HostBackedDeviceArray(array, **kwargs)


def expected_path(world):
    """The device path every rank must agree on: CUDA IPC windows when all
    ranks share shared memory (RCOLL_TRANSPORT=shm) and RCOLL_CUDA_IPC is on;
    GPUDirect RDMA over verbs unless RCOLL_GDR=0 (the emulated GPU's memory is
    host memory, which the RDMA device registers); else pinned staging. A test
    of several hosts names the path of its last op in EXPECT_DEVICE_PATH (a
    test's variable, not an rcoll setting): "cuda-ipc+staging" where each
    host's ranks are processes that map each other's windows."""
    if os.environ.get("EXPECT_DEVICE_PATH"):
        return os.environ["EXPECT_DEVICE_PATH"]
    transport = os.environ.get("RCOLL_TRANSPORT")
    ipc = transport == "shm" and os.environ.get("RCOLL_CUDA_IPC", "1") != "0" and \
        os.environ.get("RCOLL_SHM_COLL", "1") != "0"
    if world > 1 and ipc:
        return "cuda-ipc"
    if world > 1 and transport == "ib" and os.environ.get("RCOLL_GDR", "auto") != "0":
        return "gdr"
    return "staging"


def check_path(comm, world, failures):
    if comm.device_path != expected_path(world):
        failures.append(f"device ops went through {comm.device_path!r}, expected {expected_path(world)!r}")


def sizes_for(world):
    sizes = {0, 1, 7, 1000, 1003, 5000}  # 5000: several 4K device-window slots with SMALL_CHUNKS
    sizes.add(world - 1)
    sizes.add(3 * world + 1)
    return sorted(sizes)


def allreduce_sweep(rank, world, seed=11):
    comm = rcoll.init(rank, world)
    failures, case = [], 0
    for dtype in DTYPES:
        for op in OPS:
            if not supported(dtype, op):
                continue
            for n in sizes_for(world):
                case += 1
                x = make_input(seed, rank, dtype, n, op)
                expected = reduced(seed, world, dtype, n, op)
                if case % 2 == 0:
                    got = x.copy()
                    comm.allreduce(dev(got), op)
                else:
                    got = np.empty_like(x)
                    original = x.copy()
                    comm.allreduce(dev(x, readonly=True), op, out=dev(got))
                    if not same(x, original):
                        failures.append(f"allreduce {dtype} {op} n={n}: out-of-place modified its input")
                if not same(got, expected):
                    failures.append(f"allreduce {dtype} {op} n={n}: {differences(got, expected)}")
    assert "emulated" in _core.device_api_name()
    check_path(comm, world, failures)
    return case, failures


def allgather_sweep(rank, world, seed=12):
    comm = rcoll.init(rank, world)
    failures, case = [], 0
    for dtype in DTYPES:
        for n in sizes_for(world):
            for in_place in (False, True):
                case += 1
                expected = stacked(seed, world, dtype, n, "max")
                x = make_input(seed, rank, dtype, n, "max")
                out = np.zeros((world, n), dtype)
                if in_place:
                    out[rank] = x
                    comm.allgather(dev(out[rank]), out=dev(out))
                else:
                    comm.allgather(dev(x), out=dev(out))
                if not same(out, expected):
                    failures.append(f"allgather {dtype} n={n} in_place={in_place}: {differences(out, expected)}")
    check_path(comm, world, failures)
    return case, failures


def broadcast_sweep(rank, world, seed=13):
    comm = rcoll.init(rank, world)
    failures, case = [], 0
    for dtype in DTYPES:
        for n in sizes_for(world):
            for root in range(world):
                case += 1
                expected = make_input(seed, root, dtype, n, "max")
                x = make_input(seed, rank, dtype, n, "max")
                if case % 2 == 0:
                    comm.broadcast(dev(x), root=root)
                    got = x
                else:
                    got = np.zeros_like(x)
                    comm.broadcast(dev(x), root=root, out=dev(got))
                if not same(got, expected):
                    failures.append(f"broadcast {dtype} n={n} root={root}: {differences(got, expected)}")
    check_path(comm, world, failures)
    return case, failures


def reduce_scatter_sweep(rank, world, seed=14):
    comm = rcoll.init(rank, world)
    failures, case = [], 0
    for dtype in DTYPES:
        for op in OPS:
            if not supported(dtype, op):
                continue
            for n in (0, 1, 7, 1001):
                case += 1
                x = make_input(seed, rank, dtype, n * world, op)
                expected = reduced(seed, world, dtype, n * world, op)
                got = np.full(n, 7, dtype)
                comm.reduce_scatter(dev(x), op, out=dev(got))
                if not same(got, expected[rank * n:(rank + 1) * n]):
                    failures.append(f"reduce_scatter {dtype} {op} n={n}: wrong result")
    check_path(comm, world, failures)
    return case, failures


def around_the_windows_threshold(rank, world, seed=19):
    """allgather, reduce_scatter and broadcast of float32 device buffers whose
    whole buffer is just under and at RCOLL_CUDA_IPC_HOSTS_MIN_BYTES (the
    test sets it): checked exactly; the test reads which way each went in
    the timeline. Returns the path after each op too."""
    comm = rcoll.init(rank, world)
    limit = int(os.environ["RCOLL_CUDA_IPC_HOSTS_MIN_BYTES"])
    failures, paths = [], []
    f32 = np.dtype(np.float32)
    for whole in (limit - 4 * world, limit):  # bytes of the whole buffer, a multiple of 4 * world
        n = whole // 4 // world  # allgather's input, reduce_scatter's output
        expected = stacked(seed, world, f32, n, "max")
        out = np.zeros((world, n), f32)
        comm.allgather(dev(make_input(seed, rank, f32, n, "max")), out=dev(out))
        if not same(out, expected):
            failures.append(f"allgather of {whole} B: {differences(out, expected)}")
        paths.append(("allgather", whole, comm.device_path))
        x = make_input(seed, rank, f32, n * world, "sum")
        got = np.zeros(n, f32)
        comm.reduce_scatter(dev(x), "sum", out=dev(got))
        if not same(got, reduced(seed, world, f32, n * world, "sum")[rank * n:(rank + 1) * n]):
            failures.append(f"reduce_scatter of {whole} B: wrong result")
        paths.append(("reduce_scatter", whole, comm.device_path))
        b = make_input(seed, rank, f32, whole // 4, "max")
        comm.broadcast(dev(b), root=world - 1)
        if not same(b, make_input(seed, world - 1, f32, whole // 4, "max")):
            failures.append(f"broadcast of {whole} B: wrong result")
        paths.append(("broadcast", whole, comm.device_path))
    return paths, failures


def waits_for_the_callers_stream(rank, world):
    """The caller's stream still has work on the op's buffers when the op is
    called: a delayed copy writes the input late, or writes junk into the
    output late. Every op must read the new input and leave its result after
    that junk, never under it: on one host and across hosts, for the ranks
    that reduce or send and for those that only receive (a broadcast's other
    hosts)."""
    import rcoll_emulated_device as emulated

    comm = rcoll.init(rank, world)
    stream = emulated.stream_create()
    failures, case = [], 0
    sources = []  # alive until the stream is gone: a copy that lands after a wrong op reads them

    def late(dst, src, delay):
        # Queued on the caller's stream before the op: lands after `delay` seconds.
        sources.append(src)
        emulated.delayed_copy(stream, dst.__array_interface__["data"][0], src.__array_interface__["data"][0],
                              src.nbytes, delay)

    def check(name, n, delay, got, expected):
        nonlocal case
        case += 1
        if not same(got, expected):
            failures.append(f"{name} n={n} delay={delay}: the op did not wait for the caller's stream: "
                            f"{differences(got, expected)}")

    try:
        for n in (1, 1000, 5000):
            for delay in (0.0, 0.05):
                x = np.zeros(n, np.float32)
                late(x, np.full(n, rank + 1, np.float32), delay)
                comm.allreduce(dev(x, stream=stream))
                check("allreduce", n, delay, x, np.full(n, world * (world + 1) // 2, np.float32))

                for root in range(world):
                    x = np.zeros(n, np.float32)
                    late(x, np.full(n, rank + 1, np.float32), delay)  # the root's input; junk on the others
                    comm.broadcast(dev(x, stream=stream), root=root)
                    check(f"broadcast root={root} in place", n, delay, x, np.full(n, root + 1, np.float32))
                    x, out = np.full(n, rank + 1, np.float32), np.zeros(n, np.float32)
                    late(out, np.full(n, -1, np.float32), delay)
                    comm.broadcast(dev(x, stream=stream), root=root, out=dev(out, stream=stream))
                    check(f"broadcast root={root} out of place", n, delay, out, np.full(n, root + 1, np.float32))

                x, out = np.zeros(n, np.float32), np.zeros(world * n, np.float32)
                late(x, np.full(n, rank + 1, np.float32), delay)
                late(out, np.full(world * n, -1, np.float32), delay)
                comm.allgather(dev(x, stream=stream), out=dev(out, stream=stream))
                check("allgather", n, delay, out, np.repeat(np.arange(1, world + 1, dtype=np.float32), n))

                x, out = np.zeros(world * n, np.float32), np.zeros(n, np.float32)
                late(x, np.full(world * n, rank + 1, np.float32), delay)
                late(out, np.full(n, -1, np.float32), delay)
                comm.reduce_scatter(dev(x, stream=stream), "sum", out=dev(out, stream=stream))
                check("reduce_scatter", n, delay, out, np.full(n, world * (world + 1) // 2, np.float32))
    finally:
        emulated.stream_destroy(stream)
    check_path(comm, world, failures)
    return case, failures


def many_async(rank, world, n_ops=24):
    """Device ops in flight together, mixed with host ops, completing in issue order."""
    comm = rcoll.init(rank, world)
    arrays = [np.full(777 + i, rank + i, np.int64) for i in range(n_ops)]
    handles = [comm.allreduce(dev(a), async_op=True) if i % 3 else comm.allreduce(a, async_op=True)
               for i, a in enumerate(arrays)]
    failures = []
    for i, (a, h) in enumerate(zip(arrays, handles)):
        h.wait(timeout=60)
        expected = sum(r + i for r in range(world))
        if not np.all(a == expected):
            failures.append(f"op {i}: got {a[:3]} expected {expected}")
    return n_ops, failures


def mismatch(rank, world, kind):
    """Rank 1 disagrees with the others (count, dtype, or host memory) on a device allreduce."""
    comm = rcoll.init(rank, world, timeout=20)
    comm.barrier()
    odd = rank == 1
    n = 1000 + (1 if odd and kind == "count" else 0)
    dtype = np.float64 if odd and kind == "dtype" else np.float32
    t0 = time.monotonic()
    try:
        x = np.ones(n, dtype)
        comm.allreduce(x if odd and kind == "memory" else dev(x))
        return ("ok", "", time.monotonic() - t0)
    except rcoll.RcollError as e:
        return (type(e).__name__, str(e), time.monotonic() - t0)


def op_per_rank(rank, world, ops):
    """A device allreduce with reduce op ops[rank]: the ranks may disagree."""
    comm = rcoll.init(rank, world, timeout=20)
    t0 = time.monotonic()
    try:
        comm.allreduce(dev(np.ones(1 << 16, np.float32)), ops[rank])
        return ("ok", "", time.monotonic() - t0)
    except rcoll.RcollError as e:
        return (type(e).__name__, str(e), time.monotonic() - t0)


def dead_peer(rank, world):
    import os

    comm = rcoll.init(rank, world, timeout=30)
    comm.allreduce(dev(np.ones(10, np.float32)))
    if rank == world - 1:
        os._exit(3)
    time.sleep(0.3)
    t0 = time.monotonic()
    try:
        comm.allreduce(dev(np.ones(4 << 20, np.float32)))
        return ("ok", "", time.monotonic() - t0)
    except rcoll.RcollError as e:
        return (type(e).__name__, str(e), time.monotonic() - t0)


def gdr_required(rank, world):
    """RCOLL_GDR=1 where GPUDirect RDMA is impossible: the first device op fails
    with a ConfigError that says why, on every rank, without a hang; as after
    any failed op, the communicator then refuses further ops, naming it."""
    comm = rcoll.init(rank, world, timeout=30)
    outcomes = []
    for buf in (dev(np.ones(1000, np.float32)), np.ones(10, np.float32)):
        try:
            comm.allreduce(buf)
            outcomes.append(("ok", ""))
        except rcoll.RcollError as e:
            outcomes.append((type(e).__name__, str(e)))
    return outcomes


def _error_collector(messages):
    """expect(fn): runs fn and appends its RcollError's text to `messages` (None if it raised nothing)."""
    def expect(fn):
        try:
            fn()
            messages.append(None)
        except rcoll.RcollError as e:
            messages.append(str(e))
    return expect


def argument_errors(rank, world):
    """Mistakes caught on the caller's thread, before anything is enqueued."""
    comm = rcoll.init(rank, world)
    messages = []
    x = np.ones(8, np.float32)
    expect = _error_collector(messages)

    expect(lambda: comm.allreduce(dev(x), out=x))                                    # host + device mixed
    expect(lambda: comm.allreduce(dev(x, readonly=True)))                            # read-only in place
    expect(lambda: comm.allreduce(dev(x), out=dev(np.ones(8, np.float64))))          # dtype differs
    expect(lambda: comm.allgather(dev(x)))                                           # no out for a non-torch buffer
    expect(lambda: comm.allreduce(dev(np.ones(8, np.complex64))))                    # unsupported dtype
    expect(lambda: comm.allreduce(dev(x), "band"))                                   # bitwise on floats
    expect(lambda: comm.allreduce(dev(np.ones(16, np.float32)[::2])))               # not contiguous
    expect(lambda: comm.broadcast(dev(x), root=2))                                   # no such root
    comm.allreduce(dev(x))  # nothing was enqueued by the mistakes: the ranks still agree
    return messages, x.tolist()


def every_collective_once(rank, world, seed=15):
    """One dtype, a few sizes, each collective: for settings that stress the pipeline itself."""
    comm = rcoll.init(rank, world)
    failures, case = [], 0
    dtype = np.dtype(np.float32)
    for n in (1, world + 1, 1003, 5000):
        case += 1
        x = make_input(seed, rank, dtype, n, "sum")
        expected = reduced(seed, world, dtype, n, "sum")
        comm.allreduce(dev(x))
        if not same(x, expected):
            failures.append(f"allreduce n={n}: {differences(x, expected)}")
        case += 1
        out = np.zeros((world, n), dtype)
        comm.allgather(dev(make_input(seed, rank, dtype, n, "max")), out=dev(out))
        if not same(out, stacked(seed, world, dtype, n, "max")):
            failures.append(f"allgather n={n}")
        case += 1
        b = make_input(seed, rank, dtype, n, "max")
        comm.broadcast(dev(b), root=world - 1)
        if not same(b, make_input(seed, world - 1, dtype, n, "max")):
            failures.append(f"broadcast n={n}")
        case += 1
        x = make_input(seed, rank, dtype, n * world, "max")
        got = np.empty(n, dtype)
        comm.reduce_scatter(dev(x), "max", out=dev(got))
        expected = reduced(seed, world, dtype, n * world, "max")
        if not same(got, expected[rank * n:(rank + 1) * n]):
            failures.append(f"reduce_scatter n={n}")
    check_path(comm, world, failures)
    return case, failures


def rooted_sweep(rank, world, seed=16):
    """reduce, gather and scatter on device buffers, from every root."""
    comm = rcoll.init(rank, world)
    failures, case = [], 0
    for dtype in (np.dtype(np.float32), np.dtype(np.int64), np.dtype(np.float16)):
        for n in (0, 1, world + 1, 1003):
            for root in range(world):
                case += 1
                op = "avg" if dtype.kind == "f" and case % 2 else "sum"
                x = make_input(seed, rank, dtype, n, op)
                expected = reduced(seed, world, dtype, n, op)
                got = comm.reduce(dev(x), op, root=root)
                if rank == root and not same(x, expected):
                    failures.append(f"reduce {dtype} {op} n={n} root={root}: {differences(x, expected)}")
                if rank != root and got is not None:
                    failures.append(f"reduce n={n}: a non-root got {got!r}")
                case += 1
                mine = make_input(seed, rank, dtype, n, "max")
                out = np.zeros((world, n), dtype) if rank == root else None
                comm.gather(dev(mine), root=root, out=dev(out) if out is not None else None)
                if rank == root and not same(out, stacked(seed, world, dtype, n, "max")):
                    failures.append(f"gather {dtype} n={n} root={root}")
                case += 1
                full = make_input(seed, root, dtype, n * world, "max")
                block = np.zeros(n, dtype)
                comm.scatter(dev(full) if rank == root else None, root=root, out=dev(block))
                if not same(block, full[rank * n:(rank + 1) * n]):
                    failures.append(f"scatter {dtype} n={n} root={root}")
    return case, failures


def rank_without_peer_access(rank, world, seed=17):
    """Rank 1's GPU has no peer access to the others' (emulated): CUDA IPC must
    be off on every rank, and the ops still right through staging."""
    if rank == 1:
        os.environ["EMULATED_DEVICE_ID"] = "emulated:1"
    comm = rcoll.init(rank, world)
    failures, case = [], 0
    dtype = np.dtype(np.float32)
    for n in (1, 1003):
        for _ in range(2):  # the fallback holds for later ops too
            case += 1
            x = make_input(seed, rank, dtype, n, "sum")
            comm.allreduce(dev(x))
            expected = reduced(seed, world, dtype, n, "sum")
            if not same(x, expected):
                failures.append(f"allreduce n={n}: {differences(x, expected)}")
    return comm.device_path, case, failures


def alltoall_sweep(rank, world, seed=18):
    """alltoall and alltoallv on device buffers: every dtype, equal blocks of
    0, 1, odd and many-segment sizes, irregular counts with zeros, everything
    to one rank. Device alltoall runs through the pipeline (staging or GPUDirect
    RDMA) on every transport, CUDA IPC windows or not."""
    comm = rcoll.init(rank, world)
    failures, case = [], 0
    for dtype in DTYPES:
        for n in sorted({0, 1, 7, max(world - 1, 0), 1000, 5000}):
            case += 1
            x = np.stack([_a2a_block(seed, rank, j, dtype, n) for j in range(world)])
            original = x.copy()
            got = np.zeros_like(x)
            handle = comm.alltoall(dev(x, readonly=True), out=dev(got), async_op=case % 2 == 0)
            if case % 2 == 0:
                handle.wait()
            expected = np.stack([_a2a_block(seed, j, rank, dtype, n) for j in range(world)])
            if not same(got, expected):
                failures.append(f"alltoall {dtype} n={n}: {differences(got, expected)}")
            if not same(x, original):
                failures.append(f"alltoall {dtype} n={n}: the input changed")
        for scale in (1, 151):
            case += 1
            counts = [[((s * 3 + d * 5) % 7) * scale for d in range(world)] for s in range(world)]
            send_counts = counts[rank]
            recv_counts = [counts[j][rank] for j in range(world)]
            x = np.concatenate([_a2a_block(seed, rank, j, dtype, send_counts[j]) for j in range(world)])
            got = np.full(sum(recv_counts), 1, dtype)
            comm.alltoall(dev(x), send_counts=send_counts, recv_counts=recv_counts, out=dev(got))
            expected = np.concatenate([_a2a_block(seed, j, rank, dtype, recv_counts[j]) for j in range(world)])
            if not same(got, expected):
                failures.append(f"alltoallv {dtype} scale={scale} counts={send_counts}/{recv_counts}: "
                                f"{differences(got, expected)}")
    for target in sorted({0, world - 1}):
        case += 1
        send_counts = [50 if j == target else 0 for j in range(world)]
        recv_counts = [50 if rank == target else 0 for _ in range(world)]
        x = _a2a_block(seed, rank, target, np.dtype("float32"), 50)
        got = np.zeros(sum(recv_counts), np.float32)
        comm.alltoall(dev(x), send_counts=send_counts, recv_counts=recv_counts, out=dev(got))
        expected = np.concatenate([_a2a_block(seed, j, rank, np.dtype("float32"), recv_counts[j])
                                   for j in range(world)])
        if not same(got, expected):
            failures.append(f"alltoallv to rank {target}: {differences(got, expected)}")
    # The device path of alltoall is the pipeline, even where CUDA IPC serves the others.
    path = comm.device_path
    if path != ("gdr" if expected_path(world) == "gdr" else "staging"):
        failures.append(f"device alltoall went through {path!r}")
    return case, failures


def alltoall_errors(rank, world):
    """Mistakes in a device alltoall raise on the caller's thread, naming the rank."""
    comm = rcoll.init(rank, world)
    messages = []
    x = np.ones(4 * world, np.float32)
    expect = _error_collector(messages)

    expect(lambda: comm.alltoall(dev(x), out=x))                                      # host + device mixed
    expect(lambda: comm.alltoall(dev(x)))                                             # no out, not torch
    expect(lambda: comm.alltoall(dev(x), out=dev(x)))                                 # in place
    expect(lambda: comm.alltoall(dev(x), out=dev(np.ones(4 * world, np.float64))))    # dtype differs
    expect(lambda: comm.alltoall(dev(np.ones(4 * world + 1, np.float32)), out=dev(np.ones(4 * world + 1, np.float32))))
    y = np.zeros_like(x)
    comm.alltoall(dev(x), out=dev(y))  # nothing was enqueued by the mistakes
    return messages, y.tolist()
