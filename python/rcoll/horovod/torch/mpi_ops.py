"""Horovod's collectives on torch tensors, over rcoll's core.

Every op is issued on the rcoll communicator of its process set
(common/basics.py) by the tensors' addresses, as the torch backend does, so
no byte goes through torch.distributed. An `*_async` call returns an integer
handle; `synchronize(handle)` waits and returns the result, `poll(handle)`
says whether it is done. Every op goes through its process set's controller
(common/controller.py), which matches ops by name across ranks, as Horovod
does, and hands each agreed op back to run here; a failed op raises
HorovodInternalError naming the rank and the op.

What is Horovod's and not rcoll's lives here as calls on the core:
Average as rcoll's avg (or a sum and a scale where Horovod scales), prescale
and postscale factors, allgather of first dimensions that differ per rank
(the core's alltoallv, every block read from the same input), alltoall with
splits, reducescatter of a first dimension that does not divide (the first
ranks get one row more, as in Horovod), and the autograd functions.
"""
from __future__ import annotations

import collections
import itertools
import math
import threading
import warnings

import torch

from ... import _core
from ..._buffers import displacements
from ..._ops import ADASUM, ALLREDUCE, BARRIER, BROADCAST, REDUCE_OPS, REDUCE_SCATTER
from ..._torch_tensors import DTYPE_CODES, HOST, check_tensor, placement
from ..common import basics as _basics
from ..common.basics import Adasum, Average, Max, Min, Product, Sum
from ..common.controller import Request
from ..common.exceptions import HorovodInternalError
from ..common.process_sets import ProcessSet, global_process_set
from .compression import Compression

# Horovod's op -> the core's reduce op (Average is decided per dtype, Adasum has its own path).
_CORE_OPS = {Sum: REDUCE_OPS["sum"], Min: REDUCE_OPS["min"], Max: REDUCE_OPS["max"],
             Product: REDUCE_OPS["prod"], Average: REDUCE_OPS["avg"]}


def handle_average_backwards_compatibility(op, average):
    """The op from Horovod's deprecated `average` argument: mixing both is a ValueError."""
    if op is not None:
        if average is not None:
            raise ValueError("The op parameter supersedes average. Please provide only one of them.")
        return op
    if average is not None:
        warnings.warn("Parameter `average` has been replaced with `op` and will be removed in v1.0",
                      DeprecationWarning, stacklevel=3)
        return Average if average else Sum
    return Average


# ---------------------------------------------------------------------------------------
# Handles
# ---------------------------------------------------------------------------------------
class _InFlight:
    """One Horovod op: submitted to its process set's controller, then issued
    on the core once every rank agreed (its works and finishing step), or failed."""

    __slots__ = ("label", "answered", "works", "finish", "error", "keep", "release", "controller", "ended")

    def __init__(self, label, controller, keep=None):
        self.label = label  # "rank 1: allreduce" for errors
        self.controller = controller  # its process set's: synchronize() drives its rounds
        self.keep = keep  # holds the op's tensors (its issuing closure) until synchronize()
        self.answered = False  # issued on the core, or failed (set in a round of the controller)
        self.works = ()
        self.release = None  # frees the op's name (set by _submit)
        self.finish = None  # () -> the op's result
        self.error = None
        self.ended = None  # () -> None: the timeline's end of the op, when one is written

    def started(self, works, finish):
        self.works, self.finish = tuple(works), finish
        self.answered = True

    def failed(self, message):
        self.error = message
        self.answered = True

    def is_answered(self) -> bool:
        return self.answered

    def done(self) -> bool:
        return self.answered and (self.error is not None or all(w.is_completed() for w in self.works))


# handle -> _InFlight. Horovod's name for it; a handle stays here until synchronize().
_handle_map = {}
_next_handle = itertools.count(1)
_names_lock = threading.Lock()
_active_names = {}  # (process set id, name) -> the _InFlight that holds the name
_unnamed = collections.defaultdict(itertools.count)  # (process set id, kind) -> counter of unnamed ops


def _take_name(key, entry) -> bool:
    """Gives the op name `key` to `entry` (an _InFlight or _NameTaken) unless an
    op in flight holds it; False, nothing taken, when one does."""
    with _names_lock:
        holder = _active_names.get(key)
        if holder is not None and not holder.done():
            return False
        _active_names[key] = entry
        return True


def _release_name(key, entry) -> None:
    """Frees `key` if `entry` still holds it (an op of the same name may have taken it since)."""
    with _names_lock:
        if _active_names.get(key) is entry:
            del _active_names[key]


def _wait(works, label):
    try:
        for w in works:
            w.wait(None)
    except _core.RcollError as e:
        raise HorovodInternalError(f"{e}") from e
    for w in works:
        if w.device >= 0:  # the caller's current stream runs after the op, as with NCCL
            w.stream_wait(torch.cuda.current_stream(w.device).cuda_stream)


def poll(handle) -> bool:
    """Whether the op of `handle` is done (synchronize() then returns at once)."""
    entry = _handle_map.get(handle)
    if entry is None:
        raise ValueError(f"poll: unknown handle {handle!r} (never issued, or already synchronized)")
    return entry.done()


def synchronize(handle):
    """Waits for the op of `handle` and returns its result; raises
    HorovodInternalError if it failed. An unknown handle returns None, as in Horovod."""
    entry = _handle_map.get(handle)
    if entry is None:
        return None
    try:
        entry.controller.wait(entry.is_answered)
        if entry.error is not None:
            raise HorovodInternalError(entry.error)
        _wait(entry.works, entry.label)
        result = entry.finish()
        if entry.ended is not None:
            entry.ended()
        return result
    finally:
        _handle_map.pop(handle, None)
        entry.release()


