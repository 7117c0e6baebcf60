"""The process's rounds with the job's rendezvous store (RCOLL_WATCH_INTERVAL):
what lets an operator see a job from outside (docs/operations.md).

Every round, one thread of each process
  * tells the job when one of its communicators failed (one add on a counter,
    once per failure): the failing rank has dumped its flight recorder
    already (the core does, at the failure);
  * dumps its own flight recorder (RCOLL_TRACE_DIR set) when that counter
    moved, so a rank that is not in any rcoll op (it skipped one, or is stuck
    elsewhere) dumps too, and torch's analyzer gets every rank's view;
  * publishes its status, one small JSON value under ``rcoll/status/<rank>``:
    host, pid, its pending ops (the core's flight recorder) and last error,
    which ``python -m rcoll status`` reads.

The keys live on the job's root store (under torch's prefixes, the store they
wrap), so one address finds them. The thread is stopped and joined at exit,
before the interpreter finalizes (a thread inside a store call then would
abort the process).
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

from . import _core

DUMPS_KEY = "rcoll/trace/dumps"  # a counter: a failure anywhere in the job adds one
STATUS_KEY = "rcoll/status/"     # + global rank
WORLD_KEY = "rcoll/status/world"


def root_store(store):
    """The store under torch's PrefixStores, or `store` itself."""
    while hasattr(store, "underlying_store"):
        store = store.underlying_store
    return store


class _Store:
    """set / add / check over rcoll's TcpStore or a torch.distributed.Store."""

    def __init__(self, store):
        self.store = store
        self._rcoll = isinstance(store, _core.TcpStore)

    def set(self, key: str, value: str) -> None:
        self.store.set(key, value.encode() if self._rcoll else value)

    def add(self, key: str, delta: int) -> int:
        return int(self.store.add(key, delta))


class _Watch:
    def __init__(self, store, rank: int, world: int, interval: float):
        store = root_store(store)
        if isinstance(store, _core.TcpStore) and store.address:
            # A connection of its own (the communicator's may be busy), which
            # gives up quickly once the store's host (rank 0) has exited.
            host, _, port = store.address.rpartition(":")
            store = _core.TcpStore(host.strip("[]"), int(port), 2.0)
        self._store = _Store(store)
        self._rank = rank
        self._world = world
        self._interval = interval
        self._comms = []          # weak references to the watched _core.Communicators
        self._announced = set()   # ids of communicators whose failure the job was told of
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._seen_dumps: Optional[int] = None
        self._host = socket.gethostname()
        self._thread = threading.Thread(target=self._run, name="rcoll-watch", daemon=True)
        self._thread.start()

    def add(self, comm) -> None:
        with self._lock:
            self._comms.append(weakref.ref(comm))

    def watching(self) -> bool:
        with self._lock:
            return any(ref() is not None for ref in self._comms)

    def stop(self) -> None:
        self._stop.set()
        _core.wake_watch()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(5.0, 2 * self._interval))

    def _run(self) -> None:
        try:
            if self._rank == 0:
                self._store.set(WORLD_KEY, str(self._world))
            self._seen_dumps = self._store.add(DUMPS_KEY, 0)
        except Exception:  # the store is gone (rank 0's process exited): nothing to watch
            return
        failures = 0
        while True:
            final = self._stop.is_set()
            try:
                self._round(final)
            except Exception:
                pass
            if final:
                return
            # Woken at once by a failure here (the job hears of it before this
            # rank's process can exit), else every interval; a last round at stop.
            failures = _core.wait_for_failure(failures, self._interval)

    def _round(self, final: bool = False) -> None:
        errors = []
        with self._lock:
            self._comms = [ref for ref in self._comms if ref() is not None]
            comms = [ref() for ref in self._comms]
        for comm in comms:
            message = comm.poison_message()
            if message:
                errors.append(message)
                if id(comm) not in self._announced:
                    self._announced.add(id(comm))
                    self._seen_dumps = self._store.add(DUMPS_KEY, 1)  # dumped here by the core already
        if final:  # at exit: only a failure the job has not heard of yet
            return
        dumps = self._store.add(DUMPS_KEY, 0)
        if self._seen_dumps is not None and dumps > self._seen_dumps:
            self._seen_dumps = dumps
            _core.dump_trace("", "another rank of the job failed (its communicator's failure was announced "
                                 "on the store)")
        self._publish(errors)

    def _publish(self, errors) -> None:
        status = _core.trace_status()
        status.update(rank=self._rank, host=self._host, pid=os.getpid(), time=time.time(),
                      interval=self._interval, errors=errors[-3:],
                      attempt=os.environ.get("TORCHELASTIC_RESTART_COUNT", ""))
        self._store.set(STATUS_KEY + str(self._rank), json.dumps(status))


_WATCH: Optional[_Watch] = None
_WATCH_LOCK = threading.Lock()


def watch(comm, store, rank: int, world: int) -> None:
    """Watches `comm` (a _core.Communicator). The first call of a process
    starts the rounds on `store` as global rank `rank` of `world`; later
    communicators (torch sub-groups) are watched for failures on the same."""
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
                _WATCH = _Watch(store, rank, world, interval)
            except Exception:
                return
        _WATCH.add(comm)


def _stop() -> None:
    with _WATCH_LOCK:
        if _WATCH is not None:
            _WATCH.stop()


atexit.register(_stop)
