"""pytest-benchmark microbenchmarks of rcoll's collectives, world 2, float32.

Run them (they are not part of the test suite, whose testpaths is tests/):

    PYTHONPATH=python python3 -m pytest bench/ --benchmark-only -q
    PYTHONPATH=python python3 -m pytest bench/ --benchmark-only --benchmark-json=/tmp/micro.json

Sizes follow nccl-tests: 8 B, 4 KiB, 1 MiB and 16 MiB are the per-rank buffer of
allreduce and broadcast, the gathered output of allgather and the input of
reduce_scatter. allreduce runs out of place (out=), so every call does the same work;
broadcast's root is rank 1, so the timed rank 0 is a receiver.

How the two ranks stay in step: the pytest process is rank 0 and times the op with
benchmark.pedantic(rounds, iterations, warmup_rounds), which calls it
(warmup_rounds + rounds) * iterations times, plus once more when iterations > 1
(pytest-benchmark's extra call for the return value). Rank 1 is one helper process
per module (multiprocessing "spawn"), told through a queue to run the same op that
many times before the benchmark starts. Should pytest-benchmark call the op more
often than planned (--benchmark-cprofile, a future version), each extra call first
sends the peer a command for one more; should it call it less often
(--benchmark-disable), rank 0 makes up the difference afterwards. So the ranks can
never wait on each other forever; on top of that every op has a timeout
(OP_TIMEOUT), rendezvous is bounded, and a peer that fails is replaced before the
next test. After each benchmark both ranks' last results are checked.
"""
from __future__ import annotations

import multiprocessing as mp
import os
import queue
import sys
import threading
import time

import pytest

pytest.importorskip("pytest_benchmark", reason="pip install pytest-benchmark")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # the peer module, here and in spawned peers
import _microbench_peer as peer_mod  # noqa: E402

try:
    import pytest_timeout  # noqa: F401
    pytestmark = [pytest.mark.timeout(300)]
except ImportError:
    pytestmark = []

OP_TIMEOUT = 60.0        # s, one collective (rcoll raises TimeoutError after it)
CONNECT_TIMEOUT = 60.0   # s, rendezvous of the two ranks
REPLY_TIMEOUT = 120.0    # s, for the peer to report a batch done

OPS = ("allreduce", "allgather", "broadcast", "reduce_scatter")
# nbytes -> (rounds, iterations, warmup_rounds)
SIZES = {
    8: (30, 50, 2),
    4 << 10: (30, 50, 2),
    1 << 20: (10, 5, 1),
    16 << 20: (5, 1, 1),
}


def _label(nbytes):
    for unit, div in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= div:
            return f"{nbytes // div}{unit}"
    return f"{nbytes}B"