# ---------------------------------------------------------------------------------------
# Submitting ops: every op goes through its process set's controller
# ---------------------------------------------------------------------------------------
def _comm(process_set: ProcessSet, opname: str):
    """(rcoll.Communicator of the set on this rank, its controller, "rank r: opname")."""
    job = _basics.job()
    if not isinstance(process_set, ProcessSet) or process_set.process_set_id is None:
        raise ValueError(f"rank {job.rank}: {opname}: {process_set} is not an initialized process set (pass one "
                         "from hvd.init(process_sets=...) or hvd.add_process_set())")
    comm, controller = job.communicator(process_set.process_set_id, opname)
    return comm, controller, f"rank {job.rank}: {opname}"


def _meta(kind, tensors, **fields):
    """What every rank sees of an op: its kind, each tensor's dtype, shape and device, and `fields`."""
    return {"kind": kind, "tensors": [(str(t.dtype), tuple(t.shape), t.device.type) for t in tensors], **fields}


def _submit(process_set, controller, label, kind, name, meta, issue, single=False, prefix=None, cache_key=None) -> int:
    """Hands an op to the controller; `issue(metas)` runs once every rank
    agreed (on the thread that drives the round) and returns (works, finish);
    with `single`, finish() returns a list whose one entry is the result.
    The op's name is Horovod's: `prefix` (the call's name, default `kind`)
    and the caller's name, or a number per prefix; `cache_key` is the response
    cache's stand-in for `meta` (controller.Request). Returns the handle."""
    psid = process_set.process_set_id
    prefix = prefix or kind
    name = f"{prefix}.{name}" if name is not None else f"{prefix}.noname.{next(_unnamed[(psid, prefix)])}"
    key = (psid, name)
    entry = _InFlight(label, controller, issue)
    if not _take_name(key, entry):  # taken until the op is done (checked there) or synchronized
        raise ValueError(f"{label}: an op named {name!r} is already in flight on this rank (names of ops in "
                         "flight must differ)")

    def run(metas, joined):
        try:
            works, finish = issue(metas)
        except Exception as e:  # noqa: BLE001 - the caller's synchronize() raises it
            entry.failed(f"{e}")
            return
        entry.started(works, (lambda: finish()[0]) if single else finish)
        timeline = controller.timeline
        if timeline is not None:
            entry.ended = lambda: timeline.end(name, meta)

    def fail(message):
        entry.failed(message)

    try:
        controller.submit(Request(name, meta, run, fail, cache_key))
    except BaseException:
        _release_name(key, entry)
        raise
    handle = next(_next_handle)
    entry.release = lambda: _release_name(key, entry)
    _handle_map[handle] = entry
    return handle


def _checked(tensor, label, opname, moves_only=False):
    """The core dtype code of `tensor`, which Horovod requires to be contiguous."""
    code = check_tensor(tensor, _basics.job().rank, opname, moves_only)  # InvalidArgumentError is a ValueError
    if not tensor.is_contiguous():
        raise ValueError(f"{label}: Tensor is required to be contiguous.")
    return code


def _addr(comm, t):
    if comm._registrations is not None and t.is_cpu:
        comm._registrations.track(t)
    return t.data_ptr()


class _Issuing(threading.local):
    """Whether the ops being issued run on this thread: the caller of
    synchronize() drives the round that answers them and waits for them
    anyway (host ops only), so they skip the hand-over to the core's progress thread."""

    inline = False


_issuing = _Issuing()


def _collective(comm, where, kind, send, recv, count, code, op=0, root=0):
    device, stream = where
    return comm._comm.collective(kind, _addr(comm, send), _addr(comm, recv), count, code, op, root, 0.0,
                                 _issuing.inline and device < 0, device, stream)


def _alltoallv(comm, where, send, recv, send_counts, send_displs, recv_counts, code):
    device, stream = where
    return comm._comm.alltoall(_addr(comm, send), _addr(comm, recv), send_counts, send_displs, recv_counts,
                               displacements(recv_counts), code, 0.0, _issuing.inline and device < 0, device,
                               stream)


def _scaled(tensor, factor):
    """tensor * factor in tensor's dtype (integers truncated toward zero, as Horovod's scaling)."""
    if tensor.is_floating_point():
        return tensor * factor
    return (tensor.double() * factor).to(tensor.dtype)


def _scale_(tensor, factor):
    if tensor.is_floating_point():
        tensor.mul_(factor)
    else:
        tensor.copy_((tensor.double() * factor).to(tensor.dtype))


class _Plan:
    """How the core runs Horovod's reduce op on one dtype: the core's op, the
    factor before, the factor after, and the divisor of an integer Average
    (a sum divided after, truncating as Horovod)."""

    __slots__ = ("op", "pre", "post", "divisor")

    def __init__(self, op, tensor, set_size, prescale, postscale, label):
        if op == Adasum:  # the core's adasum collective (_adasum_issue): only the factors apply
            self.op, self.pre, self.post, self.divisor = 0, prescale, postscale, 1
            return
        code = _CORE_OPS.get(op)
        if code is None:
            raise ValueError(f"{label}: unknown reduce op {op!r} (use hvd.Average, Sum, Min, Max or Product)")
        self.op, self.pre, self.post, self.divisor = code, prescale, postscale, 1
        if op == Average and not tensor.is_floating_point():
            self.op, self.divisor = _CORE_OPS[Sum], set_size
        elif op == Average and (prescale != 1.0 or postscale != 1.0):
            self.op, self.post = _CORE_OPS[Sum], postscale / set_size

    def before(self, tensor):
        return tensor if self.pre == 1.0 else _scaled(tensor, self.pre)

    def after(self, tensor):
        if self.divisor != 1:
            torch.div(tensor, self.divisor, rounding_mode="trunc", out=tensor)
        if self.post != 1.0:
            _scale_(tensor, self.post)


