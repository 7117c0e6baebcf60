"""Work objects of the torch backend (rcoll.torch_backend), and the thread that
completes their futures.

Torch's contract, as RcollWork keeps it:
- wait() blocks until the op is done (copy-back of non-contiguous tensors
  included) and raises the op's rcoll error;
- get_future() returns a future whose value is the list of output tensors and
  whose error reaches C++ consumers: the future is a `.then()` child of a base
  future, and the callback raises the op's error, which marks the C++ future
  failed (Future.set_exception from Python would not);
- futures are completed on a dedicated completion thread, never on the
  progress thread, so a callback that issues another collective and waits on
  it does not deadlock.

Nothing here knows which collective a Work stands for: the op mapping is in
torch_backend.py.
"""
from __future__ import annotations

import atexit
import itertools
import threading
from datetime import timedelta
from typing import List, Optional

import torch
import torch.distributed as dist

from . import _core
from ._in_flight import InFlight


# ---------------------------------------------------------------------------------------
# Completion thread: completes torch futures once their op is done.
# ---------------------------------------------------------------------------------------
class _Completer:
    """One daemon thread per process that completes futures of finished works.

    Works register a token with the C++ CompletionQueue; the progress thread
    pushes the token when the op ends; this thread pops it and completes the
    future (running its callbacks) outside the progress thread.

    The thread is stopped and joined at exit (stop(), an atexit hook): a daemon
    thread still waiting in the core when the interpreter finalizes is ended by
    CPython with a forced unwind, and no rcoll thread is to be in the core then.
    atexit hooks run after threading has joined the non-daemon threads (which
    may still wait on futures this thread completes) and before finalization.
    """

    _STOP_JOIN_SECONDS = 10.0  # a callback still running at exit gets this long

    def __init__(self):
        self.queue = _core.CompletionQueue()
        self._pending = {}
        self._lock = threading.Lock()
        self._tokens = itertools.count(1)
        self._thread = None

    def watch(self, core_work, work: "RcollWork") -> bool:
        """Arranges for work._fire() when core_work ends; False if it already has."""
        token = next(self._tokens)
        with self._lock:
            self._pending[token] = work
            if (self._thread is None or not self._thread.is_alive()) and not self.queue.closed:
                self._thread = threading.Thread(target=self._run, name="rcoll-completion", daemon=True)
                self._thread.start()
        if core_work.notify(self.queue, token):
            return True
        with self._lock:
            self._pending.pop(token, None)
        return False

    def stop(self) -> None:
        """Ends the thread (at exit): works that finish later complete no future."""
        self.queue.close()
        with self._lock:
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self._STOP_JOIN_SECONDS)

    def _run(self):
        queue = self.queue
        while True:
            token = queue.pop(1.0)
            if token is None:
                if queue.closed:
                    return
                continue
            with self._lock:
                work = self._pending.pop(token, None)
            if work is not None:
                work._on_core_done()


_COMPLETER = _Completer()
atexit.register(_COMPLETER.stop)
# The tensors of every op in flight, held until the core is done with them
# however early torch drops the op's Work: memory must not go back to torch's
# allocator while the core (or, for GPU tensors, rcoll's streams) still uses it.
_IN_FLIGHT = InFlight()


# ---------------------------------------------------------------------------------------
# Works handed to torch's C++ side
# ---------------------------------------------------------------------------------------
def _cpp_keeps_python_works() -> bool:
    """Whether this torch keeps a Python Work alive while its C++ side holds it.

    A Work that a Python process group returns is an object of torch's pybind
    trampoline: C++ callers (DDP's parameter check, _broadcast_coalesced,
    functional collectives) reach wait() and get_future() through the Python
    object. Releases that wrap the returned object (PyProcessGroup::PyWorkHolder)
    keep it alive; in the others it dies as soon as the trampoline call
    returns, and C++ then calls torch's base Work::wait(), which waits for a
    completion that never comes (DDP hangs at construction).

    Asked of torch itself, not of its version: a probe group returns, through
    the C++ allreduce binding, a Work whose get_future() gives a finished
    future. If the Work that comes back has lost its Python side, torch's
    base getFuture() raises instead."""

    class _ProbeWork(dist._Work):
        def get_future(self):
            future = torch.futures.Future()
            future.set_result(True)
            return future

    class _ProbeGroup(dist.ProcessGroup):
        def __init__(self):
            super().__init__(0, 1)

        def allreduce(self, tensors, opts=None):
            return _ProbeWork()

    try:
        work = dist.ProcessGroup.allreduce(_ProbeGroup(), [torch.zeros(1)], dist.AllreduceOptions())
        return work.get_future().wait() is True
    except Exception:  # noqa: BLE001 - lost (torch's "not implemented"): hold works, which is always safe
        return False


class _HandedOver:
    """Holds each Work handed to torch until torch has waited on it or taken
    its future, on torch releases that do not keep Python works alive
    themselves (_cpp_keeps_python_works). A Work never waited on and whose
    future is never taken stays held: on those releases a late C++ wait()
    on a released Work would never return. Where torch keeps them, hold() and
    release() become no-ops after the first call (the small-op path calls
    them on every op)."""

    def __init__(self):
        self._held = {}

    def hold(self, work) -> None:
        # First call: the probe needs torch initialised, so it runs here.
        if _cpp_keeps_python_works():
            self.hold = self.release = _nothing
            return
        self.hold = self._hold
        self._hold(work)

    def _hold(self, work) -> None:
        self._held[id(work)] = work

    def release(self, work) -> None:
        self._held.pop(id(work), None)


def _nothing(_work) -> None:
    pass


_HANDED_OVER = _HandedOver()


