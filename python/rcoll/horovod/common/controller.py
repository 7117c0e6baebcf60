"""Horovod's negotiation: ops matched by name across ranks, checked, then run
in one order on every rank.

Horovod lets ranks issue their ops in different orders (gradients become
ready in different orders on different GPUs): an op runs once every rank
of its process set has submitted one with its name, and a mismatch (shape,
dtype, op, root) fails that op on every rank while the job goes on. rcoll's
communicators run ops in the order they are issued, so each process set has
a controller that decides that order:

  - every rank's background thread takes part in rounds over a control
    communicator of its own (TCP: tiny messages, waits that block instead
    of spinning). In a round each rank contributes the ops submitted since
    the last one (name and metadata), whether it joined, whether it is
    shutting down; every rank sees every contribution, so every rank
    updates the same table and computes the same answer;
  - an op whose name every rank that has not joined has submitted is ready:
    checked against every rank's metadata, it is answered "run" or "fail
    with this message", in the order the names first appeared;
  - the answers run in that order on the data communicator (fused where
    they can be, by the front end's executor), so the core sees one order.

A rank starts a round as soon as it has something new, otherwise once per
cycle: HOROVOD_CYCLE_TIME milliseconds (default 1) while ops are pending
anywhere, backing off to RCOLL_HOROVOD_IDLE_CYCLE milliseconds (default 20)
when the job is quiet. Ranks that called join() take part in ready
allreduces with zeros (the front end's stand-in) until every rank joined.
"""
from __future__ import annotations

import os
import pickle
import threading
from typing import Callable, Dict, List, Optional

import numpy as np

from ... import _core
from ..._ops import ALLGATHER


def _milliseconds(name: str, default: float) -> float:
    value = os.environ.get(name)
    if value in (None, ""):
        return default
    try:
        ms = float(value)
    except ValueError:
        raise _core.ConfigError(f"{name}={value!r} is not a number of milliseconds") from None
    if ms < 0:
        raise _core.ConfigError(f"{name}={value!r} is negative")
    return ms


class Request:
    """One op as this rank submits it. `meta` is what every rank sees (a
    picklable dict with "kind"; checked by `check`), `run(metas, joined)`
    issues it on the data communicator once agreed and returns its works and
    finishing step; `fail(error)` ends it with an error."""

    __slots__ = ("name", "meta", "run", "fail")

    def __init__(self, name: str, meta: dict, run: Callable, fail: Callable):
        self.name, self.meta, self.run, self.fail = name, meta, run, fail


