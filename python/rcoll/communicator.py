"""The numpy-level API: rcoll.init() and rcoll.Communicator."""
from __future__ import annotations

import operator
from typing import Optional

import numpy as np

from . import _core, _device, _watch
from . import grow as _grow
from ._buffers import HostBuffer, address, as_array, displacements, dtype_code
from ._environment import launcher_store, resolve, store_address
from ._in_flight import InFlight
from ._ops import (
    ADASUM,
    ALLGATHER,
    ALLREDUCE,
    BARRIER,
    BROADCAST,
    GATHER,
    REDUCE,
    REDUCE_SCATTER,
    SCATTER,
    op_name,
    reduce_op_code,
)
from ._registrations import RegistrationTracker
from .shrink import survivors


class Handle:
    """An operation in flight. wait() returns its result or raises its error."""

    __slots__ = ("_work", "_result", "_keepalive", "_on_release")

    def __init__(self, work, result, keepalive, on_release=None):
        self._work = work
        self._result = result
        self._keepalive = keepalive  # the arrays the core reads and writes, alive until done
        self._on_release = on_release  # runs once the op no longer uses them

    def _release(self):
        self._keepalive = None
        if self._on_release is not None:
            on_release, self._on_release = self._on_release, None
            on_release()

    def __del__(self):
        # The arrays stay alive in the communicator's InFlight while the op runs;
        # in-use registrations are dropped when their transfer ends.
        if self._on_release is not None:
            self._release()

    def wait(self, timeout: Optional[float] = None):
        """Blocks until the op is done (at most `timeout` seconds) and returns its output array.

        Raises rcoll.TimeoutError if `timeout` passes first (the op keeps running),
        or the op's own error (rcoll.PeerError, rcoll.MismatchError, ...).
        """
        if not self._work.wait(timeout):
            raise _core.TimeoutError(
                f"op #{self._work.seq} is still running after waiting {timeout} s (it has its own timeout; "
                f"call wait() again or abort the communicator)")
        self._release()
        return self._result

    def is_completed(self) -> bool:
        return self._work.is_completed()

    @property
    def seq(self) -> int:
        return self._work.seq

    @property
    def source_rank(self) -> int:
        """recv: the rank the message came from (for recv(src=None), known once it
        completed); -1 for other ops."""
        return self._work.source_rank


