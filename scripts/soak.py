#!/usr/bin/env python3
"""Soak run of the numpy API: a long random mix of every collective and
point-to-point op, every result checked exactly against numpy, with RSS and
open file descriptors watched for leaks.

    python scripts/soak.py --world 4 --small-ops 100000 --large-ops 1000 --seed 1 [--json out.json]

Every rank draws the same sequence of ops from the seed (kind, dtype, reduce op,
size, root, counts, peers), so the ranks agree on what to call; each rank
decides for itself (from seed and rank) which calls are async, how many stay in
flight and in which order it waits for them. "Small" ops move 0..4096 elements,
"large" ones 256 KiB..8 MiB (log-uniform; the size of the op's largest buffer).
Inputs come from tests/support/reference.py, so every rank regenerates every other
rank's input and checks its own result bit for bit without extra communication.

RSS (VmRSS) and the open descriptors are measured after init and a warm-up
(every dtype x reduce op, every kind at the largest size, a few hundred random
ops), and again at the end. The run fails (exit 1) if any result is wrong, if
any rank raised, if RSS grew by more than --rss-slack (10%) + --rss-slack-mib
(16 MiB), or if the descriptor count changed.

glibc's malloc raises its mmap threshold after the first large free, and then
keeps freed large blocks in the heap, which makes RSS at the end depend on
fragmentation rather than on what is still allocated. Each rank therefore fixes
the threshold at 256 KiB (mallopt) so that freed large arrays go back to the
system; --no-mallopt keeps glibc's default behaviour.
"""
from __future__ import annotations

import argparse
import ctypes
import gc
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests"))  # support/reference.py: inputs and exact references
try:
    import rcoll  # noqa: F401
except ImportError:  # running from a source checkout without PYTHONPATH
    sys.path.insert(0, os.path.join(ROOT, "python"))

import numpy as np  # noqa: E402
from support.reference import DTYPES, OPS, differences, make_input, reduce_reference, same, supported  # noqa: E402

import rcoll  # noqa: E402,F811
from rcoll import spawn  # noqa: E402

SMALL_MAX = 4096                      # elements
LARGE_MIN, LARGE_MAX = 256 << 10, 8 << 20  # bytes

# Relative frequency of each kind in the random sequence.
KINDS = {
    "allreduce": 4, "allgather": 1, "reduce_scatter": 1, "broadcast": 1, "reduce": 1, "gather": 1,
    "scatter": 1, "alltoall": 1, "barrier": 0.5, "p2p_shift": 1, "p2p_pair": 1,
}
COMBOS = [(dt, op) for dt in DTYPES for op in OPS if supported(dt, op)]


# --------------------------------------------------------------------------------------------
# process figures


def _status(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def rss_kib():
    return _status("VmRSS")


def open_fds():
    return len(os.listdir("/proc/self/fd"))


_TCP_STATES = {"01": "ESTABLISHED", "02": "SYN_SENT", "03": "SYN_RECV", "04": "FIN_WAIT1", "05": "FIN_WAIT2",
               "06": "TIME_WAIT", "07": "CLOSE", "08": "CLOSE_WAIT", "09": "LAST_ACK", "0A": "LISTEN",
               "0B": "CLOSING"}


def _tcp_sockets():
    """{inode: "local -> remote STATE"} for this network namespace's TCP sockets (IPv4)."""
    sockets = {}
    try:
        with open("/proc/net/tcp") as f:
            next(f)
            for line in f:
                fields = line.split()
                local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]

                def addr(text):
                    host, port = text.split(":")
                    return f"{'.'.join(str(int(host[i:i + 2], 16)) for i in (6, 4, 2, 0))}:{int(port, 16)}"
                sockets[inode] = f"{addr(local)} -> {addr(remote)} {_TCP_STATES.get(state, state)}"
    except OSError:
        pass
    return sockets


