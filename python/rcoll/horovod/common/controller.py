"""Horovod's negotiation: ops matched by name across ranks, checked, then run
in one order on every rank.

Horovod lets ranks issue their ops in different orders (gradients become
ready in different orders on different GPUs): an op runs once every rank
of its process set has submitted one with its name, and a mismatch (shape,
dtype, op, root) fails that op on every rank while the job goes on. rcoll's
communicators run ops in the order they are issued, so each process set has
a controller that decides that order, in rounds over a control communicator
of the set's own. Every rank takes part in every round and sees what every
rank contributed, so every rank computes the same answer:

  - a full round carries the ops submitted since the last one (name and
    metadata), whether the rank joined, whether it is shutting down. An op
    whose name every rank that has not joined has submitted is ready:
    checked against every rank's metadata, it is answered "run" or "fail
    with this message", in the order the names first appeared;
  - a cached round is Horovod's response cache: an op that ran before
    under the same name with the same metadata on every rank has a slot,
    the same on every rank (the cache changes only when an op runs, and ops
    run in one order everywhere). The round is one bitwise-and allreduce of
    a bit per slot, plus a word that every rank leaves all ones unless it has
    something a cached round cannot carry; then a full round follows at once.
    Named ops repeated every step (DistributedOptimizer's buckets, a loop's
    named tensors) thus cost one small allreduce to agree on;
  - the answers run in that order on the data communicator, so the core
    sees one order;
  - a small host allreduce can finish inside the cached round that agrees on
    it (`Request.inline`): each rank hands in the input of one op with the
    round's bits (the core's AgreedRound, csrc/agreed_reduce.h), and when
    every rank handed in the same op and every rank offered it, every rank
    folds the inputs alike, so a synchronous named allreduce costs one
    collective. `run_quick` runs such a round on the caller's thread at once
    when this rank has nothing else to negotiate.

Whoever waits for an op drives the rounds: a caller in synchronize() runs
them on its own thread (no hand-over to another thread for a blocking op),
and a background thread runs them for ops nobody waits for yet, once per
cycle (as Horovod's does): HOROVOD_CYCLE_TIME milliseconds (default 1)
while ops are pending anywhere, backing off to
RCOLL_HOROVOD_IDLE_CYCLE milliseconds (default 20) when the job is quiet.
Ranks that called join() take part in ready allreduces with zeros (the
front end's stand-in) until every rank joined.
"""
from __future__ import annotations

import os
import pickle
import threading
from typing import Callable, Dict, List, Optional

import numpy as np

from ... import _core
from ..._ops import ALLGATHER
from .exceptions import HorovodInternalError


def _setting(name: str, default: float, convert=float, unit="milliseconds") -> float:
    value = os.environ.get(name)
    if value in (None, ""):
        return default
    try:
        number = convert(value)
    except ValueError:
        raise _core.ConfigError(f"{name}={value!r} is not a number of {unit}") from None
    if number < 0:
        raise _core.ConfigError(f"{name}={value!r} is negative")
    return number


class Request:
    """One op as this rank submits it. `meta` is what every rank sees (a
    picklable dict with "kind"; checked by `check`), `run(metas, joined)`
    issues it on the data communicator once agreed; `fail(error)` ends it
    with an error. `key`: a hashable stand-in for `meta` (equal keys, equal
    metas) that the response cache compares instead, or None. `inline`:
    always None here; a front end's own request object (any object with
    these attributes: `meta` is read only when a full round needs it) may
    give (input address, output address, count, dtype code, reduce op code)
    for a host allreduce small enough to finish inside a cached round, and
    then has a folded() that such a round calls instead of run()."""

    __slots__ = ("name", "meta", "run", "fail", "key", "inline")

    def __init__(self, name: str, meta: dict, run: Callable, fail: Callable, key=None):
        self.name, self.meta, self.run, self.fail = name, meta, run, fail
        self.key, self.inline = key, None


def cacheable(name: str) -> bool:
    """Whether an op of this name goes into the response cache: not an unnamed
    op's ("allreduce.noname.7", new every time), as in Horovod."""
    return ".noname." not in name