def _split_counts(total, parts):
    """Horovod's uneven split of `total` rows over `parts` ranks: the first
    total % parts ranks get one row more."""
    base, extra = divmod(total, parts)
    return [base + (1 if r < extra else 0) for r in range(parts)]


# ---------------------------------------------------------------------------------------
# allreduce (grouped or not): one core op per dtype over a flat copy when grouped
# ---------------------------------------------------------------------------------------
def _check_adasum(comm, process_set, tensors, label):
    """Horovod's conditions for Adasum: the global set, a power-of-two size, float tensors."""
    if process_set != global_process_set:
        raise NotImplementedError(f"{label}: Adasum does not support non-global process sets yet.")
    if comm.size & (comm.size - 1):
        raise NotImplementedError(f"{label}: Running Adasum with non-power of 2 ranks is not supported yet "
                                  f"({comm.size} ranks).")
    for t in tensors:
        if not t.is_floating_point():
            raise ValueError(f"{label}: Adasum combines floating-point tensors, not {t.dtype}")


def _adasum_issue(comm, tensors, outputs, prescale, postscale):
    """Adasum of each tensor on its own (Horovod's coefficients are per
    tensor, fused or not), CUDA tensors through host memory (the core's
    Adasum runs on the CPU); returns (works, finish)."""
    works, staged = [], []
    plan = _Plan(Adasum, None, comm.size, prescale, postscale, "")
    for tensor, output in zip(tensors, outputs):
        send = plan.before(tensor)
        host_in = send.cpu() if send.is_cuda else send
        host_out = torch.empty_like(host_in) if output.is_cuda else output  # may be the input: in place
        works.append(_collective(comm, HOST, ADASUM, host_in, host_out, host_in.numel(),
                                 check_tensor(tensor, comm.rank, "allreduce")))
        staged.append((host_in, host_out, output))

    def finish():
        for _, host_out, output in staged:
            if host_out is not output:
                output.copy_(host_out)
            plan.after(output)
        return list(outputs)
    return works, finish


def _allreduce_issue(comm, where, tensors, outputs, op, prescale, postscale, label):
    """Issues the allreduce of `tensors` into `outputs`; returns (works, finish)."""
    if op == Adasum:
        return _adasum_issue(comm, tensors, outputs, prescale, postscale)
    if len(tensors) == 1:
        tensor, output = tensors[0], outputs[0]
        plan = _Plan(op, tensor, comm.size, prescale, postscale, label)
        send = plan.before(tensor)
        work = _collective(comm, where, ALLREDUCE, send, output, tensor.numel(),
                           check_tensor(tensor, comm.rank, "allreduce"), plan.op)

        def finish_one(_read=send):  # the (scaled) input the core reads stays alive until the op ends
            plan.after(output)
            return [output]
        return (work,), finish_one
    groups = {}
    for i, t in enumerate(tensors):
        groups.setdefault((t.dtype, t.device), []).append(i)
    works, flats = [], []
    for members in groups.values():
        first = tensors[members[0]]
        plan = _Plan(op, first, comm.size, prescale, postscale, label)
        flat = torch.cat([tensors[i].reshape(-1) for i in members])
        if plan.pre != 1.0:
            _scale_(flat, plan.pre)
        works.append(_collective(comm, where, ALLREDUCE, flat, flat, flat.numel(),
                                 check_tensor(first, comm.rank, "allreduce"), plan.op))
        flats.append((flat, members, plan))

    def finish_group():
        for flat, members, plan in flats:
            plan.after(flat)
            offset = 0
            for i in members:
                n = tensors[i].numel()
                outputs[i].copy_(flat[offset:offset + n].view_as(tensors[i]))
                offset += n
        return list(outputs)
    return works, finish_group


def _allreduce_async(tensors, outputs, name, op, prescale_factor, postscale_factor, process_set, opname,
                     single=False):
    comm, controller, label = _comm(process_set, opname)
    tensors, outputs = list(tensors), list(outputs)
    for t in tensors:
        _checked(t, label, opname)
    _Plan(op, tensors[0] if tensors else torch.empty(0), comm.size, prescale_factor, postscale_factor, label)
    if op == Adasum:
        _check_adasum(comm, process_set, tensors, label)
    where = placement(comm.rank, *tensors)
    meta = _meta("allreduce", tensors, op=op, pre=prescale_factor, post=postscale_factor)
    if not tensors:
        return _submit(process_set, controller, label, "allreduce", name, meta, lambda metas: ((), lambda: []),
                       prefix=opname)
    cache_key = _allreduce_key(tensors[0], op, prescale_factor, postscale_factor) if len(tensors) == 1 else None
    return _submit(process_set, controller, label, "allreduce", name, meta,
                   lambda metas: _allreduce_issue(comm, where, tensors, outputs, op, prescale_factor,
                                                  postscale_factor, label), single, opname, cache_key)


def _allreduce_key(tensor, op, prescale, postscale):
    """What the response cache compares for an allreduce of one tensor
    (controller.Request.key): equal keys are equal metadata (_meta). A host
    tensor's without scaling is the core's (the key the fast lane builds)."""
    code, op_code = DTYPE_CODES.get(tensor.dtype), _CORE_OPS.get(op)
    if tensor.is_cpu and prescale == 1.0 and postscale == 1.0 and code is not None and op_code is not None:
        return _core.allreduce_cache_key(code, op_code, list(tensor.shape))
    return repr(("allreduce", tensor.dtype, tuple(tensor.shape), tensor.is_cpu, op, prescale, postscale))