class PeerPair:
    """This process as rank 0 and a spawned rank-1 process that follows its commands."""

    def __init__(self):
        self.proc = None
        self.comm = None
        self.broken = None  # why the pair cannot be used any more

    def start(self):
        import rcoll
        from rcoll.spawn import free_port
        ctx = mp.get_context("spawn")
        self.commands, self.replies = ctx.Queue(), ctx.Queue()
        port = free_port()
        env = {k: v for k, v in os.environ.items() if k.startswith("RCOLL_")}
        env.setdefault("RCOLL_CONNECT_TIMEOUT", str(int(CONNECT_TIMEOUT)))
        self.proc = ctx.Process(target=peer_mod.peer_main, daemon=True,
                                args=(port, self.commands, self.replies, OP_TIMEOUT, 600.0, env))
        self.proc.start()
        # Rendezvous in a thread, so that a peer that dies early fails this at once.
        box = {}

        def connect():
            try:
                box["comm"] = rcoll.init(rank=0, world_size=peer_mod.WORLD, master_addr="127.0.0.1",
                                         master_port=port, timeout=OP_TIMEOUT)
            except BaseException as exc:
                box["error"] = exc

        old = os.environ.get("RCOLL_CONNECT_TIMEOUT")
        os.environ["RCOLL_CONNECT_TIMEOUT"] = env["RCOLL_CONNECT_TIMEOUT"]
        try:
            t = threading.Thread(target=connect, daemon=True)
            t.start()
            deadline = time.monotonic() + CONNECT_TIMEOUT + 10
            while t.is_alive():
                t.join(timeout=0.2)
                if t.is_alive() and not self.proc.is_alive():
                    self._drain_error()
                    raise RuntimeError(f"the rank-1 peer exited (code {self.proc.exitcode}) before connecting: "
                                       f"{self._peer_error or 'no message'}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"rendezvous with the rank-1 peer took over {CONNECT_TIMEOUT} s")
        finally:
            if old is None:
                os.environ.pop("RCOLL_CONNECT_TIMEOUT", None)
            else:
                os.environ["RCOLL_CONNECT_TIMEOUT"] = old
        if "error" in box:
            raise RuntimeError(f"rank 0 could not connect: {box['error']}") from box["error"]
        self.comm = box["comm"]
        self._expect("ready")
        self.outstanding = 0
        self.broken = None

    _peer_error = None

    def _drain_error(self):
        try:
            while True:
                msg = self.replies.get(timeout=0.5)
                if msg[0] == "error":
                    self._peer_error = msg[1]
        except queue.Empty:
            pass

    def _expect(self, kind):
        deadline = time.monotonic() + REPLY_TIMEOUT
        while True:
            try:
                msg = self.replies.get(timeout=0.5)
            except queue.Empty:
                if not self.proc.is_alive():
                    raise RuntimeError(f"the rank-1 peer died (exit code {self.proc.exitcode})") from None
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the rank-1 peer did not answer within {REPLY_TIMEOUT} s") from None
                continue
            if msg[0] == "error":
                raise RuntimeError(msg[1])
            if msg[0] != kind:
                raise RuntimeError(f"the rank-1 peer answered {msg!r}, expected {kind!r}")
            return msg

    def send(self, op, nbytes, count):
        self.commands.put(("run", op, nbytes, count))
        self.outstanding += 1

    def wait_all(self):
        """Waits for every outstanding batch; returns the peer's #wrong of its last result."""
        wrong = 0
        while self.outstanding:
            wrong = self._expect("done")[2]
            self.outstanding -= 1
        return wrong

    def stop(self):
        if self.proc is None:
            return
        try:
            if self.broken is None:
                self.commands.put(("stop",))
            if self.comm is not None:
                if self.broken is None:
                    self.comm.shutdown()
                else:
                    self.comm.abort(f"benchmark failed: {self.broken}")
        except Exception:
            pass
        self.proc.join(timeout=30)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(timeout=5)
        self.proc, self.comm = None, None

    def ensure(self):
        """A working pair: (re)started when the previous test left it broken."""
        if self.proc is None or self.broken is not None:
            self.stop()
            try:
                self.start()
            except BaseException as exc:
                self.broken = f"start failed: {exc}"
                raise
        return self


@pytest.fixture(scope="module")
def pair():
    p = PeerPair()
    try:
        yield p
    finally:
        p.stop()


@pytest.mark.parametrize("nbytes", list(SIZES), ids=_label)
@pytest.mark.parametrize("op", OPS)
def test_collective(benchmark, pair, op, nbytes):
    pair.ensure()
    rounds, iterations, warmup_rounds = SIZES[nbytes]
    call, check = peer_mod.make_op(pair.comm, op, nbytes)
    # the calls benchmark.pedantic makes, see the module docstring
    planned = 1 if benchmark.disabled else (warmup_rounds + rounds) * iterations + (1 if iterations > 1 else 0)
    calls = [0]

    def target():
        if calls[0] >= planned:
            pair.send(op, nbytes, 1)  # more calls than planned: the peer follows
        calls[0] += 1
        call()

    benchmark.group = op
    benchmark.extra_info.update(bytes=nbytes, world=peer_mod.WORLD, dtype="float32", planned_calls=planned)
    try:
        pair.send(op, nbytes, planned)
        benchmark.pedantic(target, rounds=rounds, iterations=iterations, warmup_rounds=warmup_rounds)
        while calls[0] < planned:  # fewer calls than planned: finish the peer's batch
            calls[0] += 1
            call()
        peer_wrong = pair.wait_all()
    except BaseException as exc:
        pair.broken = f"{type(exc).__name__}: {exc}"
        raise
    benchmark.extra_info["calls"] = calls[0]
    wrong = check()
    assert wrong == 0, f"rank 0: {wrong} wrong elements in the last {op} result"
    assert peer_wrong == 0, f"rank 1: {peer_wrong} wrong elements in the last {op} result"
