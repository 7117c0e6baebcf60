"""The process's rounds with the job's rendezvous store (RCOLL_WATCH_INTERVAL):
what lets an operator see a job from outside (docs/operations.md).

Every round, one thread of each process
  * tells the job when one of its communicators failed (one add on a counter,
    once per failure): the failing rank has dumped its flight recorder
    already (the core does, at the failure);
  * dumps its own flight recorder (RCOLL_TRACE_DIR set) when that counter
    moved, so a rank that is not in any rcoll op (it skipped one, or is stuck
    elsewhere) dumps too, and torch's analyzer gets every rank's view;
  * publishes its status, one small JSON value: host, pid, its pending ops
    (the core's flight recorder), last error, how long it waited in its last
    collectives and what its edges carried (csrc/edge_meter.h), which
    ``python -m rcoll status`` reads;
  * rank 0 reads every rank's status, judges who is late and which edge is
    slow (_health.py), publishes that as the job's health and says each
    finding in one WARN; the other ranks read it for rcoll.stats().

The keys live on the job's root store (under torch's prefixes, the store they
wrap), so one address finds them, under ``rcoll/<job>/``: the job is
torchrun's run id and attempt, so that the attempts that share torchrun's
store are told apart (elsewhere a job's store is its own: ``default``);
``rcoll/job`` names the latest. The thread is stopped and joined at exit,
before the interpreter finalizes (a thread inside a store call then would
abort the process), and ends by itself once the communicators it watches are
gone.
"""
from __future__ import annotations

import atexit
import json
import os
import socket
import threading
import time
import weakref
from typing import Optional

from . import _core, _health

JOB_KEY = "rcoll/job"  # the latest job's id


def job_keys(job: str) -> dict:
    base = f"rcoll/{job}/"
    return {"world": base + "world", "dumps": base + "dumps", "health": base + "health",
            "status": base + "status/"}  # + global rank


def job_id() -> str:
    """The same on every rank of one job (attempt), also on ranks that join
    it later; new for torchrun's next attempt."""
    run = os.environ.get("TORCHELASTIC_RUN_ID")
    if run:
        return f"{run}.{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    return "default"


def root_store(store):
    """The store under torch's PrefixStores, or `store` itself."""
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    return store


class _Store:
    """set / add / get-if-there over rcoll's TcpStore or a torch.distributed.Store."""

    def __init__(self, store):
        self.store = store
        self._rcoll = isinstance(store, _core.TcpStore)

    def set(self, key: str, value: str) -> None:
        self.store.set(key, value.encode() if self._rcoll else value)

    def add(self, key: str, delta: int) -> int:
        return int(self.store.add(key, delta))

    def get(self, key: str) -> Optional[bytes]:
        """The value, or None when the key is not there (never waits for it)."""
        if self._rcoll:
            return self.store.get(key, 1.0) if self.store.check(key) else None
        return bytes(self.store.get(key)) if self.store.check([key]) else None


def edge_totals(comm) -> dict:
    """{(peer, direction, transport): [bytes, seconds]} of `comm`, summed over its transports."""
    totals = {}
    for e in comm.edge_traffic():
        t = totals.setdefault((e["peer"], e["direction"], e["transport"]), [0, 0.0])
        t[0] += e["bytes"]
        t[1] += e["seconds"]
    return totals