class ResponseCache:
    """The ops that ran before, each in a slot, least recently run going
    first when it is full; the same on every rank because it changes only
    when an op runs. The slot table (name -> slot, this rank's key) is the
    core's (csrc/response_slots.h, held by the controller's QuickLane, which
    reads it without Python); every rank's metadata is kept here by slot.
    Names cross into the core as UTF-8 bytes, surrogates passed through (any
    str is a name), which is what the lane reads of a name it can encode."""

    def __init__(self, slots):
        self._slots = slots  # _core.QuickLane
        self._metas: Dict[int, Dict[int, dict]] = {}  # slot -> every rank's metadata

    def slot(self, request, rank: int) -> Optional[int]:
        """The slot of `request`'s name if this rank's metadata is what it was."""
        found = self._slots.find(_wire(request.name))
        if found is None:
            return None
        slot, key = found
        if request.key is not None and request.key == key:  # what the lane compares
            return slot
        return slot if self._metas[slot].get(rank) == request.meta else None

    def __len__(self) -> int:
        return len(self._slots)

    def entry(self, slot: int):
        """(name, metas) in `slot`."""
        return self._slots.name_at(slot).decode("utf-8", "surrogatepass"), self._metas[slot]

    def ran(self, name: str, metas: Dict[int, dict], key: Optional[str] = None) -> None:
        """Records an op that ran (from a full round or the cache); `key`: its request's on this rank."""
        slot, _evicted = self._slots.ran(_wire(name), key)
        self._metas[slot] = metas


def _wire(name: str) -> bytes:
    return name.encode("utf-8", "surrogatepass")


_CACHED_ONLY, _NEEDS_FULL = 0xFF, 0  # a cached round's first byte
_NOBODY = frozenset()  # no rank joined
_INT64 = _core.DTYPES["int64"]