class _NameTaken:
    """Holds an op's name in _active_names while a synchronous allreduce negotiates it (_allreduce_now)."""

    __slots__ = ()

    def done(self):
        return False


class _QuickAllreduce(_InFlight):
    """A synchronous allreduce of one named host tensor, as its controller's
    request (controller.Request) when it did not finish in the round that
    agreed on it (Controller.run_quick): it runs as any op does, or a later
    cached round reduces it inline, and the caller waits for it (_allreduce_now)."""

    __slots__ = ("name", "key", "inline", "comm", "tensor", "output", "op", "was_folded", "_meta")

    def __init__(self, name, key, inline, comm, controller, tensor, output, op, rank):
        super().__init__(f"rank {rank}: allreduce", controller)
        self.name, self.key, self.inline, self.comm = name, key, inline, comm
        self.tensor, self.output, self.op = tensor, output, op
        self.was_folded = False
        self._meta = None

    @property
    def meta(self):  # read by a full round only
        if self._meta is None:
            self._meta = _meta("allreduce", (self.tensor,), op=self.op, pre=1.0, post=1.0)
        return self._meta

    def folded(self):  # a cached round reduced it (controller.Request)
        self.was_folded = self.answered = True

    def run(self, metas, joined):
        try:
            works, finish = _allreduce_issue(self.comm, HOST, [self.tensor], [self.output], self.op, 1.0, 1.0,
                                             self.label)
        except Exception as e:  # noqa: BLE001 - the caller raises it
            self.failed(f"{e}")
            return
        timeline = self.controller.timeline  # started while this op waited: it ends there too, as _submit's
        if timeline is not None:
            self.ended = lambda: timeline.end(self.name, self.meta)
        self.started(works, finish)

    def fail(self, message):  # controller.Request's name for it
        self.failed(message)


def _allreduce_now(tensor, in_place, name, op, process_set):
    """allreduce (or allreduce_) of one named host tensor without a handle:
    through the controller's fast lane (one core call: the cached round that
    agrees on it reduces it) when the op ran before under its name, else
    submitted and negotiated on this thread at once (Controller.run_quick).
    None, having done nothing, for anything unusual: the general path then
    runs it or words the error."""
    job = _basics._current
    if job is None or not isinstance(tensor, torch.Tensor) or not isinstance(process_set, ProcessSet):
        return None
    parts = job.parts(process_set.process_set_id)
    code = DTYPE_CODES.get(tensor.dtype)
    op_code = _CORE_OPS.get(op)
    if (parts is None or op_code is None or code is None or not tensor.is_cpu
            or tensor.layout is not torch.strided or not tensor.is_contiguous()
            or (op == Average and not tensor.is_floating_point())):
        return None
    comm, controller = parts
    name = "allreduce." + name
    names_key = (process_set.process_set_id, name)
    holder = _active_names.get(names_key)  # an op of this name in flight: the path below refuses it
    output = tensor if in_place else torch.empty_like(tensor)
    args = (tensor.data_ptr(), output.data_ptr(), tensor.numel(), code, op_code)
    if holder is None or holder.done():
        lane = controller.lane
        try:
            done = lane.run(name, tensor.shape, *args)
            if done is True:
                controller.lane_round_over()
                return output
            if done is not None:  # the lane's round did not fold it: this thread still drives
                return _lane_round_rest(done, names_key, name, comm, controller, tensor, output, op, job.rank, args)
        except BaseException as error:
            # Held: the exception came after the claim and before the
            # controller took the round over (answer_quick takes the record).
            held = lane.held_here()
            if held is None:
                raise
            if held is True:  # the round failed
                return _lane_round_rest(error, names_key, name, comm, controller, tensor, output, op, job.rank, args)
            # The round ran and an interrupt came as it returned: settle the round, then raise.
            controller.answer_quick(name, _quick_maker(name, comm, controller, tensor, output, op, job.rank, args),
                                    *held)
            raise
    if controller.timeline is not None:
        return None  # the general path writes the op's timeline events
    taken = _NameTaken()
    if not _take_name(names_key, taken):  # as _submit takes a name: another thread's op of the same name
        return None  # the general path says why
    try:
        quick = controller.run_quick(name, _quick_maker(name, comm, controller, tensor, output, op, job.rank, args))
        if quick is None:
            return None  # not submitted: the general path raises why
        return _wait_quick(controller, quick, output)
    finally:
        _release_name(names_key, taken)


def _lane_round_rest(done, names_key, name, comm, controller, tensor, output, op, rank, args):
    """The rest of a synchronous allreduce whose lane round did not fold it
    (`done`: (slot, offer bytes), or the round's exception): the controller
    answers it from that round, the name held until the op is over, as _submit holds one."""
    taken = _NameTaken()
    _take_name(names_key, taken)  # held where free; the round has the op either way
    try:
        make = _quick_maker(name, comm, controller, tensor, output, op, rank, args)
        if isinstance(done, BaseException):
            quick = controller.answer_quick(name, make, error=done)
        else:
            quick = controller.answer_quick(name, make, *done)
        return _wait_quick(controller, quick, output)
    finally:
        _release_name(names_key, taken)


def _quick_maker(name, comm, controller, tensor, output, op, rank, args):
    """What builds a synchronous allreduce's Request (its input goes into
    cached rounds while it fits RCOLL_HOROVOD_INLINE_BYTES)."""
    key = _allreduce_key(tensor, op, 1.0, 1.0)
    inline = args if args[2] * tensor.element_size() <= controller.inline_bytes else None
    return lambda: _QuickAllreduce(name, key, inline, comm, controller, tensor, output, op, rank)


