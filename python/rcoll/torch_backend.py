"""The torch.distributed backend "rcoll".

    torch.distributed.init_process_group(backend="rcoll")

works without importing rcoll: the package declares a `torch.backends` entry
point (rcoll._torch_entry) that registers the backend when torch is imported.

RcollProcessGroup is a Python subclass of torch's ProcessGroup; torch's pybind
trampoline dispatches collectives to it (from Python front-end calls and from
C++ consumers such as DDP's reducer). This layer only translates arguments:
tensors reach the core as (address, element count, dtype code); queueing,
ordering, the algorithms and completion live in the C++ core.

Work objects and the thread that completes their futures are in _torch_work.py;
this file maps torch's calls onto the core's ops.
"""
from __future__ import annotations

import functools
import os
from datetime import timedelta
from typing import List, Optional, Tuple

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions

from . import _core
from ._buffers import displacements
from ._ops import (
    ALLGATHER,
    ALLREDUCE,
    AVG,
    BARRIER,
    BROADCAST,
    GATHER,
    REDUCE,
    REDUCE_SCATTER,
    SCATTER,
    SUM,
    codes_by_enum_value,
    reduce_op_name,
)
from ._registrations import RegistrationTracker
from ._torch_tensors import DTYPE_CODES as _DTYPE_CODES
from ._torch_tensors import HOST, placement
from ._torch_tensors import check_tensor as _check_tensor
from ._torch_work import RcollWork, _combined, _done_work, _FinishedWork
from ._watch import watch
from .shrink import survivors

BACKEND_NAME = "rcoll"

# torch's reduce ops by the enum's integer value: hashing and comparing torch's
# pybind enums costs about a microsecond per op, an int key a few nanoseconds.
_OP_CODES_BY_VALUE = codes_by_enum_value(dist.ReduceOp.RedOpType.__members__.values())
_STRIDED = torch.strided
# The reduce op most calls pass: `opts.reduceOp == SUM` costs a fifth of
# reading the enum's value out of torch's ReduceOp.
_TORCH_SUM = dist.ReduceOp.SUM


def _complex_as_real(method):
    """Complex tensors move as real pairs (view_as_real: the same memory), as
    the core has no complex dtype. torch's front end does this itself before
    some calls (all_reduce; broadcast and all_gather, but not in 2.4), not before
    others (gather, scatter, alltoall, send/recv), and C++ callers never do,
    so every method that only moves data does it here."""
    def convert(x):
        if isinstance(x, torch.Tensor):
            return torch.view_as_real(x) if x.is_complex() else x
        if isinstance(x, (list, tuple)):
            return [convert(item) for item in x]
        return x

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        return method(self, *[convert(a) for a in args], **kwargs)
    return wrapper


class _Staged:
    """A contiguous stand-in for a tensor the core writes into, copied back when done."""

    __slots__ = ("target", "buffer")

    def __init__(self, target: torch.Tensor):
        self.target = target
        self.buffer = target if target.is_contiguous() else target.contiguous()

    def copy_back(self):
        if self.buffer is not self.target:
            self.target.copy_(self.buffer)


def _copy_backs(staged: List[_Staged]):
    pending = [s for s in staged if s.buffer is not s.target]
    if not pending:
        return None

    def finish():
        for s in pending:
            s.copy_back()
    return finish


def _flat(tensors: List[torch.Tensor]) -> torch.Tensor:
    return torch.cat([t.reshape(-1) for t in tensors]) if tensors else torch.empty(0)


def _timeout_seconds(opts) -> float:
    try:
        seconds = opts.timeout.total_seconds()
    except AttributeError:  # options without a timeout, or not a timedelta
        return 0.0
    return seconds if seconds > 0 else 0.0  # 0: the communicator's default


# ---------------------------------------------------------------------------------------
# The process group
# ---------------------------------------------------------------------------------------
def _bind_hint(store) -> str:
    """The local address that reaches the job's store host, for the data sockets."""
    s = store
    while hasattr(s, "underlying_store"):
        s = s.underlying_store
    host = getattr(s, "host", None) or os.environ.get("MASTER_ADDR") or "127.0.0.1"
    return _core.source_address_for(host)