class Controller:
    """The negotiation of one process set on this rank (module docstring)."""

    def __init__(self, control, rank: int, size: int, label: str, check: Callable, stand_in: Callable,
                 execute: Callable):
        """`control`: an rcoll.Communicator of the set's ranks for the rounds;
        `check(name, metas, joined)` -> an error message or None;
        `stand_in(name, metas)` -> the Request a joined rank runs in place of
        one it did not submit (or None); `execute(batch)` runs a list of
        (Request, metas, joined) in order."""
        self._control = control
        self._rank, self._size, self._label = rank, size, label
        self._check, self._stand_in, self._execute = check, stand_in, execute
        self._cycle = _milliseconds("HOROVOD_CYCLE_TIME", 1.0) / 1000.0
        self._idle_cycle = max(self._cycle, _milliseconds("RCOLL_HOROVOD_IDLE_CYCLE", 20.0) / 1000.0)
        self._lock = threading.Condition()
        self._new: List[Request] = []  # submitted, not yet sent in a round
        self._mine: Dict[str, Request] = {}  # sent, not yet answered
        self._table: Dict[str, Dict[int, dict]] = {}  # name -> {rank: meta}, in order of first appearance
        self._joined: List[int] = []  # ranks joined, in order
        self._join_waiter: Optional[Callable] = None
        self._joining = False
        self._stopping = False
        self._failed: Optional[BaseException] = None
        self._thread = threading.Thread(target=self._loop, name=f"rcoll-horovod-{label}", daemon=True)
        self._thread.start()

    # -- the caller's side ------------------------------------------------------------
    def submit(self, request: Request) -> None:
        with self._lock:
            if self._failed is not None:
                raise self._failed
            if self._stopping:
                raise ValueError(f"rank {self._rank}: {request.meta['kind']}: Horovod is shutting down")
            self._new.append(request)
            self._lock.notify()

    def join(self, done: Callable) -> None:
        """This rank joins; `done(last_rank)` runs once every rank of the set has."""
        with self._lock:
            if self._failed is not None:
                raise self._failed
            self._joining = True
            self._join_waiter = done
            self._lock.notify()

    def stop(self, grace: float) -> None:
        """Leaves the rounds once every rank of the set stops (or after `grace` seconds)."""
        with self._lock:
            self._stopping = True
            self._lock.notify()
        self._thread.join(grace)
        if self._thread.is_alive():
            self._control.abort(f"rank {self._rank}: Horovod shut down while another rank still ran ops")
            self._thread.join(5.0)

    # -- the rounds ----------------------------------------------------------------------
    def _loop(self):
        quiet_rounds = 0
        try:
            while True:
                with self._lock:
                    wait = self._cycle if quiet_rounds < 3 else min(self._idle_cycle, self._cycle * 2 ** quiet_rounds)
                    self._lock.wait_for(lambda: self._new or self._stopping or self._joining, timeout=wait)
                    new, self._new = self._new, []
                    joining, self._joining = self._joining, False
                    stopping = self._stopping
                    for request in new:
                        self._mine[request.name] = request
                contributions = self._exchange((
                    [(r.name, r.meta) for r in new], joining, stopping))
                busy = self._apply(contributions)
                if all(stop for _, _, stop in contributions):
                    return
                quiet_rounds = 0 if busy else quiet_rounds + 1
        except BaseException as error:  # noqa: BLE001 - every pending op learns why
            self._fail_all(error)

    def _exchange(self, contribution) -> list:
        """Every rank's contribution to this round, in rank order (two core ops:
        the sizes, then every payload to every rank)."""
        payload = np.frombuffer(pickle.dumps(contribution, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)
        sizes = np.empty(self._size, dtype=np.int64)
        mine = np.array([payload.size], dtype=np.int64)
        comm = self._control._comm
        comm.collective(ALLGATHER, mine.ctypes.data, sizes.ctypes.data, 1, _core.DTYPES["int64"], 0, 0, 0.0,
                        True).wait(None)
        total = int(sizes.sum())
        everything = np.empty(max(total, 1), dtype=np.uint8)
        offsets = [0] * self._size
        for r in range(1, self._size):
            offsets[r] = offsets[r - 1] + int(sizes[r - 1])
        comm.alltoall(payload.ctypes.data, everything.ctypes.data, [payload.size] * self._size, [0] * self._size,
                      [int(s) for s in sizes], offsets, _core.DTYPES["uint8"], 0.0, True).wait(None)
        return [pickle.loads(everything[offsets[r]:offsets[r] + int(sizes[r])].tobytes()) for r in range(self._size)]

    def _apply(self, contributions) -> bool:
        """Updates the table with a round's contributions and runs what became
        ready; True when anything is submitted or pending anywhere."""
        busy = False
        for rank, (requests, joining, _stopping) in enumerate(contributions):
            for name, meta in requests:
                self._table.setdefault(name, {})[rank] = meta
                busy = True
            if joining and rank not in self._joined:
                self._joined.append(rank)
        joined = set(self._joined)
        needed = [r for r in range(self._size) if r not in joined]
        batch = []
        for name in list(self._table):
            metas = self._table[name]
            if any(r not in metas for r in needed):
                continue
            del self._table[name]
            request = self._mine.pop(name, None)
            error = self._check(name, metas, joined)
            if error is not None:
                if request is not None:
                    request.fail(error)
                continue
            if request is None and self._rank in joined:
                request = self._stand_in(name, metas)
            if request is not None:
                batch.append((request, metas, joined))
        if batch:
            self._execute(batch)
        if self._joined and len(self._joined) == self._size:
            last = self._joined[-1]
            self._joined = []
            with self._lock:
                waiter, self._join_waiter = self._join_waiter, None
            if waiter is not None:
                waiter(last)
        return busy or bool(self._table) or bool(self._joined)

    def _fail_all(self, error: BaseException):
        with self._lock:
            self._failed = error
            pending = list(self._mine.values()) + self._new
            self._mine, self._new = {}, []
            waiter, self._join_waiter = self._join_waiter, None
        message = f"rank {self._rank}: Horovod's negotiation of {self._label} failed: {error}"
        for request in pending:
            request.fail(message)
        if waiter is not None:
            waiter(error)

    def close(self) -> None:
        self._control.shutdown()



# What every rank must agree on, per kind: the rest of the metadata may differ
# (allgather's and alltoall's first dimension, alltoall's splits).
_SAME_SHAPE = {"allreduce", "broadcast", "reducescatter"}
_SAME_TRAILING = {"allgather", "alltoall"}
_JOIN_OK = {"allreduce", "barrier"}


def check_metas(name: str, metas: Dict[int, dict], joined) -> Optional[str]:
    """Horovod's checks of one op across ranks: the message of the error every
    rank raises, or None when they agree."""
    ranks = sorted(metas)
    first = metas[ranks[0]]
    kind = first["kind"]

    def differ(what, get):
        values = {r: get(metas[r]) for r in ranks}
        base = values[ranks[0]]
        for r in ranks[1:]:
            if values[r] != base:
                return (f"Mismatched {kind} {what} for op {name!r}: rank {ranks[0]} passed {base}, rank {r} "
                        f"passed {values[r]}")
        return None

    message = differ("operations", lambda m: m["kind"])
    if message:
        return message.replace(f"Mismatched {kind} operations", "Mismatched collective operations")
    checks = [("tensor counts", lambda m: len(m["tensors"])),
              ("data types", lambda m: [t[0] for t in m["tensors"]]),
              ("devices", lambda m: [t[2] for t in m["tensors"]]),
              ("reduce ops", lambda m: m.get("op")),
              ("root ranks", lambda m: m.get("root")),
              ("prescale factors", lambda m: m.get("pre")),
              ("postscale factors", lambda m: m.get("post"))]
    if kind in _SAME_SHAPE:
        checks.append(("tensor shapes", lambda m: [tuple(t[1]) for t in m["tensors"]]))
    if kind in _SAME_TRAILING:
        checks.append(("tensor shapes (all dimensions but the first)",
                       lambda m: [(len(t[1]), tuple(t[1][1:])) for t in m["tensors"]]))
    for what, get in checks:
        message = differ(what, get)
        if message:
            return message
    if joined and kind not in _JOIN_OK:
        return (f"{kind} {name!r} cannot run while rank(s) {sorted(joined)} have joined (hvd.join): only allreduce "
                "and barrier can")
    return None