class Controller:
    """The negotiation of one process set on this rank (module docstring)."""

    def __init__(self, control, rank: int, size: int, label: str, check: Callable, stand_in: Callable,
                 execute: Callable):
        """`control`: an rcoll.Communicator of the set's ranks for the rounds;
        `check(name, metas, joined)` -> an error message or None;
        `stand_in(name, metas)` -> the Request a joined rank runs in place of
        one it did not submit (or None); `execute(batch, inline)` runs a list
        of (Request, metas, joined) in order (`inline`: a caller of wait()
        drives the round, and may run them on its thread)."""
        self._control = control
        self._rank, self._size, self._label = rank, size, label
        self._check, self._stand_in, self._execute = check, stand_in, execute
        self._cycle = _setting("HOROVOD_CYCLE_TIME", 1.0) / 1000.0
        self._idle_cycle = max(self._cycle, _core.settings()["horovod_idle_cycle"])  # RCOLL_HOROVOD_IDLE_CYCLE
        capacity = self._agreed_capacity(int(_setting("HOROVOD_CACHE_CAPACITY", 1024, int, "entries")))
        # A cached round's vector: a byte that stays all ones unless a rank
        # needs a full round, then a bit per slot (little-endian).
        self._slot_bytes = (capacity + 7) // 8
        self._offer = np.zeros(1 + self._slot_bytes, dtype=np.uint8)
        self._agreed = np.zeros_like(self._offer)
        self._offer_bytes, self._agreed_bytes = memoryview(self._offer), memoryview(self._agreed)
        self._offer_at, self._agreed_at = self._offer.ctypes.data, self._agreed.ctypes.data
        # Each cached round: the AND of the offers, and an inline op's inputs (RCOLL_HOROVOD_INLINE_BYTES).
        self.inline_bytes = control._comm.horovod_inline_bytes  # rank 0's (an agreed setting)
        self._agree = control._comm.agreed_round(self._offer_at, self._agreed_at, 1, self.inline_bytes)
        # The gate every thread claims to drive a round, the response cache's
        # slots, and a synchronous small allreduce's round in one call
        # (csrc/python/quick_lane.h): the front end's fast path.
        self.lane = _core.QuickLane(control._comm, self._offer_at, self._agreed_at, capacity, self.inline_bytes)
        self._cache = ResponseCache(self.lane) if capacity > 0 else None
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)  # the background thread's: join, stop
        self._round_over = threading.Condition(self._lock)  # callers waiting for a round of another thread
        self._waiters = 0  # threads waiting on _round_over (for a round of another thread: lane.driving)
        self._inline = False  # the round is driven by a caller of wait()
        self._new: List[Request] = []  # submitted, not yet seen by a round
        self._pending: Dict[str, Request] = {}  # seen by a round, not yet answered (in submission order)
        self._announced = set()  # names of _pending sent in a full round (they are in _table)
        self._table: Dict[str, Dict[int, dict]] = {}  # name -> {rank: meta}, in order of first appearance
        self._joined: List[int] = []  # ranks joined, in order
        self._join_waiter: Optional[Callable] = None
        self._joining = False
        self._stopping = False
        self._finished = False  # every rank stopped: no more rounds
        self._failed: Optional[BaseException] = None
        self._timeline = None  # Horovod's timeline (timeline.py) while one is written
        self.lane.start(self._idle())
        self._thread = threading.Thread(target=self._loop, name=f"rcoll-horovod-{label}", daemon=True)
        self._thread.start()

    @property
    def timeline(self):
        """Horovod's timeline (timeline.py) while one is written, else None."""
        return self._timeline

    @timeline.setter
    def timeline(self, timeline) -> None:
        with self._lock:  # ordered with a driver's end_drive(self._idle())
            if timeline is not None:
                self.lane.not_idle()  # idle again once a round ends without one (_round_ended)
            self._timeline = timeline

    def _idle(self) -> bool:
        """Whether a lane's op is all this rank could negotiate now (the driving thread, under self._lock)."""
        return (self._cache is not None and self.inline_bytes > 0 and self._timeline is None and self._failed is None
                and not (self._stopping or self._joining or self._new or self._pending or self._table
                         or self._joined))

    def _agreed_capacity(self, mine: int) -> int:
        """Rank 0's HOROVOD_CACHE_CAPACITY, for every rank of the set (one
        allgather when the controller starts): a slot must name the same op on
        every rank, and caches of different sizes reuse slots at different times."""
        everyone = np.empty(self._size, dtype=np.int64)
        value = np.array([mine], dtype=np.int64)
        self._control._comm.collective(ALLGATHER, value.ctypes.data, everyone.ctypes.data, 1, _INT64, 0, 0, 0.0,
                                       True).wait(None)
        if int(everyone[self._rank]) != int(everyone[0]):
            _core.log("WARN", f"rank {self._rank}: HOROVOD_CACHE_CAPACITY={mine} differs from rank 0's "
                              f"{int(everyone[0])}; {self._label} uses rank 0's")
        return int(everyone[0])

    # -- the caller's side ------------------------------------------------------------
    def _refuse(self, what: str):
        """The error for an op submitted after the negotiation failed (a rank died: hvd.elastic resets on it)."""
        return HorovodInternalError(f"rank {self._rank}: {what}: Horovod's negotiation of {self._label} failed "
                                    f"earlier: {self._failed}")

    def submit(self, request: Request) -> None:
        with self._lock:
            if self._failed is not None:
                raise self._refuse(f"{request.meta['kind']} {request.name!r}") from self._failed
            if self._stopping:
                raise ValueError(f"rank {self._rank}: {request.meta['kind']}: Horovod is shutting down")
            # The background thread finds it at its next cycle (as Horovod's
            # does), unless a caller waits for it first and drives a round.
            self.lane.not_idle()  # before the lane could see it, never after
            self._new.append(request)

    def run_quick(self, name: str, make: Callable):
        """A synchronous op of this thread's: submitted and, when this rank
        has nothing else to negotiate, negotiated on this thread at once
        (a cached round folds it when it fits, as _cached_round does for
        any request with an input). `make()` builds its Request, which is
        returned, and which the caller waits for with wait(); None, nothing
        done, when the negotiation failed or stops (submit() raises why).
        The front end tries self.lane.run first, the same round without
        Python, and comes here when the lane does not take the op."""
        with self._lock:
            if self._failed is not None or self._stopping:
                return None
            if (self._new or self._pending or self._table or self._joined or self._joining
                    or not self.lane.try_drive()):
                # Submitted as by submit(), not waiting here for the round to
                # end: a thread that keeps driving rounds for its own op could
                # keep this one from ever being offered, while the peers,
                # in the same state, wait for it.
                request = make()
                self.lane.not_idle()
                self._new.append(request)
                return request
        return self.answer_quick(name, make)

    def answer_quick(self, name: str, make: Callable, slot=None, size=None, error=None):
        """The rest of a synchronous op's round when it did not finish in it,
        on the thread that drives (run_quick's, or the front end's after
        lane.run returned (slot, size) or raised `error`): its Request,
        answered by what the cached round in `slot` agreed and the full
        round that follows if one must, or by a round now when no cached
        round ran (slot None). The caller waits for it with wait()."""
        self._inline = True
        try:
            self.lane.held_here()  # this thread takes over what lane.run left it (nothing stale stays)
            request = self._pending[name] = make()
            try:
                if error is not None:
                    self._fail_all(error)
                elif slot is None:
                    self._round()
                elif self._cached_answer(size, (slot, request), False, True) is None:
                    self._full_round(False, False)
            except BaseException as failure:  # noqa: BLE001 - every pending op learns why
                self._fail_all(failure)
            return request
        finally:
            self._round_ended()

    def lane_round_over(self) -> None:
        """lane.run finished its op and let go of the rounds: threads waiting for another's round learn it."""
        if self._waiters:  # read without the lock: see wait()
            with self._lock:
                self._round_over.notify_all()

    def wait(self, answered: Callable[[], bool]) -> None:
        """Drives rounds on the caller's thread until `answered()` (ops are
        answered, run or failed, only in rounds), or waits while another thread drives."""
        lane = self.lane
        while not answered():
            with self._lock:
                # _waiters goes up before the gate is read, and lane.run lets
                # go of the gate before reading _waiters (lane_round_over):
                # either this thread sees the gate open or it is notified.
                self._waiters += 1
                try:
                    self._round_over.wait_for(lambda: answered() or not lane.driving)
                finally:
                    self._waiters -= 1
                if answered() or not lane.try_drive():
                    continue
            self._drive(inline=True)

    def join(self, done: Callable) -> None:
        """This rank joins; `done(last_rank)` runs once every rank of the set has."""
        with self._lock:
            if self._failed is not None:
                raise self._refuse("join") from self._failed
            self.lane.not_idle()
            self._joining = True
            self._join_waiter = done
            self._wake.notify()

    def stop(self, grace: float) -> None:
        """Leaves the rounds once every rank of the set stops (or after `grace` seconds)."""
        with self._lock:
            self.lane.not_idle()
            self._stopping = True
            self._wake.notify()
        self._thread.join(grace)
        if self._thread.is_alive():
            self._control.abort(f"rank {self._rank}: Horovod shut down while another rank still ran ops")
            self._thread.join(5.0)

    def lost_peers(self) -> List[int]:
        """The ranks whose connections the rounds saw die."""
        return list(self._control._comm.lost_peers)

    def abandon(self, why: str) -> None:
        """Ends the rounds at once (a rank failed): the control communicator
        is aborted, whatever is pending fails with `why`."""
        self._control.abort(why)
        with self._lock:
            self.lane.not_idle()
            self._stopping = True
            self._wake.notify()
        self._thread.join(5.0)
        self._fail_all(RuntimeError(why))
        self._control.shutdown()

    # -- the rounds ----------------------------------------------------------------------
    def _loop(self):
        quiet_rounds = 0
        while True:
            with self._lock:
                wait = self._cycle if quiet_rounds < 3 else min(self._idle_cycle, self._cycle * 2 ** quiet_rounds)
                self._wake.wait_for(lambda: self._stopping or self._joining, timeout=wait)
                if self._finished or self._failed is not None:
                    return
                if not self.lane.try_drive():  # a caller drives
                    quiet_rounds = 0
                    continue
            busy = self._drive()
            quiet_rounds = 0 if busy else quiet_rounds + 1

    def _drive(self, inline=False) -> bool:
        """One round on this thread (it holds lane's gate); True when anything is pending anywhere."""
        busy = False
        self._inline = inline
        try:
            busy = self._round()
        except BaseException as error:  # noqa: BLE001 - every pending op learns why
            self._fail_all(error)
        finally:
            self._round_ended()
        return busy

    def _round_ended(self):
        """The driving thread's round is over: another thread may drive, and those waiting learn it."""
        with self._lock:
            self.lane.end_drive(self._idle())  # one store: never the gate open beside a stale IDLE
            if self._waiters:
                self._round_over.notify_all()

    def _round(self) -> bool:
        timeline = self.timeline
        if timeline is not None and timeline.mark_cycles:
            timeline.cycle()
        with self._lock:
            new, self._new = self._new, []
            joining, self._joining = self._joining, False
            stopping = self._stopping
        for request in new:
            if request.name in self._pending:
                # A synchronous op of that name from another thread, which the
                # fast lane took without the front end's name registry.
                request.fail(f"rank {self._rank}: {request.meta['kind']} {request.name!r}: another op of this name "
                             "is in flight; ops in flight at once need names of their own")
                continue
            self._pending[request.name] = request
        # Every rank knows the table and the joined ranks, so every rank
        # makes the same choice of round.
        if self._cache is not None and not self._table and not self._joined:
            agreed = self._cached_round(joining or stopping)
            if agreed is not None:
                return agreed
        return self._full_round(joining, stopping)

    def _offer_size(self) -> int:
        """Bytes of a cached round's vector: the flag byte and a bit per slot
        in use (the cache is the same on every rank, so is this)."""
        return 1 + (len(self._cache) + 7) // 8

    def _cached_round(self, other_news: bool) -> Optional[bool]:
        """The cached round: True/False (busy) when every rank had only cached
        ops to offer (those every rank offered ran), None when a full round must follow."""
        mask = 0
        tagged = None  # (slot, request): the inline op this rank hands in
        for request in self._pending.values():
            slot = self._cache.slot(request, self._rank)
            if slot is None:
                other_news = True
                break
            mask |= 1 << slot
            if tagged is None and request.inline is not None and self.inline_bytes:
                tagged = (slot, request)
        size = self._offer_size()
        self._offer_bytes[0] = _NEEDS_FULL if other_news else _CACHED_ONLY
        self._offer_bytes[1:size] = mask.to_bytes(size - 1, "little")
        if other_news or tagged is None or self.timeline is not None:
            folded = self._agree(size, -1)
        else:
            folded = self._agree(size, tagged[0], *tagged[1].inline[:5])
        return self._cached_answer(size, tagged, folded, mask != 0)

    def _cached_answer(self, size, tagged, folded, offered) -> Optional[bool]:
        """Runs what a cached round agreed on (None: a full round must follow)."""
        if self._agreed_bytes[0] != _CACHED_ONLY:
            # Never after a fold: a rank hands an input in only with a
            # cached-only offer, and a fold needs every rank's.
            return None
        ready = int.from_bytes(self._agreed_bytes[1:size], "little")
        if folded:  # every rank's inputs are reduced into the op's output already
            slot, request = tagged
            ready &= ~(1 << slot)
            del self._pending[request.name]
            self._cache.ran(request.name, self._cache.entry(slot)[1], request.key)
            request.folded()
        batch = []
        while ready:  # in slot order: the same on every rank
            low = ready & -ready
            ready ^= low
            name, metas = self._cache.entry(low.bit_length() - 1)
            batch.append((self._pending.pop(name), metas, _NOBODY))
        timeline = self.timeline
        for request, metas, _ in batch:
            self._cache.ran(request.name, metas, request.key)
            if timeline is not None:
                timeline.negotiate_start(request.name, request.meta["kind"])
                timeline.negotiate_end(request.name)
        self._run(batch)
        return offered

    def _run(self, batch):
        timeline = self.timeline
        if timeline is not None:
            for request, _, _ in batch:
                timeline.start(request.name, request.meta["kind"])
        if batch:
            self._execute(batch, self._inline)

    def _full_round(self, joining: bool, stopping: bool) -> bool:
        announce = [(r.name, r.meta) for name, r in self._pending.items() if name not in self._announced]
        self._announced.update(name for name, _ in announce)
        contributions = self._exchange((announce, joining, stopping))
        busy = self._apply(contributions)
        if all(stop for _, _, stop in contributions):
            with self._lock:
                self._finished = True
                unanswered = list(self._pending.values()) + self._new
                self._pending, self._new = {}, []
            for request in unanswered:  # submitted by this rank only
                request.fail(f"rank {self._rank}: {request.meta['kind']} {request.name!r}: Horovod shut down before "
                             "every rank of the process set submitted it")
        return busy

    def _exchange(self, contribution) -> list:
        """Every rank's contribution to a full round, in rank order (two core
        ops: the sizes, then every payload to every rank)."""
        payload = np.frombuffer(pickle.dumps(contribution, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)
        sizes = np.empty(self._size, dtype=np.int64)
        mine = np.array([payload.size], dtype=np.int64)
        comm = self._control._comm
        comm.collective(ALLGATHER, mine.ctypes.data, sizes.ctypes.data, 1, _INT64, 0, 0, 0.0, True).wait(None)
        total = int(sizes.sum())
        everything = np.empty(max(total, 1), dtype=np.uint8)
        offsets = [0] * self._size
        for r in range(1, self._size):
            offsets[r] = offsets[r - 1] + int(sizes[r - 1])
        comm.alltoall(payload.ctypes.data, everything.ctypes.data, [payload.size] * self._size, [0] * self._size,
                      [int(s) for s in sizes], offsets, _core.DTYPES["uint8"], 0.0, True).wait(None)
        return [pickle.loads(everything[offsets[r]:offsets[r] + int(sizes[r])].tobytes()) for r in range(self._size)]

    def _apply(self, contributions) -> bool:
        """Updates the table with a full round's contributions and runs what
        became ready; True when anything is submitted or pending anywhere."""
        busy = False
        timeline = self.timeline
        for rank, (requests, joining, _stopping) in enumerate(contributions):
            for name, meta in requests:
                if timeline is not None:
                    timeline.negotiate_rank_ready(name, meta["kind"], rank)
                self._table.setdefault(name, {})[rank] = meta
                busy = True
            if joining and rank not in self._joined:
                self._joined.append(rank)
        joined = frozenset(self._joined)
        needed = [r for r in range(self._size) if r not in joined]
        batch = []
        for name in list(self._table):
            metas = self._table[name]
            if any(r not in metas for r in needed):
                # An op that cannot run beside joined ranks fails now: its
                # other ranks may never submit it under the same name (an
                # unnamed op's number differs on a rank that joined instead).
                refusal = joined and refused_while_joined(name, metas, joined)
                if refusal:
                    if timeline is not None:
                        timeline.negotiate_end(name)
                    del self._table[name]
                    self._announced.discard(name)
                    request = self._pending.pop(name, None)
                    if request is not None:
                        request.fail(refusal)
                continue
            del self._table[name]
            self._announced.discard(name)
            if timeline is not None:
                timeline.negotiate_end(name)
            request = self._pending.pop(name, None)
            error = self._check(name, metas, joined)
            if error is not None:
                if request is not None:
                    request.fail(error)
                continue
            if self._cache is not None and not joined and cacheable(name):
                self._cache.ran(name, metas, request.key if request is not None else None)
            if request is None and self._rank in joined:
                request = self._stand_in(name, metas)
            if request is not None:
                batch.append((request, metas, joined))
        self._run(batch)
        if self._joined and len(self._joined) == self._size:
            last = self._joined[-1]
            self._joined = []
            with self._lock:
                waiter, self._join_waiter = self._join_waiter, None
            if waiter is not None:
                waiter(last)
        return busy or bool(self._table) or bool(self._joined) or bool(self._pending)

    def _fail_all(self, error: BaseException):
        with self._lock:
            self.lane.not_idle()
            self._failed = error
            pending = list(self._pending.values()) + self._new
            self._pending, self._new = {}, []
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
    if kind in _SAME_SHAPE and all(metas[r] == first for r in ranks[1:]):  # the usual case, at once
        return refused_while_joined(name, metas, joined) if joined else None

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
    return refused_while_joined(name, metas, joined) if joined else None


def refused_while_joined(name: str, metas: Dict[int, dict], joined) -> Optional[str]:
    """Why an op cannot run while the ranks `joined` have joined (only
    allreduce and barrier can, as in Horovod), or None."""
    kind = next(iter(metas.values()))["kind"]
    if kind in _JOIN_OK:
        return None
    return (f"{kind} {name!r} cannot run while rank(s) {sorted(joined)} have joined (hvd.join): only allreduce "
            "and barrier can")