class RcollProcessGroup(dist.ProcessGroup):
    """torch.distributed ProcessGroup over an rcoll communicator."""

    def __init__(self, store, rank: int, size: int, timeout: timedelta, global_ranks: Optional[List[int]] = None):
        super().__init__(rank, size)
        self._timeout = timeout
        self._group_name = ""
        self._group_desc = ""
        self._global_ranks = global_ranks or list(range(size))
        self._connect(store, rank, size)

    def _connect(self, store, rank: int, size: int):
        self._rank = rank
        self._size = size
        seconds = self._timeout.total_seconds() if isinstance(self._timeout, timedelta) else float(self._timeout or 0)
        # torch hands each group its own (prefixed) store, so one name suffices.
        self._store = store  # shrink() agrees on the survivors through it
        self._comm = _core.Communicator(_core.PythonStore(store), rank, size, "torch", seconds, _bind_hint(store))
        self._registrations = (RegistrationTracker(self._comm.invalidate_memory)
                               if self._comm.caches_registrations else None)
        if len(self._global_ranks) != size:  # a group made again on other ranks (configure)
            self._global_ranks = list(range(size))
        self._name_trace_group()
        job = (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (rank, size)
        watch(self._comm, store, *job)

    def _name_trace_group(self) -> None:
        """The flight recorder's name for this group: torch's group name and
        description once torch sets them, as torch's own recorder has them."""
        self._comm.set_trace_group(self._group_name or self._comm.rendezvous_prefix,
                                   self._group_desc or ("default_pg" if not dist.is_initialized() else "undefined"),
                                   self._global_ranks)

    # -- identity -----------------------------------------------------------------
    def _where(self, *tensors):
        """Where the op runs: (-1, 0) for CPU tensors, else (the CUDA device of
        every tensor of the op, that device's current stream)."""
        return placement(self._rank, *tensors)

    def _collective(self, kind, where, send, recv, count, code, op=0, root=0, timeout=0.0, opts=None):
        """Enqueues one collective on the core; blocking (run on this thread
        when nothing is queued ahead) for a host op whose caller waits at once:
        torch sets opts.asyncOp=False for a synchronous call (and calls
        work.wait() right after). Async calls (DDP's buckets) and device ops
        stay queued."""
        device, stream = where
        blocking = device < 0 and opts is not None and not getattr(opts, "asyncOp", True)
        return self._comm.collective(kind, send, recv, count, code, op, root, timeout, blocking, device, stream)

    def _addr(self, t: torch.Tensor) -> int:
        """The tensor's address for the core; with RDMA, host tensors' storage is
        watched so that cached registrations go when it is freed."""
        if self._registrations is not None and t.device.type == "cpu":
            self._registrations.track(t)
        return t.data_ptr()

    @staticmethod
    def _work_for(work, result, finish=None, keepalive=None) -> RcollWork:
        """The Work of one host op: a finished one when the op already ended
        well (a blocking op that ran inline; its copy-back, if any, done here),
        else one that tracks it."""
        if work.device < 0 and work.succeeded():
            if finish is not None:
                finish()
            return _FinishedWork(result)
        return RcollWork((work,), result, finish, keepalive)

    def getBackendName(self) -> str:
        return BACKEND_NAME

    # -- the group as its own backend -------------------------------------------
    # torch puts a Python process group in place of the group it would have
    # made, so no backend is registered on it; its front end still asks the
    # group for "the backend of device d" (batch_isend_irecv, new_group's
    # split check, FSDP2's buffer allocation, ...) and reads what a C++
    # Backend answers. This group serves every device itself and answers
    # for it: none of the optional Backend features.
    supports_splitting = False
    supports_coalescing = False
    supports_shrinking = False
    supports_time_estimate = False

    def _get_backend(self, device) -> "RcollProcessGroup":
        return self

    def supports_tensor_alloc(self, device) -> bool:
        return False

    def getRank(self) -> int:
        return self._rank

    def getSize(self) -> int:
        return self._size

    def setGroupName(self, name: str) -> None:
        self._group_name = name
        self._name_trace_group()

    def getGroupName(self) -> str:
        return self._group_name

    def setGroupDesc(self, desc: str) -> None:
        self._group_desc = desc
        self._name_trace_group()

    def getGroupDesc(self) -> str:
        return self._group_desc

    # torch's front end names the group through these; on releases where the
    # C++ ProcessGroup keeps the name in its registered backends (2.4), the
    # inherited ones fail with "ProcessGroup name not set".
    def _set_group_name(self, name: str) -> None:
        self.setGroupName(name)

    def _set_group_desc(self, desc: str) -> None:
        self.setGroupDesc(desc)

    @property
    def group_name(self) -> str:
        return self._group_name

    @property
    def group_desc(self) -> str:
        return self._group_desc

    def __repr__(self):
        return f"RcollProcessGroup(rank={self._rank}, size={self._size}, transport={self._comm.transport!r})"

    # -- helpers ------------------------------------------------------------------
    def _op(self, opts, opname):
        try:  # the common case first: every attribute of torch's pybind options costs ~0.3 us
            reduce_op = opts.reduceOp
        except AttributeError:
            reduce_op = dist.ReduceOp.SUM
        kind = getattr(reduce_op, "op", reduce_op)  # ReduceOp wraps a RedOpType
        code = _OP_CODES_BY_VALUE.get(int(getattr(kind, "value", -1)))
        if code is None:
            raise _core.InvalidArgumentError(
                f"rank {self._rank}: {opname}: reduce op {reduce_op} is not supported by rcoll "
                f"(supported: SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR)")
        return code

    # -- collectives --------------------------------------------------------------
    def allreduce(self, tensors, opts=None):
        if opts is not None and len(tensors) == 1:
            # The common call (dist.all_reduce of one contiguous CPU tensor) in
            # as few of torch's attribute reads as it takes: each costs 0.1 to
            # 0.4 us, as much as the op itself between local ranks. Anything
            # unusual takes the full path below, which words the errors.
            t = tensors[0]
            code = _DTYPE_CODES.get(t.dtype)
            if code is not None and t.layout is _STRIDED and t.is_cpu and t.is_contiguous():
                op = SUM if opts.reduceOp == _TORCH_SUM else self._op(opts, "allreduce")
                addr = self._addr(t)
                # Positional arguments: pybind11 keyword matching costs ~0.5 us.
                work = self._comm.collective(ALLREDUCE, addr, addr, t.numel(), code, op, 0, _timeout_seconds(opts),
                                             not getattr(opts, "asyncOp", True))
                return _FinishedWork(tensors) if work.succeeded() else RcollWork((work,), tensors)
        opts = opts if opts is not None else dist.AllreduceOptions()
        timeout = _timeout_seconds(opts)
        if tensors and tensors[0].layout is torch.sparse_coo:
            return self._sparse_allreduce(tensors, opts, timeout)
        staged, works = [], []
        for t in tensors:
            code = _check_tensor(t, self._rank, "allreduce")
            op = self._op(opts, "allreduce")
            s = _Staged(t)
            staged.append(s)
            addr = self._addr(s.buffer)
            works.append(self._collective(ALLREDUCE, self._where(s.buffer), addr, addr, s.buffer.numel(), code, op,
                                          timeout=timeout, opts=opts))
        return RcollWork(works, list(tensors), _copy_backs(staged), staged)

    def _sparse_allreduce(self, tensors, opts, timeout):
        """Sparse COO tensors (DDP with nn.Embedding(sparse=True)), as Gloo does
        it: every rank's indices and values are gathered, and torch's coalesce()
        sums the entries that share an index. Blocking; the result replaces the
        input (copy_) and is the Work's result."""
        op = self._op(opts, "allreduce")
        average = op == AVG
        if op != SUM and not average:
            name = reduce_op_name(op)
            raise _core.InvalidArgumentError(
                f"rank {self._rank}: allreduce: sparse tensors reduce with SUM or AVG only, not {name}")
        outputs = []
        for t in tensors:
            if t.layout is not torch.sparse_coo:
                raise _core.InvalidArgumentError(f"rank {self._rank}: allreduce: sparse and dense tensors mixed")
            host = t.detach().to("cpu")
            indices, values = host._indices(), host._values().contiguous()
            nnz = indices.shape[1]
            # What every rank must agree on, and each rank's entry count.
            meta = torch.tensor([host.sparse_dim(), host.dense_dim(), len(host.shape), *host.shape, nnz],
                                dtype=torch.int64)
            metas = self._gather_rows(meta, timeout).view(self._size, -1)
            if not torch.equal(metas[:, :-1], meta[:-1].expand(self._size, -1)):
                bad = next(r for r in range(self._size) if not torch.equal(metas[r, :-1], meta[:-1]))
                raise _core.MismatchError(
                    f"rank {self._rank}: allreduce of a sparse tensor of shape {tuple(host.shape)} (sparse dims "
                    f"{host.sparse_dim()}) while rank {bad} passed a different shape or layout")
            counts = metas[:, -1].tolist()
            most = max(counts)
            # Indices entry-major (nnz x sparse_dim) and values, padded to the largest count.
            padded_idx = torch.zeros(most, host.sparse_dim(), dtype=torch.int64)
            padded_idx[:nnz] = indices.t()
            padded_val = torch.zeros((most, *values.shape[1:]), dtype=values.dtype)
            padded_val[:nnz] = values
            all_idx = self._gather_rows(padded_idx, timeout)
            all_val = self._gather_rows(padded_val, timeout)
            idx = torch.cat([all_idx[r * most:r * most + counts[r]] for r in range(self._size)]).t()
            val = torch.cat([all_val[r * most:r * most + counts[r]] for r in range(self._size)])
            # Indices from other processes: checked (a bad one would otherwise be a
            # memory error later). Opting in for the block, not only by argument,
            # also keeps torch 2.11's "Sparse invariant checks are implicitly
            # disabled" warning off stderr.
            with torch.sparse.check_sparse_tensor_invariants(enable=True):
                out = torch.sparse_coo_tensor(idx, val, host.shape, check_invariants=True).coalesce()
            if average:
                out = out / self._size
            out = out.to(t.device)
            t.copy_(out)
            outputs.append(out)
        return _done_work(outputs)

    def _gather_rows(self, t, timeout):
        """Blocking allgather of a CPU tensor (at least 1-D) along dim 0, in rank order."""
        src = t.contiguous()
        out = torch.empty((self._size * src.shape[0], *src.shape[1:]), dtype=src.dtype)
        code = _check_tensor(src, self._rank, "allreduce")
        self._comm.collective(ALLGATHER, self._addr(src), self._addr(out), src.numel(), code, 0, 0, timeout,
                              True).wait()
        return out

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        if len(tensors) <= 1 or len({t.dtype for t in tensors}) != 1:
            return self.allreduce(tensors, opts)
        code = _check_tensor(tensors[0], self._rank, "allreduce_coalesced")
        for t in tensors[1:]:
            _check_tensor(t, self._rank, "allreduce_coalesced")
        op = self._op(opts, "allreduce_coalesced")
        # One fused op over a flat copy: far fewer messages for many small tensors.
        flat = _flat(tensors)
        work = self._collective(ALLREDUCE, self._where(flat), self._addr(flat), self._addr(flat), flat.numel(), code,
                                op, timeout=_timeout_seconds(opts))

        def finish():
            offset = 0
            for t in tensors:
                n = t.numel()
                t.copy_(flat[offset:offset + n].view_as(t))
                offset += n
        return RcollWork([work], list(tensors), finish, flat)

    @_complex_as_real
    def broadcast(self, tensors, opts=None):
        opts = opts if opts is not None else dist.BroadcastOptions()
        root = opts.rootRank  # checked by the core
        timeout = _timeout_seconds(opts)
        if len(tensors) == 1 and not tensors[0].is_cuda and tensors[0].is_contiguous():  # the common call
            t = tensors[0]
            code = _check_tensor(t, self._rank, "broadcast", moves_only=True)
            addr = self._addr(t)
            blocking = not getattr(opts, "asyncOp", True)
            return self._work_for(self._comm.collective(BROADCAST, addr, addr, t.numel(), code, 0, root, timeout,
                                                        blocking), tensors)
        staged, works = [], []
        for t in tensors:
            code = _check_tensor(t, self._rank, "broadcast", moves_only=True)
            s = _Staged(t)
            staged.append(s)
            addr = self._addr(s.buffer)
            works.append(self._collective(BROADCAST, self._where(s.buffer), addr, addr, s.buffer.numel(), code,
                                          root=root, timeout=timeout, opts=opts))
        return RcollWork(works, list(tensors), _copy_backs(staged), staged)

    @_complex_as_real
    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else AllgatherOptions()
        timeout = _timeout_seconds(opts)
        works, finishes, keep = [], [], []
        for outs, inp in self._pairs(output_tensors, input_tensors, "allgather"):
            code = _check_tensor(inp, self._rank, "allgather", moves_only=True)
            self._check_outputs(outs, inp, "allgather")
            src = inp.contiguous()
            flat = torch.empty(self._size * src.numel(), dtype=src.dtype, device=src.device)
            works.append(self._collective(ALLGATHER, self._where(src, flat), self._addr(src), self._addr(flat),
                                          src.numel(), code, timeout=timeout, opts=opts))
            keep.append((src, flat))
            finishes.append(self._scatter_into(flat, outs))
        return RcollWork(works, output_tensors, lambda: [f() for f in finishes], keep)

    @_complex_as_real
    def allgather_coalesced(self, output_lists, input_list, opts=None):
        # output_lists is indexed [rank][input] (the transpose of allgather's).
        opts = opts if opts is not None else AllgatherOptions()
        if not input_list:
            return _done_work(output_lists)
        code = _check_tensor(input_list[0], self._rank, "allgather_coalesced", moves_only=True)
        for t in input_list:
            if _check_tensor(t, self._rank, "allgather_coalesced", moves_only=True) != code:
                raise _core.InvalidArgumentError(f"rank {self._rank}: allgather_coalesced: inputs differ in dtype")
        flat_in = _flat(input_list)
        flat_out = torch.empty(self._size * flat_in.numel(), dtype=flat_in.dtype, device=flat_in.device)
        work = self._collective(ALLGATHER, self._where(flat_in, flat_out), self._addr(flat_in), self._addr(flat_out),
                                flat_in.numel(), code, timeout=_timeout_seconds(opts))

        def finish():
            offset = 0
            for r in range(self._size):
                for j, t in enumerate(input_list):
                    n = t.numel()
                    output_lists[r][j].copy_(flat_out[offset:offset + n].view_as(output_lists[r][j]))
                    offset += n
        return RcollWork([work], output_lists, finish, (flat_in, flat_out))

    @_complex_as_real
    def all_gather_single(self, output, input, opts=None):
        opts = opts if opts is not None else AllgatherOptions()
        code = _check_tensor(input, self._rank, "all_gather_into_tensor", moves_only=True)
        _check_tensor(output, self._rank, "all_gather_into_tensor", moves_only=True)
        if output.numel() != self._size * input.numel() or output.dtype != input.dtype:
            raise _core.InvalidArgumentError(
                f"rank {self._rank}: all_gather_into_tensor: output has {output.numel()} {output.dtype} elements, "
                f"expected {self._size * input.numel()} {input.dtype}")
        src = input.contiguous()
        dst = _Staged(output)
        work = self._collective(ALLGATHER, self._where(src, dst.buffer), self._addr(src), self._addr(dst.buffer),
                                src.numel(), code, timeout=_timeout_seconds(opts), opts=opts)
        return self._work_for(work, [output], _copy_backs([dst]), (src, dst))

    _allgather_base = all_gather_single

    @_complex_as_real
    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        pairs = self._pairs(outputs, inputs, "all_gather_into_tensor_coalesced")
        works = [self.all_gather_single(o, i, opts) for o, i in pairs]
        return _combined(works, outputs)

    all_gather_single_coalesced = allgather_into_tensor_coalesced

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        timeout = _timeout_seconds(opts)
        works, staged, keep = [], [], []
        for out, ins in self._pairs(output_tensors, input_tensors, "reduce_scatter"):
            code = _check_tensor(out, self._rank, "reduce_scatter")
            op = self._op(opts, "reduce_scatter")
            if len(ins) != self._size or any(t.numel() != out.numel() or t.dtype != out.dtype for t in ins):
                raise _core.InvalidArgumentError(
                    f"rank {self._rank}: reduce_scatter: needs {self._size} inputs shaped like the output")
            flat = _flat(ins)
            s = _Staged(out)
            staged.append(s)
            keep.append(flat)
            works.append(self._collective(REDUCE_SCATTER, self._where(flat, s.buffer), self._addr(flat),
                                          self._addr(s.buffer), out.numel(), code, op, timeout=timeout, opts=opts))
        return RcollWork(works, output_tensors, _copy_backs(staged), (staged, keep))

    def reduce_scatter_single(self, output, input, opts=None):
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        code = _check_tensor(input, self._rank, "reduce_scatter_tensor")
        _check_tensor(output, self._rank, "reduce_scatter_tensor")
        op = self._op(opts, "reduce_scatter_tensor")
        if input.numel() != self._size * output.numel() or output.dtype != input.dtype:
            raise _core.InvalidArgumentError(
                f"rank {self._rank}: reduce_scatter_tensor: input has {input.numel()} {input.dtype} elements, "
                f"expected {self._size * output.numel()} {output.dtype}")
        src = input.contiguous()
        dst = _Staged(output)
        work = self._collective(REDUCE_SCATTER, self._where(src, dst.buffer), self._addr(src), self._addr(dst.buffer),
                                output.numel(), code, op, timeout=_timeout_seconds(opts), opts=opts)
        return self._work_for(work, [output], _copy_backs([dst]), (src, dst))

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        pairs = self._pairs(outputs, inputs, "reduce_scatter_tensor_coalesced")
        works = [self.reduce_scatter_single(o, i, opts) for o, i in pairs]
        return _combined(works, outputs)

    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced

    def barrier(self, opts=None):
        opts = opts if opts is not None else dist.BarrierOptions()
        return self._work_for(self._collective(BARRIER, HOST, 0, 0, 0, 0, timeout=_timeout_seconds(opts), opts=opts),
                              [])

    def monitored_barrier(self, opts=None, wait_all_ranks=False):
        """A barrier bounded by opts.timeout (or a timedelta) that names who did
        not come: on expiry rank 0 raises rcoll.TimeoutError naming the lowest
        rank that did not reach it or, with wait_all_ranks=True, every such
        rank; the other ranks then fail with rank 0's report (Gloo's
        semantics). The group is unusable after a failure."""
        if isinstance(opts, timedelta):
            timeout = opts.total_seconds()
        else:
            timeout = _timeout_seconds(opts) if opts is not None else 0.0
        self._comm.monitored_barrier(timeout, bool(wait_all_ranks))

    # -- rooted ops ---------------------------------------------------------------
    def reduce(self, tensors, opts=None):
        opts = opts if opts is not None else dist.ReduceOptions()
        root = opts.rootRank  # checked by the core
        timeout = _timeout_seconds(opts)
        staged, works = [], []
        for t in tensors:
            code = _check_tensor(t, self._rank, "reduce")
            op = self._op(opts, "reduce")
            s = _Staged(t)
            staged.append(s)
            # Only the root's tensor receives the result; the others stay as they were.
            recv = self._addr(s.buffer) if self._rank == root else 0
            works.append(self._collective(REDUCE, self._where(s.buffer), self._addr(s.buffer), recv, s.buffer.numel(),
                                          code, op, root, timeout))
        return RcollWork(works, list(tensors), _copy_backs(staged), staged)

    @_complex_as_real
    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.GatherOptions()
        root = opts.rootRank  # checked by the core
        inp = self._single(input_tensors, "gather", "input_tensors")
        code = _check_tensor(inp, self._rank, "gather", moves_only=True)
        src = inp.contiguous()
        flat = None
        finish = None
        if self._rank == root:
            outs = self._single(output_tensors, "gather", "output_tensors")
            self._check_outputs(outs, inp, "gather")
            flat = torch.empty(self._size * src.numel(), dtype=src.dtype, device=src.device)
            finish = self._scatter_into(flat, outs)
        work = self._collective(GATHER, self._where(src, flat), self._addr(src),
                                self._addr(flat) if flat is not None else 0, src.numel(), code, root=root,
                                timeout=_timeout_seconds(opts))
        return RcollWork([work], output_tensors, finish, (src, flat))

    @_complex_as_real
    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.ScatterOptions()
        root = opts.rootRank  # checked by the core
        out = self._single(output_tensors, "scatter", "output_tensors")
        code = _check_tensor(out, self._rank, "scatter", moves_only=True)
        flat = None
        if self._rank == root:
            ins = self._single(input_tensors, "scatter", "input_tensors")
            self._check_outputs(ins, out, "scatter")
            flat = _flat(ins)
        dst = _Staged(out)
        work = self._collective(SCATTER, self._where(flat, dst.buffer), self._addr(flat) if flat is not None else 0,
                                self._addr(dst.buffer), out.numel(), code, root=root, timeout=_timeout_seconds(opts))
        return RcollWork([work], output_tensors, _copy_backs([dst]), (flat, dst))

    # -- all-to-all ---------------------------------------------------------------
    @_complex_as_real
    def alltoall(self, output_tensors, input_tensors, opts=None):
        opts = opts if opts is not None else dist.AllToAllOptions()
        if len(output_tensors) != self._size or len(input_tensors) != self._size:
            raise _core.InvalidArgumentError(
                f"rank {self._rank}: all_to_all: needs {self._size} input and output tensors")
        code = _check_tensor(input_tensors[0], self._rank, "all_to_all", moves_only=True)
        for t in list(input_tensors) + list(output_tensors):
            if _check_tensor(t, self._rank, "all_to_all", moves_only=True) != code:
                raise _core.InvalidArgumentError(f"rank {self._rank}: all_to_all: tensors differ in dtype")
        send_counts = [t.numel() for t in input_tensors]
        recv_counts = [t.numel() for t in output_tensors]
        flat_in = _flat(input_tensors)
        flat_out = torch.empty(sum(recv_counts), dtype=flat_in.dtype, device=flat_in.device)
        work = self._alltoall(self._where(flat_in, flat_out), self._addr(flat_in), self._addr(flat_out), send_counts,
                              recv_counts, code, _timeout_seconds(opts))

        def finish():
            offset = 0
            for t, n in zip(output_tensors, recv_counts):
                t.copy_(flat_out[offset:offset + n].view_as(t))
                offset += n
        return RcollWork([work], output_tensors, finish, (flat_in, flat_out))

    @_complex_as_real
    def all_to_all_single(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        opts = opts if opts is not None else dist.AllToAllOptions()
        code = _check_tensor(input, self._rank, "all_to_all_single", moves_only=True)
        if _check_tensor(output, self._rank, "all_to_all_single", moves_only=True) != code:
            raise _core.InvalidArgumentError(f"rank {self._rank}: all_to_all_single: input and output differ in dtype")
        send_counts = self._split_counts(input, input_split_sizes, "input")
        recv_counts = self._split_counts(output, output_split_sizes, "output")
        src = input.contiguous()
        dst = _Staged(output)
        work = self._alltoall(self._where(src, dst.buffer), self._addr(src), self._addr(dst.buffer), send_counts,
                              recv_counts, code, _timeout_seconds(opts))
        return RcollWork([work], [output], _copy_backs([dst]), (src, dst))

    alltoall_base = all_to_all_single

    def _alltoall(self, where, send, recv, send_counts, recv_counts, code, timeout):
        device, stream = where
        return self._comm.alltoall(send, recv, send_counts, displacements(send_counts), recv_counts,
                                   displacements(recv_counts), code, timeout, False, device, stream)

    def _split_counts(self, t, splits, what):
        """Element counts per rank from split sizes along dim 0 (empty = equal split)."""
        rows = t.shape[0] if t.dim() > 0 else 1
        per_row = t.numel() // rows if rows else 0
        if not splits:
            if rows % self._size != 0:
                raise _core.InvalidArgumentError(
                    f"rank {self._rank}: all_to_all_single: {what} dim 0 ({rows}) is not divisible by the "
                    f"group size {self._size}")
            return [rows // self._size * per_row] * self._size
        if len(splits) != self._size or sum(splits) != rows or min(splits) < 0:
            raise _core.InvalidArgumentError(
                f"rank {self._rank}: all_to_all_single: {what} split sizes {list(splits)} do not cover dim 0 "
                f"({rows}) in {self._size} parts")
        return [int(n) * per_row for n in splits]

    # -- point to point ------------------------------------------------------------
    # Point-to-point runs on the core's p2p engine, which moves host memory: a
    # CUDA tensor is copied to the host when sent (in the order of the
    # caller's current stream) and into the tensor when the receive completes
    # (both copies synchronous), as Gloo does.
    @_complex_as_real
    def send(self, tensors, dst_rank, tag=0):
        t = self._single(tensors, "send", "tensors")
        code = _check_tensor(t, self._rank, "send", moves_only=True)
        src = t.detach().to("cpu").contiguous() if t.is_cuda else t.contiguous()
        return RcollWork([self._comm.send(self._addr(src), src.numel(), code, dst_rank, tag, 0.0)], list(tensors),
                         None, src)

    @_complex_as_real
    def recv(self, tensors, src_rank, tag=0):
        return self._recv(tensors, src_rank, tag)

    @_complex_as_real
    def recv_anysource(self, tensors, tag=0):
        # The sender is the first rank whose next unclaimed message has this tag
        # (the core's p2p engine); the Work's _source_rank() names it.
        return self._recv(tensors, None, tag)

    def _recv(self, tensors, src_rank, tag):
        t = self._single(tensors, "recv", "tensors")
        code = _check_tensor(t, self._rank, "recv", moves_only=True)
        if t.is_cuda:
            host = torch.empty(t.shape, dtype=t.dtype)
            buffer, finish, keepalive = host, (lambda: t.copy_(host)), host
        else:
            dst = _Staged(t)
            buffer, finish, keepalive = dst.buffer, _copy_backs([dst]), dst
        work = self._comm.recv(self._addr(buffer), buffer.numel(), code, src_rank, tag, 0.0)  # None: any source
        return RcollWork([work], list(tensors), finish, keepalive)

    # -- list arguments (Gloo's assertSingleElement / assertSizesMatch) ---------------
    def _single(self, tensors, opname, what):
        """The one element of `tensors`: torch passes lists (one entry per device
        once), and rcoll, like Gloo, takes exactly one."""
        if len(tensors) != 1:
            raise _core.InvalidArgumentError(
                f"rank {self._rank}: {opname}: {what} must hold exactly one entry, got {len(tensors)}")
        return tensors[0]

    def _pairs(self, outputs, inputs, opname):
        """zip(outputs, inputs), refusing lists of different lengths (zip would drop the extra ones)."""
        if len(outputs) != len(inputs):
            raise _core.InvalidArgumentError(
                f"rank {self._rank}: {opname}: {len(outputs)} outputs for {len(inputs)} inputs; pass one output "
                f"per input")
        return zip(outputs, inputs)

    # -- helpers for list outputs ----------------------------------------------------
    def _check_outputs(self, outs, like, opname):
        if len(outs) != self._size:
            raise _core.InvalidArgumentError(
                f"rank {self._rank}: {opname}: needs {self._size} output tensors, got {len(outs)}")
        for o in outs:  # (the list outputs of allgather, gather and scatter: data movement)
            _check_tensor(o, self._rank, opname, moves_only=True)
            if o.numel() != like.numel() or o.dtype != like.dtype:
                raise _core.InvalidArgumentError(
                    f"rank {self._rank}: {opname}: output {tuple(o.shape)} {o.dtype} does not match the input "
                    f"{tuple(like.shape)} {like.dtype}")

    def _scatter_into(self, flat, outs):
        n = flat.numel() // max(1, len(outs))

        def finish():
            for r, o in enumerate(outs):
                o.copy_(flat[r * n:(r + 1) * n].view_as(o))
        return finish

    # -- life cycle ---------------------------------------------------------------
    # What fault-tolerant trainers (torchft's ProcessGroup) call on a group.
    def abort(self):
        self._comm.abort("torch called ProcessGroup.abort()")

    def shutdown(self):
        self._comm.shutdown()

    def errored(self) -> Optional[Exception]:
        """The error that ended this group (an rcoll.RcollError: PeerError for a
        dead or unreachable peer), or None while it is healthy."""
        return self._comm.error()

    def configure(self, store_addr: str, rank: int, world_size: int) -> None:
        """Re-forms this group in place, as torchft reconfigures a process group
        for each new quorum: ends the current communicator (its pending ops fail,
        the peers are told) and joins `world_size` ranks as `rank` at
        `store_addr`, "host:port/prefix" (a TCPStore; a prefix new for every
        call). For a group used on its own, as torchft uses its groups:
        getRank() and getSize() give the new values; rank() and size(), which
        torch recorded at creation, do not change."""
        host, _, rest = store_addr.partition(":")
        port, _, prefix = rest.partition("/")
        timeout = self._timeout if isinstance(self._timeout, timedelta) else timedelta(seconds=60)
        store = dist.PrefixStore(prefix, dist.TCPStore(host, int(port), is_master=False, wait_for_workers=False,
                                                       timeout=timeout))
        self._comm.abort("torch called configure(): the group is re-formed")
        self._comm.shutdown()
        self._connect(store, rank, world_size)


# ---------------------------------------------------------------------------------------
# Registration
# ---------------------------------------------------------------------------------------
def device_path(group=None) -> str:
    """How the last op on CUDA tensors of `group` (default: the default group)
    moved its data: "cuda-ipc" (device to device, every rank on one host),
    "gdr" (GPUDirect RDMA over verbs), "staging" (pinned host memory over the
    network) or "none" yet."""
    return _rcoll_group(group, "device_path", "cuda")._comm.device_path


def _rcoll_group(group, what, device="cpu"):
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    if not isinstance(pg, RcollProcessGroup):
        pg = pg._get_backend(torch.device(device))
    if not isinstance(pg, RcollProcessGroup):
        raise ValueError(f"{what}: {group!r} is not an rcoll process group")
    return pg


def shrink(*, exclude=None, timeout: Optional[float] = None) -> Tuple[int, int]:
    """After a rank of the default group failed (an op raised rcoll.PeerError),
    call this on every survivor: they agree on who is left (as
    rcoll.Communicator.shrink(), through the group's store, which torchrun's
    agent hosts), the default group is destroyed and a new one of the survivors
    made on a fresh store prefix, with the same timeout. Returns (new rank, new
    world size); ranks keep their order. Rebuild what holds the old group (DDP,
    optimizer state sharded across it) afterwards. `exclude`: the ranks to leave
    out, the same on every survivor, with no agreement (they must not call it).
    `timeout` (default 60 s): how long to wait for a rank no one saw die."""
    pg = _rcoll_group(None, "shrink")
    members = survivors(pg._comm, _core.PythonStore(pg._store), pg._comm.rendezvous_prefix + "shrink", exclude,
                        float(timeout or 60.0), "init_process_group(store=...)")
    rank, timeout_td, store = members.index(pg._rank), pg._timeout, pg._store
    # Under the old group's own rendezvous keys: new for every group, also on a
    # store that earlier attempts of a restarted job used.
    fresh = dist.PrefixStore(pg._comm.rendezvous_prefix + "survivors", store)
    dist.destroy_process_group()
    dist.init_process_group(BACKEND_NAME, store=fresh, rank=rank, world_size=len(members), timeout=timeout_td)
    return rank, len(members)


def _create_process_group(options, backend_options=None):
    """torch's creator, extended form (register_backend(extended_api=True)):
    it also tells the members' global ranks, which the flight recorder's
    dumps name (empty for the default group)."""
    return RcollProcessGroup(options.store, options.group_rank, options.group_size, options.timeout,
                             list(options.global_ranks_in_group or ()))


def register() -> None:
    """Registers backend "rcoll" with torch.distributed (idempotent)."""
    if getattr(dist.Backend, BACKEND_NAME.upper(), None) == BACKEND_NAME:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create_process_group, extended_api=True, devices=["cpu", "cuda"])


register()