class _Watch:
    def __init__(self, comm, store, rank: int, world: int, interval: float):
        store = root_store(store)
        if isinstance(store, _core.TcpStore) and store.address:
            # A connection of its own (the communicator's may be busy), which
            # gives up quickly once the store's host (rank 0) has exited.
            host, _, port = store.address.rpartition(":")
            store = _core.TcpStore(host.strip("[]"), int(port), 2.0)
        self._store = _Store(store)
        self._job = job_id()
        self._keys = job_keys(self._job)
        self._interval = interval
        settings = _core.settings()
        self._judge = _health.Judge(float(settings["straggler_ms"]), float(settings["slow_link_ratio"]))
        self._lock = threading.Lock()
        self._comms = []          # weak references to the watched _core.Communicators
        self._world_comm = None   # the newest that spans the job (a shrink or grow makes another)
        self._rank, self._world = rank, world
        self.add(comm, rank, world)
        self._announced = set()   # ids of communicators whose failure the job was told of
        self._stop = threading.Event()
        self._seen_dumps: Optional[int] = None
        self._host = socket.gethostname()
        self._edge_window = _health.EdgeWindow(time.monotonic())
        self._errors_said = set()  # kinds of error this thread met, each said once (INFO)
        self._thread = threading.Thread(target=self._run, name="rcoll-watch", daemon=True)
        self._thread.start()

    def add(self, comm, rank: int, world: int) -> None:
        """`comm` spans the job when it has `world` ranks: its edges are the
        ones published, and `rank` is this process's rank from now on."""
        with self._lock:
            self._comms.append(weakref.ref(comm))
            if comm.size == world:
                self._world_comm = weakref.ref(comm)
                self._rank, self._world = rank, world

    def watching(self) -> bool:
        with self._lock:
            return any(ref() is not None for ref in self._comms)

    def world_comm(self):
        with self._lock:
            return (self._world_comm() if self._world_comm else None), self._rank

    def stop(self) -> None:
        self._stop.set()
        _core.wake_watch()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(5.0, 2 * self._interval))

    def _run(self) -> None:
        try:
            if self._rank == 0:
                self._store.set(self._keys["world"], str(self._world))
                self._store.set(JOB_KEY, self._job)
            self._seen_dumps = self._store.add(self._keys["dumps"], 0)
        except Exception:  # the store is gone (rank 0's process exited): nothing to watch
            return
        failures = 0
        while True:
            woken = _core.watch_wakes()  # before the stop check: a stop() after it ends the wait below at once
            final = self._stop.is_set()
            try:
                self._round(final)
            except Exception as e:  # the store went away, or a bug: the rounds go on, the job too
                self._said(e)
            if final or not self.watching():  # stopped, or its communicators are gone
                return
            # Woken at once by a failure here (the job hears of it before this
            # rank's process can exit), else every interval; a last round at stop.
            failures = _core.wait_for_failure(failures, self._interval, woken)

    def _said(self, error: Exception) -> None:
        kind = f"{type(error).__name__}: {str(error)[:200]}"
        if kind not in self._errors_said:
            self._errors_said.add(kind)
            _core.log("INFO", f"the job's watch round failed: {kind}")

    def _round(self, final: bool = False) -> None:
        errors = []
        with self._lock:
            comms = [ref() for ref in self._comms]
        for comm in comms:
            message = comm.poison_message() if comm is not None else ""
            if message:
                errors.append(message)
                if id(comm) not in self._announced:
                    self._announced.add(id(comm))
                    self._seen_dumps = self._store.add(self._keys["dumps"], 1)  # dumped here by the core already
        if final:  # at exit: only a failure the job has not heard of yet
            return
        dumps = self._store.add(self._keys["dumps"], 0)
        if self._seen_dumps is not None and dumps > self._seen_dumps:
            self._seen_dumps = dumps
            _core.dump_trace("", "another rank of the job failed (its communicator's failure was announced "
                                 "on the store)")
        comm, rank = self.world_comm()
        self._publish(errors, comm, rank)
        if rank == 0:
            self._judge_job()
        else:
            raw = self._store.get(self._keys["health"])
            if raw:
                _set_health(json.loads(raw))

    def _publish(self, errors, comm, rank: int) -> None:
        status = _core.trace_status()
        names = status["groups"]
        arrivals = {}
        for group, seq, wait_ms, away_ms in status.pop("arrivals"):
            arrivals.setdefault(names[group], []).append([seq, round(wait_ms, 3),
                                                          None if away_ms is None else round(away_ms, 3)])
        edges = self._edge_window.update(edge_totals(comm), time.monotonic()) if comm is not None else []
        status.update(rank=rank, host=self._host, pid=os.getpid(), time=time.time(),
                      interval=self._interval, errors=errors[-3:], job=self._job,
                      attempt=os.environ.get("TORCHELASTIC_RESTART_COUNT", ""), arrivals=arrivals, edges=edges)
        self._store.set(self._keys["status"] + str(rank), json.dumps(status))

    def _judge_job(self) -> None:
        """Rank 0: the job's health from every rank's status; a WARN per finding."""
        statuses = {}
        for rank in range(self._world):
            try:
                raw = self._store.get(self._keys["status"] + str(rank))
            except Exception as e:  # one slow answer costs that rank's status this round, not the judgement
                self._said(e)
                continue
            if raw:
                statuses[rank] = json.loads(raw)
        health, warnings = self._judge.round(statuses, time.monotonic())
        health["time"] = time.time()
        self._store.set(self._keys["health"], json.dumps(health))
        _set_health(health)
        for text in warnings:
            _core.log("WARN", text)


_HEALTH: dict = {}


def _set_health(health: dict) -> None:
    global _HEALTH
    _HEALTH = health


def health() -> dict:
    """The job's latest health as rank 0 judged it ({} before its first round)."""
    return _HEALTH


def edges() -> list:
    """This process's edges in the job's communicator, since it was made:
    src, dst, transport, bytes, seconds and rate (bytes/s)."""
    w = _WATCH
    comm, me = w.world_comm() if w is not None else (None, 0)
    if comm is None:
        return []
    mine = [{"peer": peer, "direction": direction, "transport": transport, "bytes": total, "seconds": seconds}
            for (peer, direction, transport), (total, seconds) in edge_totals(comm).items()]
    return _health.edge_rates({me: {"edges": mine}})


_WATCH: Optional[_Watch] = None
_WATCH_LOCK = threading.Lock()


def watch(comm, store, rank: int, world: int) -> None:
    """Watches `comm` (a _core.Communicator). The first call of a process
    starts the rounds on `store` as global rank `rank` of `world`; later
    communicators are watched for failures on the same: torch's sub-groups,
    and the communicators a shrink or grow makes (which span the job: their
    edges are published from then on, under the rank they give)."""
    global _WATCH
    if _WATCH is None:
        from . import _stats

        try:
            _stats.start(rank, comm.topology["local_rank"][comm.rank])
        except OSError:  # the metrics port is taken: the job goes on without it
            pass
    interval = float(_core.settings()["watch_interval"])
    if interval <= 0:
        return
    with _WATCH_LOCK:
        if _WATCH is not None and not _WATCH.watching():  # the job it watched is over here: a new one
            _WATCH.stop()
            _WATCH = None
        if _WATCH is None:
            try:
                _WATCH = _Watch(comm, store, rank, world, interval)
            except Exception:
                pass
            return
        _WATCH.add(comm, rank, world)


def _stop() -> None:
    with _WATCH_LOCK:
        if _WATCH is not None:
            _WATCH.stop()


atexit.register(_stop)
