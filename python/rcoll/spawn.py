"""Run a function on N local ranks, each in its own process (demo, tests, benchmarks).

Not a launcher for real jobs (use torchrun, srun or mpirun): it starts processes
on this host only, with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT set as
torchrun would, and returns every rank's return value. It is bounded in time: if
any rank fails or the deadline passes, all ranks are killed and an error says
which rank did what.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import socket
import sys
import time
import traceback
from multiprocessing import reduction


def free_port() -> int:
    """An ephemeral port that was free a moment ago on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RankFailed(RuntimeError):
    """One or more ranks raised, died or did not finish in time."""


def _child(fn, rank, world_size, port, env, args, results, parent):
    # A rank forked from the server starts with the server's environment, working
    # directory and standard streams: take the caller's, as of run().
    environ, cwd, streams = parent
    for target, fd in zip((1, 2), streams):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(environ)
    # A list value gives each rank its own setting (cycled): {"RCOLL_IB_HCA": ["rxe0", "rxe1"]}.
    os.environ.update({k: str(v[rank % len(v)] if isinstance(v, (list, tuple)) else v) for k, v in env.items()})
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        value = fn(rank, world_size, *args)
        results.put((rank, True, value))
    except BaseException as exc:  # reported to the parent, which raises
        results.put((rank, False, f"{type(exc).__module__}.{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))


def _received_fd(duplicate):
    return duplicate.detach()


class _InheritedFd:
    """A file descriptor of the caller that each rank receives a copy of: the
    copy is made while the process is started (multiprocessing passes it
    along), and arrives in the rank as a plain descriptor number."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        return _received_fd, (reduction.DupFd(self.fd),)


# What the fork server imports before it forks any rank (read when it starts:
# the first run() of a process). A module that cannot be imported is left out.
# Importing torch there is safe (the import leaves CUDA uninitialised, so the
# forked ranks may use it) and saves each rank that uses torch ~1.6 s of CPU;
# the tests add it.
PRELOAD = ("numpy", "rcoll")


def _context():
    """Ranks fork from a server process that has imported PRELOAD once
    (multiprocessing's forkserver): a fresh interpreter per rank costs ~0.14 s
    of CPU, which the tests pay for thousands of ranks. The server is itself a
    fresh interpreter, so no rank inherits the caller's threads or CUDA state.
    Where there is no fork server, a fresh interpreter per rank."""
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))
    return ctx


def run(fn, world_size: int, *args, timeout: float = 120.0, env=None, allow_failures: bool = False,
        port: int = 0, grace: float = 10.0):
    """Calls fn(rank, world_size, *args) in `world_size` processes and returns the list of results.

    `fn` must be importable (a module-level function). With allow_failures=True a
    rank's exception is returned as an ("error", text) tuple instead of raising.
    `port` is the rendezvous port (default: a free one). Once a rank has failed,
    the others get `grace` seconds to report (their errors usually follow from
    it) before they are killed; once all reported, each gets `grace` seconds to
    exit (its exit handlers flush its files) before it is killed.
    """
    ctx = _context()
    results = ctx.Queue()
    port = port or free_port()
    sys.stdout.flush()
    sys.stderr.flush()
    parent = (dict(os.environ), os.getcwd(), [_InheritedFd(fd) for fd in (1, 2)])
    procs = [ctx.Process(target=_child, args=(fn, r, world_size, port, env or {}, args, results, parent), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    outcome = {}
    deadline = time.monotonic() + timeout
    first_failure = None
    try:
        while len(outcome) < world_size:
            now = time.monotonic()
            if first_failure is None and any(not ok for ok, _ in outcome.values()):
                first_failure = now
                deadline = min(deadline, now + grace)
            left = deadline - now
            if left <= 0:
                missing = sorted(set(range(world_size)) - set(outcome))
                if first_failure is None:
                    raise RankFailed(f"ranks {missing} did not finish within {timeout} s")
                for r in missing:
                    outcome[r] = (False, f"rank {r} was killed {grace} s after another rank failed")
                break
            try:
                rank, ok, value = results.get(timeout=min(left, 0.5))
                outcome[rank] = (ok, value)
                continue
            except queue.Empty:
                pass
            for r, p in enumerate(procs):
                # A rank that died without reporting (killed, crashed) cannot be waited for.
                if r not in outcome and not p.is_alive() and p.exitcode not in (0, None):
                    try:  # it may have reported just before exiting
                        rank, ok, value = results.get(timeout=0.2)
                        outcome[rank] = (ok, value)
                    except queue.Empty:
                        outcome[r] = (False, f"rank {r} died with exit code {p.exitcode}")
    finally:
        # Ranks that reported still run their exit (atexit handlers close the
        # timeline's file, stdio flushes): a loaded machine may take seconds
        # there, and a rank killed in it leaves its files cut short. So every
        # rank gets `grace` seconds to exit once all reported; none when a
        # rank is missing (it is killed, as those that did not report).
        exit_by = time.monotonic() + (grace if len(outcome) == world_size else 0)
        for p in procs:
            p.join(timeout=max(0.0, exit_by - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    failures = {r: v for r, (ok, v) in outcome.items() if not ok}
    if failures and not allow_failures:
        text = "\n".join(f"--- rank {r}:\n{v}" for r, v in sorted(failures.items()))
        raise RankFailed(f"{len(failures)} of {world_size} ranks failed:\n{text}")
    return [outcome[r][1] if outcome[r][0] else ("error", outcome[r][1]) for r in range(world_size)]
