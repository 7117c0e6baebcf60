"""The numpy-level API: rcoll.init() and rcoll.Communicator."""
from __future__ import annotations

import os
from typing import Optional

import numpy as np

from . import _core
from ._buffers import address, as_array, dtype_code, reduce_op_code
from ._environment import resolve


class Handle:
    """An operation in flight. wait() returns its result or raises its error."""

    __slots__ = ("_work", "_result", "_keepalive")

    def __init__(self, work, result, keepalive):
        self._work = work
        self._result = result
        self._keepalive = keepalive  # the arrays the core reads and writes, alive until done

    def wait(self, timeout: Optional[float] = None):
        """Blocks until the op is done (at most `timeout` seconds) and returns its output array.

        Raises rcoll.TimeoutError if `timeout` passes first (the op keeps running),
        or the op's own error (rcoll.PeerError, rcoll.MismatchError, ...).
        """
        if not self._work.wait(timeout):
            raise _core.TimeoutError(
                f"op #{self._work.seq} is still running after waiting {timeout} s (it has its own timeout; "
                f"call wait() again or abort the communicator)")
        self._keepalive = None
        return self._result

    def is_completed(self) -> bool:
        return self._work.is_completed()

    @property
    def seq(self) -> int:
        return self._work.seq


class Communicator:
    """A group of ranks running collectives on numpy arrays (or any C-contiguous buffer).

    Every collective is asynchronous underneath: with async_op=True it returns a
    Handle at once; otherwise it waits and returns the output array. Ops run in
    the order they were issued, on a C++ thread, with the GIL released.
    """

    def __init__(self, rank=None, world_size=None, *, master_addr=None, master_port=None,
                 store=None, name: str = "default", timeout: Optional[float] = None):
        """`store`: rendezvous store. By default rank 0 hosts rcoll's own at
        master_addr:master_port. Any object with set(key, bytes), get(key) -> bytes
        (blocking) and add(key, int) -> int works too, torch.distributed.Store included.
        `name` separates communicators that share a store; `timeout` (seconds) bounds
        every op (default RCOLL_TIMEOUT, 30 min)."""
        rank, world_size, master_addr, master_port = resolve(rank, world_size, master_addr, master_port)
        connect_timeout = float(os.environ.get("RCOLL_CONNECT_TIMEOUT", "300"))
        self._server = None
        if store is None:
            if rank == 0:
                local = master_addr in ("127.0.0.1", "localhost", "::1")
                self._server = _core.TcpStoreServer(master_addr if local else "", master_port)
            store = _core.TcpStore(master_addr, master_port, connect_timeout)
        bind_hint = getattr(store, "local_address", "") or ""
        if not isinstance(store, _core.Store):
            # A caller's store (torch.distributed.Store, ...): bind data sockets to
            # the address that routes to MASTER_ADDR.
            store = _core.PythonStore(store)
            bind_hint = _core.source_address_for(master_addr)
        self._store = store
        self._comm = _core.Communicator(store, rank, world_size, name, float(timeout or 0), bind_hint)
        self.rank = rank
        self.size = world_size

    # -- introspection -----------------------------------------------------------------
    @property
    def transport(self) -> str:
        return self._comm.transport

    @property
    def timeout(self) -> float:
        return self._comm.timeout

    def __repr__(self):
        return f"rcoll.Communicator(rank={self.rank}, size={self.size}, transport={self.transport!r})"

    # -- collectives --------------------------------------------------------------------
    def _run(self, work, result, keepalive, async_op):
        handle = Handle(work, result, keepalive)
        return handle if async_op else handle.wait()

    def allreduce(self, array, op="sum", *, out=None, async_op=False, timeout=None):
        """Reduces `array` across ranks with `op` (sum, prod, min, max, avg, band, bor, bxor).

        In place unless `out` is given. Returns the result (or a Handle with async_op=True).
        """
        name = "allreduce"
        src = as_array(array, self.rank, name, "the input", writable=out is None)
        dst = src if out is None else as_array(out, self.rank, name, "out", writable=True)
        self._same_layout(src, dst, name, src.size)
        work = self._comm.allreduce(address(src), address(dst), src.size, dtype_code(src, self.rank, name),
                                    reduce_op_code(op, self.rank, name), float(timeout or 0))
        return self._run(work, out if out is not None else array, (src, dst), async_op)

    def allgather(self, array, *, out=None, async_op=False, timeout=None):
        """Gathers every rank's `array` into one array of shape (size, *array.shape).

        `out` (size * array.size elements) may be given; `array` may be this rank's
        slot of `out` (in place).
        """
        name = "allgather"
        src = as_array(array, self.rank, name, "the input", writable=False)
        if out is None:
            out = np.empty((self.size,) + src.shape, dtype=src.dtype)
        dst = as_array(out, self.rank, name, "out", writable=True)
        self._same_layout(src, dst, name, src.size * self.size)
        work = self._comm.allgather(address(src), address(dst), src.size, dtype_code(src, self.rank, name),
                                    float(timeout or 0))
        return self._run(work, out, (src, dst), async_op)

    def reduce_scatter(self, array, op="sum", *, out=None, async_op=False, timeout=None):
        """Reduces `array` (size * n elements) across ranks; rank r keeps block r (n elements).

        The result has shape array.shape[1:] when array is (size, ...) with ndim >= 2, else (n,).
        """
        name = "reduce_scatter"
        src = as_array(array, self.rank, name, "the input", writable=False)
        if src.size % self.size != 0:
            raise _core.InvalidArgumentError(
                f"rank {self.rank}: {name}: the input has {src.size} elements, not a multiple of the world "
                f"size {self.size}")
        n = src.size // self.size
        if out is None:
            shape = src.shape[1:] if src.ndim >= 2 and src.shape[0] == self.size else (n,)
            out = np.empty(shape, dtype=src.dtype)
        dst = as_array(out, self.rank, name, "out", writable=True)
        self._same_layout(src, dst, name, n)
        work = self._comm.reduce_scatter(address(src), address(dst), n, dtype_code(src, self.rank, name),
                                         reduce_op_code(op, self.rank, name), float(timeout or 0))
        return self._run(work, out, (src, dst), async_op)

    def broadcast(self, array, root: int = 0, *, out=None, async_op=False, timeout=None):
        """Copies the root's `array` to every rank: in place, or into `out` when given."""
        name = "broadcast"
        if not isinstance(root, (int, np.integer)) or not 0 <= root < self.size:
            raise _core.InvalidArgumentError(
                f"rank {self.rank}: {name}: root {root!r} is not a rank of this communicator (size {self.size})")
        src = as_array(array, self.rank, name, "the input", writable=out is None and self.rank != root)
        dst = src if out is None else as_array(out, self.rank, name, "out", writable=True)
        self._same_layout(src, dst, name, src.size)
        work = self._comm.broadcast(address(src), address(dst), src.size, dtype_code(src, self.rank, name),
                                    int(root), float(timeout or 0))
        return self._run(work, out if out is not None else array, (src, dst), async_op)

    def barrier(self, *, async_op=False, timeout=None):
        """Returns once every rank has entered the barrier."""
        return self._run(self._comm.barrier(float(timeout or 0)), None, None, async_op)

    # -- life cycle ---------------------------------------------------------------------
    def abort(self, reason: str = ""):
        """Fails every pending op at once (from any thread) and tells the peers; the communicator is unusable after."""
        self._comm.abort(reason)

    def shutdown(self):
        """Finishes the queued ops, then closes the connections."""
        self._comm.shutdown()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()
        return False

    def _same_layout(self, src, dst, name, dst_elements):
        if dst.dtype != src.dtype:
            raise _core.InvalidArgumentError(
                f"rank {self.rank}: {name}: out has dtype {dst.dtype} but the input has {src.dtype}")
        if dst.size != dst_elements:
            raise _core.InvalidArgumentError(
                f"rank {self.rank}: {name}: out has {dst.size} elements, expected {dst_elements}")


def init(rank=None, world_size=None, **kwargs) -> Communicator:
    """Creates the communicator of this process from arguments or the launcher's environment.

    Rank 0 hosts rcoll's rendezvous store on MASTER_ADDR:MASTER_PORT (default
    127.0.0.1:29500); the others connect to it.
    """
    return Communicator(rank, world_size, **kwargs)