def _wait_quick(controller, quick, output):
    """The output of a synchronous allreduce that did not finish in its round, once it has run."""
    controller.wait(quick.is_answered)
    if quick.error is not None:
        raise HorovodInternalError(quick.error)
    if not quick.was_folded:  # a later round may have reduced it inline
        _wait(quick.works, quick.label)
        quick.finish()
        if quick.ended is not None:
            quick.ended()
    return output


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                    process_set=global_process_set):
    """Starts reducing `tensor` over the process set (Average by default) into a
    new tensor; returns a handle for poll() and synchronize()."""
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_async([tensor], [torch.empty_like(tensor)], name, op, prescale_factor, postscale_factor,
                            process_set, "allreduce", single=True)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                     process_set=global_process_set):
    """allreduce_async in place: synchronize() returns `tensor`, reduced."""
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_async([tensor], [tensor], name, op, prescale_factor, postscale_factor, process_set,
                            "allreduce", single=True)


class HorovodAllreduce(torch.autograd.Function):
    """allreduce with a gradient: the gradient is allreduced the same way."""

    @staticmethod
    def forward(ctx, tensor, average, name, op, prescale_factor, postscale_factor, process_set):
        ctx.average, ctx.op, ctx.process_set = average, op, process_set
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        return synchronize(allreduce_async(tensor, average, name, op, prescale_factor, postscale_factor,
                                           process_set))

    @staticmethod
    def backward(ctx, grad_output):
        return (allreduce(grad_output.contiguous(), average=ctx.average, op=ctx.op,
                          prescale_factor=ctx.prescale_factor, postscale_factor=ctx.postscale_factor,
                          process_set=ctx.process_set),
                None, None, None, None, None, None)


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set):
    """`tensor` reduced over the process set (Average by default), as a new
    tensor; differentiable. `compression` applies to what travels."""
    if (name is not None and compression is Compression.none and average is None and prescale_factor == 1.0
            and postscale_factor == 1.0 and not (tensor.requires_grad and torch.is_grad_enabled())):
        reduced = _allreduce_now(tensor, False, name, Average if op is None else op, process_set)
        if reduced is not None:
            return reduced
    compressed, ctx = compression.compress(tensor)
    if _needs_grad(compressed):
        reduced = HorovodAllreduce.apply(compressed, average, name, op, prescale_factor, postscale_factor,
                                         process_set)
    else:
        reduced = synchronize(allreduce_async(compressed, average, name, op, prescale_factor, postscale_factor,
                                              process_set))
    return compression.decompress(reduced, ctx)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
               process_set=global_process_set):
    """allreduce in place; returns `tensor`."""
    if name is not None and average is None and prescale_factor == 1.0 and postscale_factor == 1.0:
        reduced = _allreduce_now(tensor, True, name, Average if op is None else op, process_set)
        if reduced is not None:
            return reduced
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor, postscale_factor, process_set))


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                            process_set=global_process_set):
    """Starts reducing each tensor as allreduce_async does, as one op (one core
    op per dtype); synchronize() returns the list of results."""
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_async(tensors, [torch.empty_like(t) for t in tensors], name, op, prescale_factor,
                            postscale_factor, process_set, "grouped_allreduce")


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                             process_set=global_process_set):
    op = handle_average_backwards_compatibility(op, average)
    return _allreduce_async(tensors, list(tensors), name, op, prescale_factor, postscale_factor, process_set,
                            "grouped_allreduce")


class HorovodGroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, average, name, op, prescale_factor, postscale_factor, process_set, *tensors):
        ctx.average, ctx.op, ctx.process_set = average, op, process_set
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        return tuple(synchronize(grouped_allreduce_async(list(tensors), average, name, op, prescale_factor,
                                                         postscale_factor, process_set)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = grouped_allreduce([g.contiguous() for g in grad_outputs], average=ctx.average, op=ctx.op,
                                  prescale_factor=ctx.prescale_factor, postscale_factor=ctx.postscale_factor,
                                  process_set=ctx.process_set)
        return (None, None, None, None, None, None, *grads)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set):
    """Each tensor reduced as allreduce does, in one op; differentiable."""
    compressed, ctxs = zip(*[compression.compress(t) for t in tensors]) if tensors else ((), ())
    if _needs_grad(*compressed):
        reduced = HorovodGroupedAllreduce.apply(average, name, op, prescale_factor, postscale_factor, process_set,
                                                *compressed)
    else:
        reduced = synchronize(grouped_allreduce_async(list(compressed), average, name, op, prescale_factor,
                                                      postscale_factor, process_set))
    return [compression.decompress(t, ctx) for t, ctx in zip(reduced, ctxs)]


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0, postscale_factor=1.0,
                       process_set=global_process_set):
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor, postscale_factor,
                                                process_set))


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """A sparse COO tensor reduced by gathering every rank's indices and values
    (Sum or Average); returns a callable that waits and returns the result."""
    indices_handle = allgather_async(tensor._indices().transpose(0, 1).contiguous(),
                                     name=f"{name}.indices" if name else None, process_set=process_set)
    values_handle = allgather_async(tensor._values().contiguous(), name=f"{name}.values" if name else None,
                                    process_set=process_set)

    def handle():
        values = synchronize(values_handle)
        indices = synchronize(indices_handle)
        if op == Average:
            values = values / process_set.size()
        return torch.sparse_coo_tensor(indices.transpose(0, 1), values, tensor.size())
    return handle


