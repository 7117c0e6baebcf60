"""Run a test body on N ranks as threads of this process (the way Gloo's tests run).

The core releases the GIL whenever it blocks or moves data, so ranks as threads
run the collectives exactly as ranks as processes do, over the same transports
(shared memory between threads maps the same segments a second process would
map; TCP goes through the loopback all the same), without starting N
interpreters and importing numpy N times per test. What needs processes keeps
them (rcoll.spawn): kill -9, per-rank environments, torch, exit behaviour.

Same contract as rcoll.spawn.run: fn(rank, world, *args) is called on every
rank and the list of return values comes back; a rank that raises fails the
call with every rank's traceback, and the whole call is bounded in time.
Bodies create their communicator with rcoll.init(rank, world): the rendezvous
address comes from MASTER_ADDR/MASTER_PORT, which this sets for the call with
the caller's `env`. A list value gives each rank its own (cycled), as with
rcoll.spawn: for RCOLL_* variables it reaches the rank's communicators as their
`settings` (per-communicator values over the environment); other per-rank
variables need processes.
"""
from __future__ import annotations

import os
import threading
import time
import traceback

from rcoll import communicator
from rcoll.spawn import RankFailed
from support.ports import free_port

_this_rank = threading.local()  # .settings: the per-rank RCOLL_* values of the thread's rank


def _with_rank_settings(init):
    def __init__(self, *args, settings=None, **kwargs):
        own = getattr(_this_rank, "settings", None)
        init(self, *args, settings={**own, **(settings or {})} if own else settings, **kwargs)
    __init__.rank_threads = True
    return __init__


if not getattr(communicator.Communicator.__init__, "rank_threads", False):
    communicator.Communicator.__init__ = _with_rank_settings(communicator.Communicator.__init__)


def run(fn, world_size: int, *args, timeout: float = 120.0, env=None, allow_failures: bool = False):
    env = dict(env or {})
    per_rank = {name: value for name, value in env.items() if isinstance(value, (list, tuple))}
    for name in per_rank:
        if not name.startswith("RCOLL_"):
            raise ValueError(f"{name}: per-rank values of other variables need ranks as processes (rcoll.spawn.run)")
        del env[name]
    # Every op is bounded by the call's own deadline, so a hung collective ends
    # as a timeout error on its rank (a thread cannot be killed) and the call fails.
    env.setdefault("RCOLL_TIMEOUT", str(max(1, int(timeout))))
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(world_size))
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update({k: str(v) for k, v in env.items()})
    outcome = {}

    def body(rank):
        _this_rank.settings = {name: str(values[rank % len(values)]) for name, values in per_rank.items()}
        try:
            outcome[rank] = (True, fn(rank, world_size, *args))
        except BaseException as exc:  # reported below, with the rank
            outcome[rank] = (False, f"{type(exc).__module__}.{type(exc).__name__}: {exc}\n{traceback.format_exc()}")

    threads = [threading.Thread(target=body, args=(r,), name=f"rank{r}", daemon=True) for r in range(world_size)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + timeout + 5  # the ops' own timeout fires first
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    missing = [r for r, t in enumerate(threads) if t.is_alive()]
    if missing:
        raise RankFailed(f"ranks {missing} did not finish within {timeout} s")
    failures = {r: v for r, (ok, v) in outcome.items() if not ok}
    if failures and not allow_failures:
        text = "\n".join(f"--- rank {r}:\n{v}" for r, v in sorted(failures.items()))
        raise RankFailed(f"{len(failures)} of {world_size} ranks failed:\n{text}")
    return [outcome[r][1] if outcome[r][0] else ("error", outcome[r][1]) for r in range(world_size)]