class Communicator:
    """A group of ranks running collectives on numpy arrays (or any C-contiguous buffer).

    Every collective is asynchronous underneath: with async_op=True it returns a
    Handle at once; otherwise it waits and returns the output array. Ops run in
    the order they were issued, on a C++ thread, with the GIL released.
    """

    def __init__(self, rank=None, world_size=None, *, master_addr=None, master_port=None,
                 store=None, name: str = "default", timeout: Optional[float] = None,
                 settings: Optional[dict] = None):
        """`store`: rendezvous store. By default rank 0 hosts rcoll's own at
        master_addr:master_port. Any object with set(key, bytes), get(key) -> bytes
        (blocking) and add(key, int) -> int works too, torch.distributed.Store included.
        `name` separates communicators that share a store; `timeout` (seconds) bounds
        every op (default RCOLL_TIMEOUT, 30 min). `settings` gives this communicator
        values of RCOLL_* variables over the environment's, e.g.
        {"RCOLL_IB_HCA": "mlx5_1", "RCOLL_TRANSPORT": "tcp"} (docs/environment.md;
        RCOLL_DEBUG, RCOLL_IBVERBS_LIB and RCOLL_DEVICE_RUNTIME are per process)."""
        rank, world_size, master_addr, master_port = resolve(rank, world_size, master_addr, master_port)
        settings = {str(k): str(v) for k, v in (settings or {}).items()}
        connect_timeout = _core.settings(settings)["connect_timeout"]  # RCOLL_CONNECT_TIMEOUT, parsed by the core
        self._server = None
        if store is None:
            store = launcher_store(master_addr, master_port, connect_timeout)
        if store is None:
            if rank == 0:
                local = master_addr in ("127.0.0.1", "localhost", "::1")
                self._server = _core.TcpStoreServer(master_addr if local else "", master_port)
                master_port = self._server.port  # port 0 (a world of one): the one the system gave
            store = _core.TcpStore(master_addr, master_port, connect_timeout)
        bind_hint = getattr(store, "local_address", "") or ""
        watched_store = store if isinstance(store, _core.TcpStore) or not isinstance(store, _core.Store) else None
        if not isinstance(store, _core.Store):
            store = _core.PythonStore(store)
        if isinstance(store, _core.PythonStore):
            # A caller's store (torch.distributed.Store, ...): bind data sockets to
            # the address that routes to MASTER_ADDR.
            bind_hint = _core.source_address_for(master_addr)
        self._store = store
        self._comm = _core.Communicator(store, rank, world_size, name, float(timeout or 0), bind_hint, settings)
        if watched_store is not None:
            _watch.watch(self._comm, watched_store, rank, world_size)
        # What a shrink needs to build the survivors' communicator like this one.
        self._name, self._timeout_arg, self._settings, self._master_addr = name, timeout, settings, master_addr
        self._connect_timeout = connect_timeout
        # Ranks joining later (grow.py) find the job under its first communicator's name.
        self._root, self._admitted = name, 0
        self._registrations = (RegistrationTracker(self._comm.invalidate_memory)
                               if self._comm.caches_registrations else None)
        self._in_flight = InFlight()
        self.rank = rank
        self.size = world_size

    def __del__(self):
        # Dropped with async ops still running (their Handles dropped too, say by
        # an exception): abort them before their arrays may be freed.
        in_flight = getattr(self, "_in_flight", None)
        if in_flight is not None and in_flight.running():
            self._comm.abort(f"rank {self.rank}: the communicator was dropped with operations in flight")
            in_flight.settle(5.0, f"rank {self.rank}: communicator dropped")

    # -- introspection -----------------------------------------------------------------
    @property
    def transport(self) -> str:
        """"shm", "tcp", "ib", or "shm+tcp" / "shm+ib" when this rank has edges of both kinds."""
        return self._comm.transport

    @property
    def transports(self) -> list:
        """The transport of this rank's edge to each rank, indexed by rank ("self" for this one)."""
        return list(self._comm.transports)

    @property
    def topology(self) -> dict:
        """Where the ranks are, as every rank computes it from the host identities
        they published: "hosts" (each host's ranks), "host_of", "local_rank",
        "host_order" (the order rings follow, host by host), "text"
        ("2 hosts: [0 2] [1 3]", also in the RCOLL_DEBUG=INFO log) and
        "algorithms" (which ones the collectives use, and why)."""
        return dict(self._comm.topology)

    @property
    def device_path(self) -> str:
        """How the last op on GPU buffers moved its data: "cuda-ipc" (device to
        device through CUDA IPC windows: every rank on one host), "gdr"
        (GPUDirect RDMA: the NIC reads and writes GPU memory, RCOLL_GDR),
        "staging" (pinned host memory over the transport), or "none" before
        the first."""
        return self._comm.device_path

    @property
    def timeout(self) -> float:
        return self._comm.timeout

    def __repr__(self):
        return f"rcoll.Communicator(rank={self.rank}, size={self.size}, transport={self.transport!r})"

    # -- collectives --------------------------------------------------------------------
    def _run(self, work, result, keepalive, async_op):
        if not async_op and self._registrations is None:
            # The small-op path: a blocking op has usually run inline already,
            # and nothing needs releasing, so no Handle. wait() raises its error.
            work.wait(None)
            return result
        on_release = None
        if self._registrations is not None and keepalive is not None:  # the transport caches registrations
            arrays = keepalive if isinstance(keepalive, (tuple, list)) else (keepalive,)
            spans = [span for span in (self._registrations.track(a) for a in arrays if a is not None)
                     if span is not None]
            if spans:
                on_release = self._registrations.forget_later(spans)
        self._in_flight.hold(work, keepalive)
        handle = Handle(work, result, keepalive, on_release)
        return handle if async_op else handle.wait()

    def allreduce(self, array, op="sum", *, out=None, async_op=False, timeout=None):
        """Reduces `array` across ranks with `op` (sum, prod, min, max, avg, band, bor, bxor).

        In place unless `out` is given. Returns the result (or a Handle with async_op=True).
        """
        # Plain numpy arrays: checked and issued in one C++ call (it declines
        # anything else, which takes the full path below).
        if self._registrations is None:
            done = self._comm.run_arrays(ALLREDUCE, array, out, op, 0, timeout, not async_op)
            if done is not False:
                return self._arrays_issued(done, out if out is not None else array, (array, out), async_op)
        name = "allreduce"
        device = self._on_device(array, out)
        src = self._view(array, device, name, "the input", writable=out is None)
        dst = src if out is None else self._view(out, device, name, "out", writable=True)
        self._same_layout(src, dst, name, src.size)
        return self._issue(ALLREDUCE, src, dst, src.size, reduce_op_code(op, f"rank {self.rank}: {name}"), 0, timeout,
                           out if out is not None else array, async_op)

    def allgather(self, array, *, out=None, async_op=False, timeout=None):
        """Gathers every rank's `array` into one array of shape (size, *array.shape).

        `out` (size * array.size elements) may be given; `array` may be this rank's
        slot of `out` (in place).
        """
        if self._registrations is None and type(array) is np.ndarray:
            # Plain numpy arrays: checked and issued in one C++ call (which
            # declines anything else: the full path below then answers).
            if out is None:
                out = np.empty((self.size,) + array.shape, dtype=array.dtype)
            done = self._comm.run_arrays(ALLGATHER, array, out, None, 0, timeout, not async_op)
            if done is not False:
                return self._arrays_issued(done, out, (array, out), async_op)
        name = "allgather"
        device = self._on_device(array, out)
        src = self._view(array, device, name, "the input", writable=False)
        if out is None:
            out = self._empty(src, (self.size,) + tuple(src.shape), name)
        dst = self._view(out, device, name, "out", writable=True)
        self._same_layout(src, dst, name, src.size * self.size)
        return self._issue(ALLGATHER, src, dst, src.size, 0, 0, timeout, out, async_op)

    def reduce_scatter(self, array, op="sum", *, out=None, async_op=False, timeout=None):
        """Reduces `array` (size * n elements) across ranks; rank r keeps block r (n elements).

        The result has shape array.shape[1:] when array is (size, ...) with ndim >= 2, else (n,).
        """
        if self._registrations is None and type(array) is np.ndarray and array.size % self.size == 0:
            if out is None:  # the shape _block_output gives
                shape = array.shape[1:] if array.ndim >= 2 and array.shape[0] == self.size else \
                    (array.size // self.size,)
                out = np.empty(shape, dtype=array.dtype)
            done = self._comm.run_arrays(REDUCE_SCATTER, array, out, op, 0, timeout, not async_op)
            if done is not False:
                return self._arrays_issued(done, out, (array, out), async_op)
        name = "reduce_scatter"
        device = self._on_device(array, out)
        src = self._view(array, device, name, "the input", writable=False)
        n, out = self._block_output(src, out, name)
        dst = self._view(out, device, name, "out", writable=True)
        self._same_layout(src, dst, name, n)
        return self._issue(REDUCE_SCATTER, src, dst, n, reduce_op_code(op, f"rank {self.rank}: {name}"), 0, timeout,
                           out, async_op)

    def broadcast(self, array, root: int = 0, *, out=None, async_op=False, timeout=None):
        """Copies the root's `array` to every rank: in place, or into `out` when given."""
        if self._registrations is None:
            done = self._comm.run_arrays(BROADCAST, array, out, None, root, timeout, not async_op)
            if done is not False:
                return self._arrays_issued(done, out if out is not None else array, (array, out), async_op)
        name = "broadcast"
        root = self._root_index(root, name)
        device = self._on_device(array, out)
        src = self._view(array, device, name, "the input", writable=out is None and self.rank != root)
        dst = src if out is None else self._view(out, device, name, "out", writable=True)
        self._same_layout(src, dst, name, src.size)
        return self._issue(BROADCAST, src, dst, src.size, 0, int(root), timeout, out if out is not None else array,
                           async_op)

    def adasum(self, array, *, out=None, timeout=None):
        """Combines `array` across ranks with Adasum, Horovod's adaptive summation:
        in place unless `out` is given; returns the result.

        Two vectors a, b combine as (1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b
        (the sum of orthogonal vectors, the average of equal ones), ranks paired
        along a binary tree over the rank order. float16, bfloat16, float32 and
        float64 host arrays; the world size must be a power of two (docs/numpy.md).
        """
        name = "adasum"
        device = self._on_device(array, out)  # refused by the core, which words it
        src = self._view(array, device, name, "the input", writable=out is None)
        dst = src if out is None else self._view(out, device, name, "out", writable=True)
        self._same_layout(src, dst, name, src.size)
        return self._issue(ADASUM, src, dst, src.size, 0, 0, timeout, out if out is not None else array, False)

    # -- buffers, host or device (__cuda_array_interface__) ----------------------------
    @staticmethod
    def _on_device(array, out) -> bool:
        return _device.is_device_buffer(array) or _device.is_device_buffer(out)

    def _view(self, obj, device, name, what, writable):
        """A checked view of one buffer of an op whose buffers are on a GPU
        (`device`) or in host memory: the same fields either way."""
        if not device:
            return HostBuffer(obj, self.rank, name, what, writable)
        _device.ensure_runtime(self.rank, name)
        if not _device.is_device_buffer(obj):
            raise _core.InvalidArgumentError(
                f"rank {self.rank}: {name}: {what} is in host memory but the other buffer is on a GPU; pass "
                f"both on the GPU or both on the host")
        return _device.DeviceBuffer(obj, self.rank, name, what, writable)

    def _empty(self, like, shape, name):
        """A new output of `shape` with the dtype of `like` (a view), where `like` is."""
        if isinstance(like, HostBuffer):
            return np.empty(shape, dtype=like.array.dtype)
        try:  # rcoll allocates no GPU memory of its own: torch tensors only
            import torch
        except ImportError:
            torch = None
        if torch is not None and isinstance(like.obj, torch.Tensor):
            return torch.empty(shape, dtype=like.obj.dtype, device=like.obj.device)
        raise _core.InvalidArgumentError(
            f"rank {self.rank}: {name}: pass out= for GPU buffers that are not torch tensors (rcoll does not "
            f"allocate GPU memory for other array types)")

    def _arrays_issued(self, done, result, arrays, async_op):
        """The end of run_arrays: True when the blocking op is done, else the queued op's Work."""
        return result if done is True else self._run(done, result, arrays, async_op)

    def _issue(self, kind, src, dst, count, op, root, timeout, result, async_op):
        """Enqueues the collective on the checked views (src or dst is None where
        this rank does not use it: rooted ops) and returns its result or Handle."""
        first = src if src is not None else dst
        send = src.address if src is not None else 0
        recv = dst.address if dst is not None else 0
        if isinstance(first, HostBuffer):
            work = self._comm.collective(kind, send, recv, count, first.code, op, root, float(timeout or 0),
                                         not async_op)
            return self._run(work, result, (src and src.array, dst and dst.array), async_op)
        # Device buffers: the op waits for the producer's stream (the input's,
        # else the output's); Handle.wait() returns once the result is in place
        # on the device. No RDMA registration tracking: device memory never
        # reaches the transport.
        stream = (src.stream if src is not None else 0) or (dst.stream if dst is not None else 0)
        device = _device.device_of((src, dst), self.rank, op_name(kind))
        work = self._comm.collective(kind, send, recv, count, first.code, op, root, float(timeout or 0), False, device,
                                     stream)
        return self._run_device(work, result, (src and src.obj, dst and dst.obj), async_op)

    def _run_device(self, work, result, keepalive, async_op):
        self._in_flight.hold(work, keepalive)
        handle = Handle(work, result, keepalive)
        return handle if async_op else handle.wait()

    # -- point to point ----------------------------------------------------------------
    def send(self, array, dst: int, *, tag: int = 0, async_op=False, timeout=None):
        """Sends `array` to rank `dst`, which must post a matching recv (same tag, dtype and size).

        Point-to-point messages never wait behind collectives; between two ranks
        they match in the order they were issued.
        """
        src = as_array(array, self.rank, "send", "the input", writable=False)
        work = self._comm.send(address(src), src.size, dtype_code(src, self.rank, "send"), int(dst), int(tag),
                               float(timeout or 0))
        return self._run(work, None, (src,), async_op)

    def recv(self, array, src: Optional[int] = None, *, tag: int = 0, async_op=False, timeout=None):
        """Receives into `array` the message rank `src` sends with the same tag.

        `src=None` receives from any source: the first message with this tag that
        no receive naming its sender takes (messages from one rank still match in
        order); the async Handle's `source_rank` then names the sender. Over
        verbs a sender must be named.
        """
        dst = as_array(array, self.rank, "recv", "the output", writable=True)
        work = self._comm.recv(address(dst), dst.size, dtype_code(dst, self.rank, "recv"),
                               None if src is None else int(src), int(tag), float(timeout or 0))
        return self._run(work, array, (dst,), async_op)

    def barrier(self, *, async_op=False, timeout=None):
        """Returns once every rank has entered the barrier."""
        work = self._comm.collective(BARRIER, 0, 0, 0, 0, 0, 0, float(timeout or 0), not async_op)
        return self._run(work, None, None, async_op)

    def monitored_barrier(self, *, timeout=None, wait_all_ranks: bool = False):
        """A barrier that names who did not come (torch's monitored_barrier): if
        some rank does not reach it within `timeout` seconds (default: the
        communicator's), rank 0 raises rcoll.TimeoutError naming the lowest such
        rank or, with wait_all_ranks=True, every one, and the other ranks fail
        with rank 0's report. The communicator is unusable after a failure."""
        self._comm.monitored_barrier(float(timeout or 0), bool(wait_all_ranks))

    def reduce(self, array, op="sum", root: int = 0, *, out=None, async_op=False, timeout=None):
        """Reduces `array` across ranks with `op` (as allreduce); only the root receives the result.

        On the root the result goes into `array` (in place) or into `out`, which is
        returned. Other ranks only read `array`, ignore `out` and return None (so
        does their Handle's wait()).
        """
        if self._registrations is None and type(root) is int:
            is_root = self.rank == root
            done = self._comm.run_arrays(REDUCE, array, out if is_root else None, op, root, timeout, not async_op)
            if done is not False:
                result = (array if out is None else out) if is_root else None
                return self._arrays_issued(done, result, (array, out if is_root else None), async_op)
        name = "reduce"
        root = self._root_index(root, name)
        is_root = self.rank == root
        device = self._on_device(array, out if is_root else None)
        src = self._view(array, device, name, "the input", writable=is_root and out is None)
        dst = None
        if is_root:
            dst = src if out is None else self._view(out, device, name, "out", writable=True)
            self._same_layout(src, dst, name, src.size)
        result = (array if out is None else out) if is_root else None
        return self._issue(REDUCE, src, dst, src.size, reduce_op_code(op, f"rank {self.rank}: {name}"), int(root),
                           timeout, result, async_op)

    def gather(self, array, root: int = 0, *, out=None, async_op=False, timeout=None):
        """Gathers every rank's `array` on the root, in an array of shape (size, *array.shape).

        On the root, `out` (size * array.size elements) may be given, and `array`
        may be its slot out[root] (in place); the result is returned. Other ranks
        ignore `out` and return None.
        """
        if self._registrations is None and type(root) is int and type(array) is np.ndarray:
            if self.rank == root and out is None:
                out = np.empty((self.size,) + array.shape, dtype=array.dtype)
            dst = out if self.rank == root else None
            done = self._comm.run_arrays(GATHER, array, dst, None, root, timeout, not async_op)
            if done is not False:
                return self._arrays_issued(done, dst, (array, dst), async_op)
        name = "gather"
        root = self._root_index(root, name)
        device = self._on_device(array, out if self.rank == root else None)
        src = self._view(array, device, name, "the input", writable=False)
        dst = None
        if self.rank == root:
            if out is None:
                out = self._empty(src, (self.size,) + tuple(src.shape), name)
            dst = self._view(out, device, name, "out", writable=True)
            self._same_layout(src, dst, name, src.size * self.size)
        else:
            out = None
        return self._issue(GATHER, src, dst, src.size, 0, int(root), timeout, out, async_op)

    def scatter(self, array=None, root: int = 0, *, out=None, async_op=False, timeout=None):
        """Sends block r of the root's `array` (size * n elements, e.g. shape (size, ...)) to rank r.

        Returns this rank's block: `out` when given, else (on the root) a new array
        of shape array.shape[1:] when `array` is (size, ...) with ndim >= 2, or (n,).
        Other ranks ignore `array` (pass None) and must pass `out`: it tells them
        how many elements of which dtype to expect. On the root `out` may be
        array[root] (in place).
        """
        if self._registrations is None and type(root) is int and type(out) is np.ndarray:
            src = array if self.rank == root else None
            done = self._comm.run_arrays(SCATTER, src, out, None, root, timeout, not async_op)
            if done is not False:
                return self._arrays_issued(done, out, (src, out), async_op)
        name = "scatter"
        root = self._root_index(root, name)
        device = self._on_device(array if self.rank == root else None, out)
        src = None
        if self.rank == root:
            if array is None:
                raise _core.InvalidArgumentError(
                    f"rank {self.rank}: {name}: the root must pass the array to scatter (size * n elements)")
            src = self._view(array, device, name, "the input", writable=False)
            n, out = self._block_output(src, out, name)
            dst = self._view(out, device, name, "out", writable=True)
            self._same_layout(src, dst, name, n)
        else:
            if out is None:
                raise _core.InvalidArgumentError(
                    f"rank {self.rank}: {name}: out is required on ranks other than the root {root} (it says how "
                    f"many elements of which dtype this rank receives)")
            dst = self._view(out, device, name, "out", writable=True)
            n = dst.size
        return self._issue(SCATTER, src, dst, n, 0, int(root), timeout, out, async_op)

    def alltoall(self, array, *, out=None, send_counts=None, recv_counts=None, async_op=False, timeout=None):
        """Every rank sends block j of `array` to rank j and receives rank j's block into block j of the result.

        Without counts the blocks are equal: array.size must be a multiple of the
        world size, and the result has the shape of `array` (for example (size, n)).
        With `send_counts` and `recv_counts` (both, one element count per rank:
        alltoallv) `array` holds sum(send_counts) elements, block j (send_counts[j]
        elements) for rank j, in rank order; the result is 1-D with sum(recv_counts)
        elements, block j from rank j. recv_counts[j] must equal rank j's
        send_counts[rank] (a disagreement raises rcoll.MismatchError on the
        receiver). `out` may be given; it must not overlap `array`.
        """
        name = "alltoall"
        if (send_counts is None) != (recv_counts is None):
            raise _core.InvalidArgumentError(
                f"rank {self.rank}: {name}: pass both send_counts and recv_counts, or neither (equal split)")
        device = self._on_device(array, out)
        src = self._view(array, device, name, "the input", writable=False)
        send_counts, recv_counts, shape = self._alltoall_counts(src.size, tuple(src.shape), send_counts, recv_counts)
        if out is None:
            out = self._empty(src, shape, name)
        dst = self._view(out, device, name, "out", writable=True)
        self._same_layout(src, dst, name, sum(recv_counts))
        if src.size > 0 and dst.size > 0 and src.address < dst.address + dst.nbytes and \
                dst.address < src.address + src.nbytes:
            raise _core.InvalidArgumentError(
                f"rank {self.rank}: {name}: out overlaps the input; alltoall cannot run in place")
        counts = (send_counts, displacements(send_counts), recv_counts, displacements(recv_counts))
        if isinstance(src, HostBuffer):
            work = self._comm.alltoall(src.address, dst.address, *counts, src.code, float(timeout or 0), not async_op)
            return self._run(work, out, (src.array, dst.array), async_op)
        device = _device.device_of((src, dst), self.rank, name)
        work = self._comm.alltoall(src.address, dst.address, *counts, src.code, float(timeout or 0), False, device,
                                   src.stream or dst.stream)
        return self._run_device(work, out, (src.obj, dst.obj), async_op)

    def _alltoall_counts(self, total, shape, send_counts, recv_counts):
        """(send_counts, recv_counts, result shape) for an input of `total`
        elements: equal blocks when no counts are given (the result keeps the
        input's shape), else the checked counts (a 1-D result)."""
        name = "alltoall"
        if send_counts is None:
            if total % self.size != 0:
                raise _core.InvalidArgumentError(
                    f"rank {self.rank}: {name}: the input has {total} elements, not a multiple of the world "
                    f"size {self.size} (pass send_counts and recv_counts for unequal blocks)")
            counts = [total // self.size] * self.size
            return counts, counts, shape
        send_counts = self._counts(send_counts, "send_counts", name)
        recv_counts = self._counts(recv_counts, "recv_counts", name)
        if sum(send_counts) != total:
            raise _core.InvalidArgumentError(
                f"rank {self.rank}: {name}: send_counts add up to {sum(send_counts)} elements but the input has "
                f"{total}")
        return send_counts, recv_counts, (sum(recv_counts),)

    # -- life cycle ---------------------------------------------------------------------
    def abort(self, reason: str = ""):
        """Fails every pending op at once (from any thread) and tells the peers; the communicator is unusable after."""
        self._comm.abort(reason)

    def shutdown(self, grace: Optional[float] = None):
        """Takes no more ops, lets the pending ones finish for up to `grace` seconds
        (default RCOLL_SHUTDOWN_TIMEOUT, 10 s), aborts what is left, closes the
        connections. Safe from any thread."""
        self._comm.shutdown(float(grace or 0))

    def shrink(self, exclude=None, *, timeout: Optional[float] = None, lost=()) -> "Communicator":
        """The communicator of the survivors, after a rank failed: call it on every
        surviving rank (typically on catching rcoll.PeerError). It ends this
        communicator (its pending ops fail, the peers are told) and returns a new
        one whose ranks are the survivors in their old order (new rank = position
        among them), with this one's settings and timeout; shrink it again after
        another failure.

        `exclude`: the ranks to leave out, the same list on every survivor (those
        ranks must not call shrink); no waiting, as NCCL's ncclCommShrink. Without
        it the survivors agree through the rendezvous store: ranks whose
        connections died are left out at once, any other rank is waited for until
        `timeout` (default RCOLL_CONNECT_TIMEOUT) and left out if it does not come
        (python/rcoll/shrink.py). The store must outlive the failed ranks: under
        torchrun the agent hosts it; rcoll's own store lives in rank 0's process,
        so without torchrun a failure of rank 0 cannot be shrunk past (pass
        store= a store hosted elsewhere). `lost`: ranks (of this communicator)
        whose death this rank saw elsewhere, on a communicator of the same
        ranks: no one waits for them either."""
        name = f"{self._name}/shrink"
        members = survivors(self._comm, self._store, self._comm.rendezvous_prefix + "shrink", exclude,
                            float(timeout or self._connect_timeout), "store=", lost)
        shrunk = Communicator(members.index(self.rank), len(members), store=self._store, name=name,
                              master_addr=self._master_addr, timeout=self._timeout_arg, settings=self._settings)
        shrunk._server, self._server = self._server, None  # rank 0's store serves the survivors too
        shrunk._root, shrunk._admitted = self._root, self._admitted
        return shrunk

    @classmethod
    def join(cls, name: str = "default", *, master_addr=None, master_port=None, timeout: Optional[float] = None,
             settings: Optional[dict] = None) -> "Communicator":
        """Joins a running job as a new rank: for a process started after the
        job (a scheduler adding capacity), given the job's store address
        (arguments, else MASTER_ADDR / MASTER_PORT) and the `name` of its first
        communicator. Waits until the job's ranks take it in (their grow()),
        at most `timeout` seconds (default RCOLL_TIMEOUT, 30 min), and returns
        the grown communicator: this rank comes after the job's, in the order
        the newcomers arrived (python/rcoll/grow.py)."""
        settings = {str(k): str(v) for k, v in (settings or {}).items()}
        parsed = _core.settings(settings)
        master_addr, master_port = store_address(master_addr, master_port)
        store = launcher_store(master_addr, master_port, parsed["connect_timeout"])
        if store is None:
            store = _core.TcpStore(master_addr, master_port, parsed["connect_timeout"])
        if not isinstance(store, _core.Store):
            store = _core.PythonStore(store)
        admission = _grow.wait_for_admission(store, name, float(timeout or parsed["timeout"]),
                                             f"{master_addr}:{master_port}")
        comm = cls(admission.rank, admission.size, store=store, name=admission.name, master_addr=master_addr,
                   timeout=timeout, settings=settings)
        comm._root, comm._admitted = name, admission.last_ticket
        return comm

    def joiners_waiting(self) -> int:
        """The last ticket of the ranks waiting to join (Communicator.join), 0
        when none waits: a look at the store (one round trip) from this rank
        alone. Pass the number to grow() on every rank."""
        ticket = _grow.last_ticket(self._store, self._root)
        return ticket if ticket > self._admitted else 0

    def grow(self, last_ticket: int) -> "Communicator":
        """Takes in the ranks waiting to join up to `last_ticket` (as
        joiners_waiting() read it on one rank; every rank of this communicator
        calls grow() with the same number). Ends this communicator (call it
        with no op pending) and returns one of its ranks, with the same rank
        numbers, followed by the newcomers, with this one's settings and timeout."""
        last_ticket = operator.index(last_ticket)
        newcomers = last_ticket - self._admitted
        if newcomers <= 0:
            raise _core.InvalidArgumentError(
                f"rank {self.rank}: grow: ticket {last_ticket} was admitted already (last admitted: {self._admitted})")
        size = self.size + newcomers
        name = f"{self._root}/grow{last_ticket}"
        if self.rank == 0:
            _grow.admit(self._store, self._root, self._admitted + 1,
                        [_grow.Admission(self.size + i, size, name, last_ticket) for i in range(newcomers)])
        self.shutdown()
        grown = Communicator(self.rank, size, store=self._store, name=name, master_addr=self._master_addr,
                             timeout=self._timeout_arg, settings=self._settings)
        grown._server, self._server = self._server, None  # rank 0's store serves the grown job too
        grown._root, grown._admitted = self._root, last_ticket
        return grown

    def group(self, ranks, *, name: str, settings: Optional[dict] = None) -> Optional["Communicator"]:
        """The communicator of `ranks` (ranks of this one, any order, no
        repeats), for a collective over part of the job, as MPI_Comm_create_group.
        Only those ranks call it, with the same ranks and `name` (which keeps
        groups on one store apart: give each its own); each gets a new rank,
        its position in sorted(ranks), and this one's settings (with `settings`
        over them) and timeout. Returns None on a rank not in `ranks`, without
        waiting."""
        members = self._counts_as_ranks(ranks, "group")
        if self.rank not in members:
            return None
        return Communicator(members.index(self.rank), len(members), store=self._store, name=f"{self._name}/{name}",
                            master_addr=self._master_addr, timeout=self._timeout_arg,
                            settings={**self._settings, **(settings or {})})

    def _counts_as_ranks(self, ranks, name):
        try:
            members = sorted(operator.index(r) for r in ranks)
        except TypeError:
            raise _core.InvalidArgumentError(
                f"rank {self.rank}: {name}: ranks must be a sequence of integers, got {ranks!r}") from None
        bad = [r for r in members if not 0 <= r < self.size]
        if bad or len(set(members)) != len(members) or not members:
            why = (f"rank {bad[0]} is not a rank of this communicator (size {self.size})" if bad else
                   "a rank is listed twice" if members else "no ranks")
            raise _core.InvalidArgumentError(f"rank {self.rank}: {name}: {why}")
        return members

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
        return False

    def _root_index(self, root, name):
        """The root as the core takes it, a C int; the core checks that it is a
        rank of this communicator (op_table.cc), as it does for every caller."""
        try:
            value = operator.index(root)
        except TypeError:
            value = None
        if value is None or not -2**31 <= value < 2**31:
            raise _core.InvalidArgumentError(
                f"rank {self.rank}: {name}: root {root!r} is not a rank of this communicator (size {self.size})")
        return value

    def _counts(self, counts, what, name):
        """A list of `size` non-negative Python ints from a sequence of integers."""
        try:
            values = [operator.index(c) for c in counts]
        except TypeError:
            raise _core.InvalidArgumentError(
                f"rank {self.rank}: {name}: {what} must be a sequence of integers, got {counts!r}") from None
        if len(values) != self.size:
            raise _core.InvalidArgumentError(
                f"rank {self.rank}: {name}: {what} has {len(values)} entries, expected one per rank ({self.size})")
        negative = [c for c in values if c < 0]
        if negative:
            raise _core.InvalidArgumentError(
                f"rank {self.rank}: {name}: {what} has a negative count ({negative[0]})")
        return values

    def _block_output(self, src, out, name):
        """For ops that hand each rank one of `size` blocks of `src` (a view): the
        block's element count, and `out` (allocated when None: shape
        src.shape[1:] when src is (size, ...) with ndim >= 2, else (n,))."""
        if src.size % self.size != 0:
            raise _core.InvalidArgumentError(
                f"rank {self.rank}: {name}: the input has {src.size} elements, not a multiple of the world "
                f"size {self.size}")
        n = src.size // self.size
        if out is None:
            shape = tuple(src.shape)
            out = self._empty(src, shape[1:] if len(shape) >= 2 and shape[0] == self.size else (n,), name)
        return n, out

    def _same_layout(self, src, dst, name, dst_elements):
        if dst.code != src.code:
            raise _core.InvalidArgumentError(
                f"rank {self.rank}: {name}: out has dtype {dst.dtype_name} but the input has {src.dtype_name}")
        if dst.size != dst_elements:
            raise _core.InvalidArgumentError(
                f"rank {self.rank}: {name}: out has {dst.size} elements, expected {dst_elements}")


def init(rank=None, world_size=None, **kwargs) -> Communicator:
    """Creates the communicator of this process from arguments or the launcher's environment.

    Rank 0 hosts rcoll's rendezvous store on MASTER_ADDR:MASTER_PORT (default
    127.0.0.1:29500); the others connect to it. Under torchrun, every rank joins
    the store torchrun already hosts there instead. With RCOLL_ELASTIC_JOIN=1
    and no rank given, this process joins a running job instead
    (Communicator.join).
    """
    settings = kwargs.get("settings")
    if rank is None and _core.settings({str(k): str(v) for k, v in (settings or {}).items()})["elastic_join"]:
        kwargs.pop("store", None)
        return Communicator.join(**kwargs)
    return Communicator(rank, world_size, **kwargs)