# ---------------------------------------------------------------------------------------
# allgather: first dimensions may differ per rank (every rank's are in the metadata)
# ---------------------------------------------------------------------------------------
def _allgather_issue(comm, where, tensors, metas):
    """Gathers each tensor with the core's alltoallv, every rank sending its
    one block to each rank (send displacements all 0)."""
    works, outputs = [], []
    for i, tensor in enumerate(tensors):
        rows = [metas[r]["tensors"][i][1][0] if metas[r]["tensors"][i][1] else 1 for r in range(comm.size)]
        row_numel = math.prod(tensor.shape[1:]) if tensor.dim() > 0 else 1
        output = torch.empty((sum(rows),) + tuple(tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
        n = tensor.numel()
        works.append(_alltoallv(comm, where, tensor, output, [n] * comm.size, [0] * comm.size,
                                [r * row_numel for r in rows], check_tensor(tensor, comm.rank, "allgather", True)))
        outputs.append(output)
    return works, lambda: outputs


def _allgather_async(tensors, name, process_set, opname, single=False):
    comm, controller, label = _comm(process_set, opname)
    tensors = list(tensors)
    for t in tensors:
        _checked(t, label, opname, moves_only=True)
    where = placement(comm.rank, *tensors)
    return _submit(process_set, controller, label, "allgather", name, _meta("allgather", tensors),
                   lambda metas: _allgather_issue(comm, where, tensors, metas), single, opname)


def allgather_async(tensor, name=None, process_set=global_process_set):
    """Starts concatenating every rank's `tensor` along the first dimension
    (which may differ per rank); returns a handle."""
    return _allgather_async([tensor], name, process_set, "allgather", single=True)


class HorovodAllgather(torch.autograd.Function):
    """allgather with a gradient: each rank's slice of the averaged gradient."""

    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.dim = tensor.shape[0] if tensor.dim() > 0 else 1
        ctx.process_set = process_set
        return synchronize(allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad_reduced = allreduce(grad_output.contiguous(), op=Average, process_set=ctx.process_set)
        dims = synchronize(allgather_async(torch.tensor([ctx.dim], dtype=torch.int64), process_set=ctx.process_set))
        offset = int(dims[:ctx.process_set.rank()].sum())
        return grad_reduced.narrow(0, offset, ctx.dim), None, None


def allgather(tensor, name=None, process_set=global_process_set):
    """Every rank's `tensor` concatenated along the first dimension; differentiable."""
    if _needs_grad(tensor):
        return HorovodAllgather.apply(tensor, name, process_set)
    return synchronize(allgather_async(tensor, name, process_set))


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    """allgather of each tensor as one op; returns a handle."""
    return _allgather_async(tensors, name, process_set, "grouped_allgather")


class HorovodGroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        ctx.dims = [t.shape[0] if t.dim() > 0 else 1 for t in tensors]
        ctx.process_set = process_set
        return tuple(synchronize(grouped_allgather_async(list(tensors), name, process_set)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        grads = grouped_allreduce([g.contiguous() for g in grad_outputs], op=Average, process_set=ctx.process_set)
        dims = synchronize(allgather_async(torch.tensor(ctx.dims, dtype=torch.int64).view(1, -1),
                                           process_set=ctx.process_set))
        offsets = dims[:ctx.process_set.rank()].sum(dim=0)
        return (None, None, *[g.narrow(0, int(offsets[i]), ctx.dims[i]) for i, g in enumerate(grads)])


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    if _needs_grad(*tensors):
        return list(HorovodGroupedAllgather.apply(name, process_set, *tensors))
    return synchronize(grouped_allgather_async(tensors, name, process_set))


# ---------------------------------------------------------------------------------------
# broadcast: root_rank is a global rank, as in Horovod
# ---------------------------------------------------------------------------------------
def _root_index(process_set, root_rank, label):
    ranks = _basics.job().process_set_ranks(process_set.process_set_id)
    if root_rank not in ranks:
        raise ValueError(f"{label}: root_rank {root_rank} is not a rank of process set "
                         f"{process_set.process_set_id} (ranks {ranks})")
    return ranks.index(root_rank)


def _broadcast_async(tensor, output, root_rank, name, process_set):
    comm, controller, label = _comm(process_set, "broadcast")
    code = _checked(tensor, label, "broadcast", moves_only=True)
    root = _root_index(process_set, root_rank, label)
    where = placement(comm.rank, tensor, output)

    def issue(metas):
        if output is not tensor and comm.rank == root:
            output.copy_(tensor)
        return (_collective(comm, where, BROADCAST, output, output, output.numel(), code, 0, root),), lambda: output
    return _submit(process_set, controller, label, "broadcast", name, _meta("broadcast", [tensor], root=root_rank),
                   issue)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set):
    """Starts copying root_rank's `tensor` into a new tensor on every rank; returns a handle."""
    return _broadcast_async(tensor, torch.empty_like(tensor), root_rank, name, process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set):
    """broadcast_async in place."""
    return _broadcast_async(tensor, tensor, root_rank, name, process_set)


class HorovodBroadcast(torch.autograd.Function):
    """broadcast with a gradient: the average of the gradients, on the root only."""

    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad_output):
        grad_reduced = allreduce(grad_output.contiguous(), op=Average, process_set=ctx.process_set)
        if _basics.rank() != ctx.root_rank:
            grad_reduced = grad_reduced * 0
        return grad_reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """root_rank's `tensor` on every rank, as a new tensor; differentiable."""
    if _needs_grad(tensor):
        return HorovodBroadcast.apply(tensor, root_rank, name, process_set)
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    """broadcast in place; returns `tensor`."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


# ---------------------------------------------------------------------------------------
# alltoall with splits (every rank's splits are in the metadata)
# ---------------------------------------------------------------------------------------
def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set):
    """Starts sending splits[j] first-dimension rows of `tensor` to rank j of the
    set (equal splits when None); synchronize() returns (output, received_splits)."""
    comm, controller, label = _comm(process_set, "alltoall")
    code = _checked(tensor, label, "alltoall", moves_only=True)
    if tensor.dim() == 0:
        raise ValueError(f"{label}: alltoall needs a tensor with at least one dimension")
    rows = tensor.shape[0]
    if splits is None:
        if rows % comm.size != 0:
            raise ValueError(f"{label}: the first dimension ({rows}) is not divisible by the process set's size "
                             f"({comm.size}); pass splits")
        send_rows = [rows // comm.size] * comm.size
    else:
        send_rows = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
        if len(send_rows) != comm.size:
            raise ValueError(f"{label}: splits has {len(send_rows)} entries, expected one per rank of the process "
                             f"set ({comm.size})")
        if any(s < 0 for s in send_rows) or sum(send_rows) != rows:
            raise ValueError(f"{label}: splits {send_rows} must be non-negative and add up to the first dimension "
                             f"({rows})")
    splits_dtype = splits.dtype if isinstance(splits, torch.Tensor) else torch.int32
    where = placement(comm.rank, tensor)

    def issue(metas):
        recv_rows = [metas[r]["splits"][comm.rank] for r in range(comm.size)]
        row_numel = math.prod(tensor.shape[1:])
        output = torch.empty((sum(recv_rows),) + tuple(tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
        send_counts = [r * row_numel for r in send_rows]
        work = _alltoallv(comm, where, tensor, output, send_counts, displacements(send_counts),
                          [r * row_numel for r in recv_rows], code)
        received = torch.tensor(recv_rows, dtype=splits_dtype)
        return (work,), lambda: (output, received)
    return _submit(process_set, controller, label, "alltoall", name, _meta("alltoall", [tensor], splits=send_rows),
                   issue)


class HorovodAlltoall(torch.autograd.Function):
    """alltoall with a gradient: the gradient goes back along the received splits."""

    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.process_set, ctx.recvsplits = process_set, received
        if splits is None:
            return output
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad_output, *unused):
        grad, _ = synchronize(alltoall_async(grad_output.contiguous(), ctx.recvsplits, process_set=ctx.process_set))
        return grad, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """The rows every rank sent this one, in rank order; with `splits`, also the
    received splits (a tensor). Differentiable."""
    if _needs_grad(tensor):
        return HorovodAlltoall.apply(tensor, splits, name, process_set)
    output, received = synchronize(alltoall_async(tensor, splits, name, process_set))
    return output if splits is None else (output, received)


# ---------------------------------------------------------------------------------------
# reducescatter: rank r keeps its share of the first dimension
# ---------------------------------------------------------------------------------------
def _reducescatter_issue(comm, where, tensors, op, prescale, postscale, label):
    works, results = [], []
    for tensor in tensors:
        plan = _Plan(op, tensor, comm.size, prescale, postscale, label)
        rows = _split_counts(tensor.shape[0], comm.size)
        send = plan.before(tensor)
        if rows[-1] != rows[0]:  # uneven: every block padded to the largest share
            padded = torch.zeros((comm.size * rows[0],) + tuple(tensor.shape[1:]), dtype=tensor.dtype,
                                 device=tensor.device)
            starts = displacements(rows)
            for r in range(comm.size):
                padded[r * rows[0]:r * rows[0] + rows[r]] = send[starts[r]:starts[r] + rows[r]]
            send = padded
        recv = torch.empty((rows[0],) + tuple(tensor.shape[1:]), dtype=tensor.dtype, device=tensor.device)
        works.append(_collective(comm, where, REDUCE_SCATTER, send, recv, rows[0] * math.prod(tensor.shape[1:]),
                                 check_tensor(tensor, comm.rank, "reducescatter"), plan.op))
        results.append((recv, rows[comm.rank], plan, send))

    def finish():
        outputs = []
        for recv, mine, plan, _ in results:
            out = recv[:mine]
            plan.after(out)
            outputs.append(out)
        return outputs
    return works, finish


def _reducescatter_async(tensors, name, op, process_set, prescale_factor, postscale_factor, opname, single=False):
    comm, controller, label = _comm(process_set, opname)
    tensors = list(tensors)
    for tensor in tensors:
        _checked(tensor, label, opname)
        if tensor.dim() == 0:
            raise ValueError(f"{label}: reducescatter needs a tensor with at least one dimension")
        if op == Adasum:
            raise NotImplementedError(f"{label}: reducescatter does not support Adasum (Horovod neither)")
        _Plan(op, tensor, comm.size, prescale_factor, postscale_factor, label)
    where = placement(comm.rank, *tensors)
    meta = _meta("reducescatter", tensors, op=op, pre=prescale_factor, post=postscale_factor)
    return _submit(process_set, controller, label, "reducescatter", name, meta,
                   lambda metas: _reducescatter_issue(comm, where, tensors, op, prescale_factor, postscale_factor,
                                                      label), single, opname)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0,
                        postscale_factor=1.0):
    """Starts reducing `tensor` over the set; rank r keeps its share of the
    first dimension (the first dim % size ranks one row more). Returns a handle."""
    return _reducescatter_async([tensor], name, op, process_set, prescale_factor, postscale_factor,
                                "reducescatter", single=True)


class HorovodReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale_factor, postscale_factor):
        ctx.op, ctx.process_set = op, process_set
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale_factor, postscale_factor))

    @staticmethod
    def backward(ctx, grad_output):
        scale = ctx.prescale_factor * ctx.postscale_factor * (ctx.process_set.size() if ctx.op == Sum else 1)
        if scale != 1.0:
            grad_output = grad_output * scale
        return allgather(grad_output.contiguous(), process_set=ctx.process_set), None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0):
    """This rank's share of `tensor` reduced over the set; differentiable."""
    compressed, ctx = compression.compress(tensor)
    if _needs_grad(compressed):
        out = HorovodReducescatter.apply(compressed, name, op, process_set, prescale_factor, postscale_factor)
    else:
        out = synchronize(reducescatter_async(compressed, name, op, process_set, prescale_factor, postscale_factor))
    return compression.decompress(out, ctx)


def grouped_reducescatter_async(tensors, name=None, op=Average, process_set=global_process_set, prescale_factor=1.0,
                                postscale_factor=1.0):
    return _reducescatter_async(tensors, name, op, process_set, prescale_factor, postscale_factor,
                                "grouped_reducescatter")


class HorovodGroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, process_set, prescale_factor, postscale_factor, *tensors):
        ctx.op, ctx.process_set = op, process_set
        ctx.prescale_factor, ctx.postscale_factor = prescale_factor, postscale_factor
        return tuple(synchronize(grouped_reducescatter_async(list(tensors), name, op, process_set, prescale_factor,
                                                             postscale_factor)))

    @staticmethod
    def backward(ctx, *grad_outputs):
        scale = ctx.prescale_factor * ctx.postscale_factor * (ctx.process_set.size() if ctx.op == Sum else 1)
        grads = [g * scale if scale != 1.0 else g for g in grad_outputs]
        return (None, None, None, None, None,
                *grouped_allgather([g.contiguous() for g in grads], process_set=ctx.process_set))


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0, postscale_factor=1.0):
    compressed, ctxs = zip(*[compression.compress(t) for t in tensors]) if tensors else ((), ())
    if _needs_grad(*compressed):
        outs = HorovodGroupedReducescatter.apply(name, op, process_set, prescale_factor, postscale_factor,
                                                 *compressed)
    else:
        outs = synchronize(grouped_reducescatter_async(list(compressed), name, op, process_set, prescale_factor,
                                                       postscale_factor))
    return [compression.decompress(t, ctx) for t, ctx in zip(outs, ctxs)]


# ---------------------------------------------------------------------------------------
# barrier, join
# ---------------------------------------------------------------------------------------
def _barrier_issue(comm):
    return (comm._comm.collective(BARRIER, 0, 0, 0, 0, 0, 0, 0.0, _issuing.inline),), lambda: None


def barrier(process_set=global_process_set):
    """Returns once every rank of the set has called it."""
    comm, controller, label = _comm(process_set, "barrier")
    synchronize(_submit(process_set, controller, label, "barrier", None, _meta("barrier", []),
                        lambda metas: _barrier_issue(comm)))


def join(device=-1) -> int:
    """This rank has no more data: until every rank joined, it takes part in
    the other ranks' allreduces with zeros (and their barriers); other ops
    fail while a rank has joined, as in Horovod. Blocks until every rank
    joined; returns the rank that joined last."""
    comm, controller, label = _comm(global_process_set, "join")
    done = threading.Event()
    result = {}

    def finished(last):
        result["last"] = last
        done.set()
    controller.join(finished)
    done.wait()
    last = result["last"]
    if isinstance(last, BaseException):
        raise HorovodInternalError(f"{label}: {last}") from last
    return last


# ---------------------------------------------------------------------------------------
# How agreed ops run on the controller's thread (common/controller.py)
# ---------------------------------------------------------------------------------------
_TORCH_DTYPES = {str(d): d for d in DTYPE_CODES}


def _stand_in(comm, name, metas):
    """What a joined rank runs in place of an allreduce (zeros) or a barrier it did not submit."""
    meta = next(iter(metas.values()))
    if meta["kind"] == "barrier":
        return Request(name, meta, lambda metas, joined: _barrier_issue(comm), lambda message: None)
    if meta["kind"] != "allreduce":
        return None
    device = torch.device("cuda", torch.cuda.current_device()) if meta["tensors"] and \
        meta["tensors"][0][2] == "cuda" else torch.device("cpu")
    zeros = [torch.zeros(shape, dtype=_TORCH_DTYPES[dtype], device=device) for dtype, shape, _ in meta["tensors"]]
    where = placement(comm.rank, *zeros)
    label = f"rank {comm.rank}: allreduce (joined)"

    def run(metas, joined):
        works, _ = _allreduce_issue(comm, where, zeros, zeros, meta["op"], meta["pre"], meta["post"], label)
        _JOINED_WORK.extend((w, zeros) for w in works)  # kept until done
    return Request(name, meta, run, lambda message: None)


_JOINED_WORK = []


def _execute(batch, inline):
    """Runs agreed ops in the order the controller gives (the same on every
    rank); `inline`: on this thread (a round driven by a caller of synchronize())."""
    _JOINED_WORK[:] = [(w, keep) for w, keep in _JOINED_WORK if not w.is_completed()]
    _issuing.inline = inline
    try:
        for request, metas, joined in batch:
            request.run(metas, joined)
    finally:
        _issuing.inline = False


def _forget():
    """The job ended (shutdown, or a reset after a failure): handles, names
    and the numbers of unnamed ops start afresh, the same on every rank."""
    with _names_lock:
        _active_names.clear()
    _handle_map.clear()
    _unnamed.clear()
    _JOINED_WORK.clear()


_basics.register_frontend(_execute, _stand_in, _forget)