# ---------------------------------------------------------------------------------------
# Work
# ---------------------------------------------------------------------------------------
class RcollWork(dist._Work):
    """A torch Work over one or more core ops, with an optional finishing step
    (copying results into non-contiguous or list outputs) run exactly once."""

    # Defaults as class attributes: a small synchronous op (the common torch
    # call) then sets only what it needs; every attribute set on this pybind
    # subclass costs about 0.1 us.
    _finished = False
    _error: Optional[BaseException] = None
    _base_future = None
    _future = None
    _device = -1
    _stream = None

    def __init__(self, core_works, result, finish=None, keepalive=None):
        super().__init__()
        _HANDED_OVER.hold(self)
        works = [w for w in core_works if w is not None]
        self._core_works = works
        self._result = result
        self._finish = finish
        self._keepalive = keepalive
        self._lock = threading.Lock()
        self._remaining = len(works)
        for w in works:
            _IN_FLIGHT.hold(w, keepalive)
            if w.device >= 0 and self._stream is None:
                # GPU ops: the caller's stream at issue time. The core orders the
                # op after it; wait() orders the caller's current stream after the op.
                self._device = w.device
                self._stream = torch.cuda.current_stream(self._device)

    # -- completion -----------------------------------------------------------------
    def _settle(self) -> None:
        """Runs once all core works have ended: records the error or finishes."""
        with self._lock:
            if self._finished:
                return
            self._finished = True
            try:
                for w in self._core_works:
                    w.wait(0)  # raises the op's error, if any
                if self._finish is not None:
                    if self._stream is not None:
                        # Copies into the caller's tensors go on the caller's
                        # issue-time stream, after the op's completion event.
                        with torch.cuda.stream(self._stream):
                            for w in self._core_works:
                                w.stream_wait(self._stream.cuda_stream)
                            self._finish()
                    else:
                        self._finish()
            except BaseException as exc:  # noqa: BLE001 - handed to wait()/the future
                self._error = exc
            if self._keepalive is not None:
                self._keepalive = None
            if self._finish is not None:
                self._finish = None

    def _on_core_done(self) -> None:
        """Completion thread: one of the core works ended."""
        with self._lock:
            self._remaining -= 1
            if self._remaining > 0:
                return
        self._settle()
        if self._base_future is not None:
            self._base_future.set_result(None)

    def _value(self, _base):
        if self._error is not None:
            raise self._error
        return self._result

    # -- torch Work API -----------------------------------------------------------
    def wait(self, timeout: timedelta = timedelta(0)) -> bool:
        if not self._finished:
            seconds = timeout.total_seconds() if timeout else 0
            for w in self._core_works:
                if not w.wait(seconds if seconds > 0 else None):
                    raise _core.TimeoutError(f"Work.wait timed out: the timeout of {seconds} s passed "
                                             f"(op #{w.seq} is still running)")
            self._settle()
        _HANDED_OVER.release(self)
        if self._error is not None:
            raise self._error
        if self._stream is not None:
            # As with NCCL: the caller's current stream waits for the op's
            # completion event (and for copy-backs on the issue stream); the
            # host never synchronises the device here.
            current = torch.cuda.current_stream(self._device)
            for w in self._core_works:
                w.stream_wait(current.cuda_stream)
            if current != self._stream:
                current.wait_stream(self._stream)
        return True

    def is_completed(self) -> bool:
        if all(w.is_completed() for w in self._core_works):
            self._settle()
            return True
        return False

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None

    def exception(self):
        return self._error if self.is_completed() else None

    def result(self):
        self.wait()
        return self._result

    def _source_rank(self) -> int:
        """recv: the sender (torch's dist.recv(src=None) returns it); -1 for other ops."""
        return self._core_works[0].source_rank if len(self._core_works) == 1 else -1

    source_rank = _source_rank

    def get_future(self) -> torch.futures.Future:
        _HANDED_OVER.release(self)  # the future's callback holds this Work until the op ends
        with self._lock:
            if self._future is not None:
                return self._future
            # A CUDA-aware future for GPU results (torch refuses CUDA values otherwise).
            base = (torch.futures.Future(devices=[torch.device("cuda", self._device)]) if self._device >= 0
                    else torch.futures.Future())
            self._base_future = base
            self._future = base.then(self._value)
            future = self._future
        pending = [w for w in self._core_works if not w.is_completed()]
        watched = 0
        for w in pending:
            if _COMPLETER.watch(w, self):
                watched += 1
        with self._lock:
            # Works that ended between the check and watch() count as done now.
            self._remaining = watched
            ready = watched == 0
        if ready:
            self._settle()
            base.set_result(None)
        return future

    def synchronize(self):
        self.wait()


class _FinishedWork(RcollWork):
    """The Work of a blocking op that already ran to completion on the caller's
    thread (the small-op path): nothing to wait for, no lock, no core work.
    Building an RcollWork and waiting on it cost ~7 us of a ~15 us op."""

    _finished = True
    _core_works = ()

    _lock = threading.Lock()  # get_future() takes it: one for every finished work will do

    def __init__(self, result):  # noqa: PLW0231 - super-init of RcollWork skipped on purpose
        dist._Work.__init__(self)
        _HANDED_OVER.hold(self)
        self._result = result


def _done_work(result, finish=None) -> RcollWork:
    """A Work for an op that needed no communication (world size 1, empty input)."""
    work = RcollWork([], result, finish)
    work._settle()
    return work


def _combined(works: List[RcollWork], result) -> RcollWork:
    """One Work over several: done when all are, the first error wins."""
    for work in works:  # parts of the Work handed over, never handed over themselves
        _HANDED_OVER.release(work)
    core = [w for work in works for w in work._core_works]
    finishes = [work._settle for work in works]

    def finish():
        for f in finishes:
            f()
        for work in works:
            if work._error is not None:
                raise work._error
    return RcollWork(core, result, finish, works)