def fd_targets():
    """{fd: what it points at} ("socket:[123] 127.0.0.1:5 -> ... ESTABLISHED", "pipe:[45]", a path...)."""
    targets = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            targets[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # the descriptor listdir itself used, closed since
            pass
    if any(t.startswith("socket:") for t in targets.values()):
        tcp = _tcp_sockets()
        for fd, t in targets.items():
            if t.startswith("socket:["):
                inode = t[len("socket:["):-1]
                if inode in tcp:
                    targets[fd] = f"{t} {tcp[inode]}"
    return targets


def snapshot():
    gc.collect()
    return {"rss_kib": rss_kib(), "fds": open_fds(), "threads": _status("Threads"), "hwm_kib": _status("VmHWM"),
            "fd_targets": fd_targets()}


def fix_mmap_threshold(nbytes=256 << 10):
    """mallopt(M_MMAP_THRESHOLD): large blocks always mmapped, returned to the system when freed."""
    try:
        libc = ctypes.CDLL("libc.so.6")
        return bool(libc.mallopt(-3, nbytes))  # M_MMAP_THRESHOLD
    except (OSError, AttributeError):
        return False


# --------------------------------------------------------------------------------------------
# the op sequence (the same on every rank)


class Op:
    __slots__ = ("index", "kind", "size_class", "dtype", "op", "n", "root", "counts", "peer", "tag", "variant",
                 "seed")

    def __init__(self, **kw):
        for k in self.__slots__:
            setattr(self, k, kw.get(k))

    def describe(self):
        parts = [f"op #{self.index} {self.kind}", self.size_class, str(self.dtype)]
        if self.op:
            parts.append(self.op)
        parts.append(f"n={self.n}")
        if self.root is not None:
            parts.append(f"root={self.root}")
        if self.peer is not None:
            parts.append(f"peer={self.peer}")
        if self.variant:
            parts.append(self.variant)
        return " ".join(parts)


def _size(rng, size_class, itemsize):
    if size_class == "small":
        return int(rng.integers(0, SMALL_MAX + 1))
    nbytes = math.exp(rng.uniform(math.log(LARGE_MIN), math.log(LARGE_MAX)))
    return max(1, int(nbytes) // itemsize)


def draw_op(rng, index, seed, world, size_class, kind=None, combo=None, n=None):
    """One op of the shared sequence. Only `rng` (shared) decides anything here."""
    names = list(KINDS)
    weights = np.array([KINDS[k] for k in names], dtype=np.float64)
    if size_class == "large":
        weights[names.index("barrier")] = 0.0
    if kind is None:
        kind = names[int(rng.choice(len(names), p=weights / weights.sum()))]
    op = None
    if kind in ("allreduce", "reduce_scatter", "reduce"):
        dtype, op = combo or COMBOS[int(rng.integers(len(COMBOS)))]
    else:
        dtype = DTYPES[int(rng.integers(len(DTYPES)))]
    if n is None:
        n = _size(rng, size_class, dtype.itemsize)
    d = Op(index=index, kind=kind, size_class=size_class, dtype=dtype, op=op, n=n,
           seed=(seed << 32) | index, variant=str(rng.choice(["plain", "out", "inplace"])))
    if kind in ("broadcast", "reduce", "gather", "scatter"):
        d.root = int(rng.integers(world))
    elif kind == "alltoall":
        if rng.random() < 0.3:
            d.variant += "+equal"
        else:
            counts = rng.integers(0, n // world + 1, (world, world))
            counts[rng.random((world, world)) < 0.2] = 0
            d.counts = counts
    elif kind == "p2p_shift":
        d.peer = int(rng.integers(1, world))  # send to rank + k, receive from rank - k
        d.tag = int(rng.integers(4))
    elif kind == "p2p_pair":
        a, b = rng.choice(world, 2, replace=False)
        d.peer = (int(a), int(b))  # a sends first, b receives first
        d.tag = int(rng.integers(4))
    return d


# --------------------------------------------------------------------------------------------
# one rank


def _compare(got, expected):
    got = np.asarray(got)
    if got.shape != expected.shape or got.dtype != expected.dtype:
        return f"result has shape {got.shape} dtype {got.dtype}, expected {expected.shape} {expected.dtype}"
    if same(got, expected):
        return None
    return differences(got, expected)


class Rank:
    def __init__(self, comm, rank, world, cfg):
        self.comm = comm
        self.rank = rank
        self.world = world
        self.cfg = cfg
        self.local = np.random.default_rng([cfg["seed"], 0x5EED, rank])  # this rank's own choices
        self.pending = []
        self.limit = 1
        self.counts = {}
        self.bytes = {"small": 0, "large": 0}
        self.wrong = 0
        self.messages = []
        self.phase = "warmup"
        self.calls = 0

    # -- bookkeeping -------------------------------------------------------------------------
    def _submit(self, d, name, result, is_async, check):
        self.calls += 1
        if is_async:
            self.pending.append((d, name, result, check))
        else:
            self._check(d, name, result, check)

    def _check(self, d, name, result, check):
        error = check(result)
        key = f"{self.phase}:{name}"
        self.counts[key] = self.counts.get(key, 0) + 1
        if error:
            self.wrong += 1
            if len(self.messages) < 20:
                self.messages.append(f"rank {self.rank}: {self.phase} {d.describe()} ({name}): {error}")

    def wait_some(self, everything=False):
        if not self.pending:
            return
        k = len(self.pending) if everything or self.local.random() < 0.5 else int(
            self.local.integers(1, len(self.pending) + 1))
        for _ in range(k):
            d, name, handle, check = self.pending.pop(int(self.local.integers(len(self.pending))))
            self._check(d, name, handle.wait(timeout=self.cfg["op_timeout"] + 30), check)

    def after_op(self):
        if len(self.pending) >= self.limit or self.local.random() < 0.05:
            self.wait_some()
            self.limit = int(self.local.integers(1, self.cfg["max_inflight"] + 1))

    def _async(self):
        return bool(self.local.random() < self.cfg["async_fraction"])

    def _stack(self, d, n, op):
        return np.stack([make_input(d.seed, r, d.dtype, n, op) for r in range(self.world)])

    # -- the ops ----------------------------------------------------------------------------
    def run(self, d):
        self.bytes[d.size_class] += d.n * d.dtype.itemsize
        getattr(self, "_" + d.kind)(d)
        self.after_op()

    def _allreduce(self, d):
        x = make_input(d.seed, self.rank, d.dtype, d.n, d.op)
        if d.variant == "inplace":
            original, out = None, None
            target = x
            result = self.comm.allreduce(x, d.op, async_op=self._async())
        else:
            original, out = x.copy(), np.empty_like(x)
            target = out
            result = self.comm.allreduce(x, d.op, out=out, async_op=self._async())

        def check(got):
            if got is not target:
                return "did not return its output buffer"
            error = _compare(got, reduce_reference(self._stack(d, d.n, d.op), d.dtype, d.op, self.world))
            if not error and original is not None and not same(x, original):
                error = "out-of-place allreduce modified its input"
            return error
        self._submit(d, "allreduce", result, isinstance(result, rcoll.Handle), check)

    def _reduce_scatter(self, d):
        m = d.n // self.world
        x = make_input(d.seed, self.rank, d.dtype, m * self.world, d.op)
        original = x.copy()
        src = x.reshape(self.world, m) if d.variant == "inplace" else x  # (size, m) in: (m,) out
        out = np.empty(m, d.dtype) if d.variant == "out" else None
        result = self.comm.reduce_scatter(src, d.op, out=out, async_op=self._async())

        def check(got):
            if out is not None and got is not out:
                return "did not return out"
            expected = reduce_reference(self._stack(d, m * self.world, d.op), d.dtype, d.op, self.world)
            error = _compare(got, expected[self.rank * m:(self.rank + 1) * m])
            if not error and not same(x, original):
                error = "reduce_scatter modified its input"
            return error
        self._submit(d, "reduce_scatter", result, isinstance(result, rcoll.Handle), check)

    def _allgather(self, d):
        m = d.n // self.world
        x = make_input(d.seed, self.rank, d.dtype, m, "max")
        out = None
        if d.variant == "inplace":
            out = np.empty((self.world, m), d.dtype)
            out[self.rank] = x
            result = self.comm.allgather(out[self.rank], out=out, async_op=self._async())
        else:
            if d.variant == "out":
                out = np.empty((self.world, m), d.dtype)
            result = self.comm.allgather(x, out=out, async_op=self._async())

        def check(got):
            if out is not None and got is not out:
                return "did not return out"
            return _compare(got, self._stack(d, m, "max"))
        self._submit(d, "allgather", result, isinstance(result, rcoll.Handle), check)

    def _broadcast(self, d):
        is_root = self.rank == d.root
        data = make_input(d.seed, d.root, d.dtype, d.n, "max")
        original = None
        if d.variant == "out":
            src = data if is_root else np.zeros(d.n, d.dtype)
            original = src.copy()
            target = out = np.empty(d.n, d.dtype)
        else:
            src = data if is_root else np.zeros(d.n, d.dtype)
            target, out = src, None
        result = self.comm.broadcast(src, d.root, out=out, async_op=self._async())

        def check(got):
            if got is not target:
                return "did not return its output buffer"
            error = _compare(got, make_input(d.seed, d.root, d.dtype, d.n, "max"))
            if not error and original is not None and not same(src, original):
                error = "broadcast with out modified its input"
            return error
        self._submit(d, "broadcast", result, isinstance(result, rcoll.Handle), check)

    def _reduce(self, d):
        is_root = self.rank == d.root
        x = make_input(d.seed, self.rank, d.dtype, d.n, d.op)
        out = np.empty_like(x) if d.variant == "out" else None  # ignored on the other ranks
        original = None if is_root and out is None else x.copy()
        target = (x if out is None else out) if is_root else None
        result = self.comm.reduce(x, d.op, d.root, out=out, async_op=self._async())

        def check(got):
            if got is not target:
                return f"returned {type(got).__name__}, expected {'its output buffer' if is_root else 'None'}"
            if original is not None and not same(x, original):
                return "reduce modified an input it only reads"
            if is_root:
                return _compare(got, reduce_reference(self._stack(d, d.n, d.op), d.dtype, d.op, self.world))
            return None
        self._submit(d, "reduce", result, isinstance(result, rcoll.Handle), check)

    def _gather(self, d):
        is_root = self.rank == d.root
        m = d.n // self.world
        x = make_input(d.seed, self.rank, d.dtype, m, "max")
        out = None
        if is_root and d.variant == "inplace":
            out = np.empty((self.world, m), d.dtype)
            out[self.rank] = x
            result = self.comm.gather(out[self.rank], d.root, out=out, async_op=self._async())
        else:
            if d.variant == "out":
                out = np.empty((self.world, m), d.dtype)
            result = self.comm.gather(x, d.root, out=out, async_op=self._async())

        def check(got):
            if not is_root:
                return None if got is None else f"returned {type(got).__name__} on a rank other than the root"
            if out is not None and got is not out:
                return "did not return out"
            return _compare(got, self._stack(d, m, "max"))
        self._submit(d, "gather", result, isinstance(result, rcoll.Handle), check)

    def _scatter(self, d):
        is_root = self.rank == d.root
        m = d.n // self.world
        full = make_input(d.seed, d.root, d.dtype, m * self.world, "max").reshape(self.world, m) if is_root else None
        if is_root and d.variant == "inplace":
            out = full[self.rank]
        elif not is_root or d.variant == "out":
            out = np.empty(m, d.dtype)
        else:
            out = None  # the root gets a new (m,) array
        result = self.comm.scatter(full, d.root, out=out, async_op=self._async())

        def check(got):
            if out is not None and got is not out:
                return "did not return out"
            whole = make_input(d.seed, d.root, d.dtype, m * self.world, "max")
            error = _compare(got, whole[self.rank * m:(self.rank + 1) * m])
            if not error and is_root and not same(full.ravel(), whole):
                error = "scatter modified the root's input"
            return error
        self._submit(d, "scatter", result, isinstance(result, rcoll.Handle), check)

    def _alltoall(self, d):
        w, r = self.world, self.rank
        if d.counts is None:
            m = d.n // w
            x = make_input(d.seed, r, d.dtype, m * w, "max")
            if d.variant.startswith("inplace"):  # no in-place alltoall: a 2-D (size, m) input instead
                x = x.reshape(w, m)
            out = np.empty_like(x) if d.variant.startswith("out") else None
            original = x.copy()
            result = self.comm.alltoall(x, out=out, async_op=self._async())

            def expected():
                blocks = [make_input(d.seed, j, d.dtype, m * w, "max")[r * m:(r + 1) * m] for j in range(w)]
                return np.concatenate(blocks).reshape(x.shape)
        else:
            c = d.counts
            send_counts, recv_counts = c[r].tolist(), c[:, r].tolist()
            x = make_input(d.seed, r, d.dtype, int(c[r].sum()), "max")
            out = np.empty(int(c[:, r].sum()), d.dtype) if d.variant == "out" else None
            original = x.copy()
            result = self.comm.alltoall(x, out=out, send_counts=send_counts, recv_counts=recv_counts,
                                        async_op=self._async())

            def expected():
                blocks = []
                for j in range(w):
                    start = int(c[j, :r].sum())
                    blocks.append(make_input(d.seed, j, d.dtype, int(c[j].sum()), "max")[start:start + int(c[j, r])])
                return np.concatenate(blocks)

        def check(got):
            if out is not None and got is not out:
                return "did not return out"
            error = _compare(got, expected())
            if not error and not same(x, original):
                error = "alltoall modified its input"
            return error
        self._submit(d, "alltoall", result, isinstance(result, rcoll.Handle), check)

    def _barrier(self, d):
        result = self.comm.barrier(async_op=self._async())
        self._submit(d, "barrier", result, isinstance(result, rcoll.Handle),
                     lambda got: None if got is None else f"returned {got!r}")

    def _send(self, d, dst):
        x = make_input(d.seed, self.rank, d.dtype, d.n, "max")
        original = x.copy()
        result = self.comm.send(x, dst, tag=d.tag, async_op=self._async())

        def check(got):
            if got is not None:
                return f"returned {type(got).__name__}"
            return None if same(x, original) else "send modified its input"
        self._submit(d, "send", result, isinstance(result, rcoll.Handle), check)

    def _recv(self, d, src):
        y = np.zeros(d.n, d.dtype)
        result = self.comm.recv(y, src, tag=d.tag, async_op=self._async())

        def check(got):
            if got is not y:
                return "did not return its buffer"
            return _compare(got, make_input(d.seed, src, d.dtype, d.n, "max"))
        self._submit(d, "recv", result, isinstance(result, rcoll.Handle), check)

    def _p2p_shift(self, d):
        # Every rank sends to rank + k and receives from rank - k. The send is
        # always async: a ring of blocking sends of large messages could wait on
        # each other.
        k = d.peer
        x = make_input(d.seed, self.rank, d.dtype, d.n, "max")
        handle = self.comm.send(x, (self.rank + k) % self.world, tag=d.tag, async_op=True)
        self._submit(d, "send", handle, True, lambda got: None if got is None else f"returned {type(got).__name__}")
        self._recv(d, (self.rank - k) % self.world)

    def _p2p_pair(self, d):
        a, b = d.peer
        if self.rank == a:
            self._send(d, b)
            self._recv(d, b)
        elif self.rank == b:
            self._recv(d, a)
            self._send(d, a)


def _progress(rank_state, t0, done, total, last):
    now = time.monotonic()
    if now - last[0] < rank_state.cfg["progress"]:
        return
    last[0] = now
    elapsed = now - t0
    print(f"[soak] rank {rank_state.rank}: {done}/{total} ops, {done / max(elapsed, 1e-9):.0f} ops/s, "
          f"{rank_state.wrong} wrong, RSS {rss_kib() / 1024:.1f} MiB, {open_fds()} fds, "
          f"{len(rank_state.pending)} in flight, {elapsed:.0f} s", file=sys.stderr, flush=True)


def rank_main(rank, world, cfg):
    """Runs the whole soak on one rank and returns its report (a dict)."""
    mallopt = fix_mmap_threshold() if cfg["mallopt"] else False
    t_init = time.monotonic()
    comm = rcoll.init(timeout=cfg["op_timeout"])
    seed = cfg["seed"]
    state = Rank(comm, rank, world, cfg)

    # Warm-up: every dtype x reduce op, every kind at the largest size, then random
    # ops, so that lazily allocated buffers exist before the first measurement.
    wrng = np.random.default_rng([seed, 0xAA])
    index = 0
    warm = []
    for kind in ("allreduce", "reduce_scatter", "reduce"):
        for combo in COMBOS:
            warm.append(draw_op(wrng, index, seed + 1, world, "small", kind=kind, combo=combo))
            index += 1
    for kind in KINDS:
        warm.append(draw_op(wrng, index, seed + 1, world, "small", kind=kind))
        index += 1
        if kind != "barrier":
            for _ in range(2):
                d = draw_op(wrng, index, seed + 1, world, "large", kind=kind)
                d.n = LARGE_MAX // d.dtype.itemsize
                if d.counts is not None:  # redraw the counts for the largest size
                    d.counts = wrng.integers(d.n // (2 * world), d.n // world + 1, (world, world))
                warm.append(d)
                index += 1
    for _ in range(cfg["warmup"]):
        warm.append(draw_op(wrng, index, seed + 1, world, "large" if wrng.random() < 0.05 else "small"))
        index += 1
    for d in warm:
        state.run(d)
    state.wait_some(everything=True)
    comm.barrier()
    warmup_s = time.monotonic() - t_init
    start = snapshot()
    if rank == 0 or cfg["progress_all"]:
        print(f"[soak] rank {rank}: init and warm-up done ({state.calls} calls, {warmup_s:.1f} s, "
              f"{state.wrong} wrong), RSS {start['rss_kib'] / 1024:.1f} MiB, {start['fds']} fds, "
              f"{start['threads']} threads", file=sys.stderr, flush=True)

    # The soak itself.
    state.phase = "soak"
    rng = np.random.default_rng([seed, 0x50A4])
    small_left, large_left = cfg["small_ops"], cfg["large_ops"]
    total = small_left + large_left
    t0 = time.monotonic()
    last = [t0]
    for i in range(total):
        large = rng.random() * (small_left + large_left) < large_left
        if large:
            large_left -= 1
        else:
            small_left -= 1
        state.run(draw_op(rng, i, seed, world, "large" if large else "small"))
        if rank == 0 or cfg["progress_all"]:
            _progress(state, t0, i + 1, total, last)
    state.wait_some(everything=True)
    comm.barrier()
    elapsed = time.monotonic() - t0
    end = snapshot()
    # No rank closes anything (its communicator, its store connection) before
    # every rank has measured: rank 0's store server would see it go.
    comm.barrier()
    comm.shutdown()

    soak_counts = {k.split(":", 1)[1]: v for k, v in state.counts.items() if k.startswith("soak:")}
    warm_counts = sum(v for k, v in state.counts.items() if k.startswith("warmup:"))
    return {
        "rank": rank, "ops": total, "calls": sum(soak_counts.values()),
        "ops_per_kind": dict(sorted(soak_counts.items())),
        "warmup_calls": warm_counts, "warmup_s": round(warmup_s, 3),
        "wrong": state.wrong, "wrong_examples": state.messages,
        "elapsed_s": round(elapsed, 3), "ops_per_s": round(total / elapsed, 1) if elapsed > 0 else None,
        "bytes_small": state.bytes["small"], "bytes_large": state.bytes["large"],
        "start": start, "end": end, "mallopt": mallopt, "transport": comm.transport,
    }


# --------------------------------------------------------------------------------------------
# driver


def rss_bound_kib(start_kib, slack, slack_mib):
    return int(start_kib * (1 + slack) + slack_mib * 1024)


def evaluate(reports, cfg):
    """The summary and the list of reasons the run failed (empty when it passed)."""
    failures = []
    ranks = []
    for rank, rep in enumerate(reports):
        if isinstance(rep, tuple) and rep and rep[0] == "error":
            failures.append(f"rank {rank} failed: {rep[1].strip().splitlines()[0] if rep[1].strip() else rep[1]}")
            ranks.append({"rank": rank, "error": rep[1]})
            continue
        ranks.append(rep)
        if rep["wrong"]:
            failures.append(f"rank {rank}: {rep['wrong']} wrong results, first: {rep['wrong_examples'][:3]}")
        bound = rss_bound_kib(rep["start"]["rss_kib"], cfg["rss_slack"], cfg["rss_slack_mib"])
        rep["rss_bound_kib"] = bound
        if rep["end"]["rss_kib"] > bound:
            failures.append(f"rank {rank}: RSS grew from {rep['start']['rss_kib']} KiB to {rep['end']['rss_kib']} KiB "
                            f"(bound {bound} KiB = +{cfg['rss_slack']:.0%} + {cfg['rss_slack_mib']} MiB)")
        if rep["end"]["fds"] != rep["start"]["fds"]:
            before, after = rep["start"]["fd_targets"], rep["end"]["fd_targets"]
            closed = {fd: t for fd, t in before.items() if fd not in after}
            opened = {fd: t for fd, t in after.items() if fd not in before}
            failures.append(f"rank {rank}: open file descriptors went from {rep['start']['fds']} to "
                            f"{rep['end']['fds']} (closed {closed}, opened {opened})")
    good = [r for r in ranks if "error" not in r]
    kinds = {}
    for r in good:
        for k, v in r["ops_per_kind"].items():
            kinds[k] = kinds.get(k, 0) + v
    summary = {
        "world": cfg["world"], "seed": cfg["seed"], "ops": cfg["small_ops"] + cfg["large_ops"],
        "small_ops": cfg["small_ops"], "large_ops": cfg["large_ops"],
        "calls_per_kind_all_ranks": dict(sorted(kinds.items())),
        "wrong": sum(r["wrong"] for r in good),
        "elapsed_s": max((r["elapsed_s"] for r in good), default=None),
        "rss_start_mib": [round(r["start"]["rss_kib"] / 1024, 1) for r in good],
        "rss_end_mib": [round(r["end"]["rss_kib"] / 1024, 1) for r in good],
        "fds_start": [r["start"]["fds"] for r in good], "fds_end": [r["end"]["fds"] for r in good],
        "threads_start": [r["start"]["threads"] for r in good], "threads_end": [r["end"]["threads"] for r in good],
    }
    if summary["elapsed_s"]:
        summary["ops_per_s"] = round(summary["ops"] / summary["elapsed_s"], 1)
    return ranks, summary, failures


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--world", type=int, default=4, help="number of local ranks (>= 2)")
    p.add_argument("--small-ops", type=int, default=100000, help="ops of 0..4096 elements")
    p.add_argument("--large-ops", type=int, default=1000, help="ops of 256 KiB..8 MiB")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", help="write the per-rank reports and the summary here")
    p.add_argument("--timeout", type=float, default=3600, help="bound on the whole run, seconds")
    p.add_argument("--op-timeout", type=float, default=120, help="rcoll timeout of every op, seconds")
    p.add_argument("--warmup", type=int, default=300, help="random ops before the first measurement")
    p.add_argument("--max-inflight", type=int, default=8, help="most async ops a rank leaves in flight")
    p.add_argument("--async-fraction", type=float, default=0.5, help="share of calls made with async_op=True")
    p.add_argument("--rss-slack", type=float, default=0.10, help="allowed relative RSS growth")
    p.add_argument("--rss-slack-mib", type=float, default=16, help="allowed absolute RSS growth on top, MiB")
    p.add_argument("--progress", type=float, default=5, help="seconds between progress lines (stderr)")
    p.add_argument("--progress-all", action="store_true", help="progress lines from every rank, not just rank 0")
    p.add_argument("--no-mallopt", action="store_true", help="keep glibc's dynamic mmap threshold")
    args = p.parse_args(argv)
    if args.world < 2:
        p.error("--world must be at least 2 (the soak includes point-to-point ops)")
    return args


def main(argv=None):
    args = parse_args(argv)
    cfg = {"world": args.world, "small_ops": args.small_ops, "large_ops": args.large_ops, "seed": args.seed,
           "op_timeout": args.op_timeout, "warmup": args.warmup, "max_inflight": args.max_inflight,
           "async_fraction": args.async_fraction, "rss_slack": args.rss_slack, "rss_slack_mib": args.rss_slack_mib,
           "progress": args.progress, "progress_all": args.progress_all, "mallopt": not args.no_mallopt}
    print(f"[soak] world {args.world}, {args.small_ops} small + {args.large_ops} large ops, seed {args.seed}, "
          f"timeout {args.timeout:.0f} s", file=sys.stderr, flush=True)
    t0 = time.monotonic()
    try:
        reports = spawn.run(rank_main, args.world, cfg, timeout=args.timeout, allow_failures=True,
                            grace=args.op_timeout + 30)
    except spawn.RankFailed as e:  # the deadline passed with no rank failing: a hang or a slow machine
        reports = [("error", str(e))] * args.world
    wall = time.monotonic() - t0
    ranks, summary, failures = evaluate(reports, cfg)
    summary["wall_s"] = round(wall, 1)
    ok = not failures

    for r in ranks:
        if "error" in r:
            print(f"rank {r['rank']}: FAILED\n{r['error']}")
            continue
        print(f"rank {r['rank']}: {r['ops']} ops ({r['calls']} calls), {r['wrong']} wrong, {r['elapsed_s']:.1f} s, "
              f"{r['ops_per_s']:.0f} ops/s, RSS {r['start']['rss_kib'] / 1024:.1f} -> {r['end']['rss_kib'] / 1024:.1f}"
              f" MiB (bound {r['rss_bound_kib'] / 1024:.1f}), fds {r['start']['fds']} -> {r['end']['fds']}, "
              f"threads {r['start']['threads']} -> {r['end']['threads']}")
        print(f"  calls: {', '.join(f'{k} {v}' for k, v in r['ops_per_kind'].items())}")
        for m in r["wrong_examples"]:
            print(f"  WRONG: {m}")
    if summary.get("elapsed_s"):
        print(f"summary: world {summary['world']}, {summary['ops']} ops ({summary['small_ops']} small, "
              f"{summary['large_ops']} large) in {summary['elapsed_s']:.1f} s = {summary['ops_per_s']:.0f} ops/s, "
              f"{summary['wrong']} wrong, RSS MiB {summary['rss_start_mib']} -> {summary['rss_end_mib']}, "
              f"fds {summary['fds_start']} -> {summary['fds_end']}, wall {summary['wall_s']:.0f} s")
    for f in failures:
        print(f"FAIL: {f}")
    print("PASS" if ok else "FAIL")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ok": ok, "failures": failures, "summary": summary, "ranks": ranks, "config": cfg}, f,
                      indent=1, default=str)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
