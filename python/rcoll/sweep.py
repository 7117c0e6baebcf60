"""nccl-tests style bandwidth sweep of rcoll (and, for comparison, torch.distributed gloo).

    python -m rcoll bench --ops allreduce,allgather,broadcast,reduce_scatter \\
        --min-bytes 4K --max-bytes 64M --factor 4 --world 2 --backends rcoll,gloo \\
        --socket-ceiling --json /tmp/sweep.json [--plot /tmp/sweep.png]

Part of the package, so that an installed wheel measures its own fabric with no
checkout (bench/sweep.py in a checkout runs the same). Backends: rcoll (the
numpy API), torch-rcoll and gloo (torch.distributed, when torch is installed),
mpi and mpi-shm (Open MPI through mpi4py, when mpirun is there).

For each backend, `--world` local processes are started (rcoll.spawn.run); every
rank runs every (op, size): warm-up iterations, a barrier, timed iterations, then
one more op on freshly filled buffers whose result is checked element by element.
The time of a size is the slowest rank's (total / iters).

Sizes follow nccl-tests: "size" is the per-rank buffer for allreduce and broadcast,
the gathered (output) size for allgather and the input size for reduce_scatter.
algbw = size / time; busbw = algbw * factor with factor 2(n-1)/n for allreduce,
(n-1)/n for allgather and reduce_scatter, 1 for broadcast.

allreduce and broadcast run in place (torch.distributed semantics, and the same
for both backends); allgather and reduce_scatter write a separate output.
See bench/README.md.
"""
from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing as mp
import os
import platform
import selectors
import socket
import sys
import time
import traceback

import numpy as np

OPS = ("allreduce", "allgather", "broadcast", "reduce_scatter")
BACKENDS = ("rcoll", "torch-rcoll", "gloo", "mpi", "mpi-shm")
# Open MPI through mpi4py, started by mpirun (see run_mpi): "mpi" over TCP on loopback only
# (the ob1 PML with the tcp BTL; vader, Open MPI's shared-memory BTL, is excluded so
# that bytes really cross sockets, as rcoll's and gloo's do), "mpi-shm" over shared memory.
MPI_BTL_ARGS = {
    "mpi": ["--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo"],
    "mpi-shm": ["--mca", "pml", "ob1", "--mca", "btl", "vader,self"],
}
DTYPES = {  # name -> element size
    "float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8,
}
PATTERN_PERIOD = 13  # input element i of rank r is (i % 13) + r + 1: small integers, exact in every dtype


def bus_factor(op: str, world: int) -> float:
    if op == "allreduce":
        return 2.0 * (world - 1) / world
    if op in ("allgather", "reduce_scatter"):
        return (world - 1) / world
    return 1.0


def parse_size(text: str) -> int:
    """'4K' -> 4096, '64M' -> 67108864, '1G', or plain bytes (1024-based, like nccl-tests)."""
    t = text.strip().upper().rstrip("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    if mult != 1:
        t = t[:-1]
    return int(float(t) * mult)


def default_iters(nbytes: int) -> int:
    """About 0.3-1 s per size on loopback: many iterations when small, few when large."""
    return max(5, min(200, int(2e8 / max(nbytes, 1))))


def default_warmup(iters: int) -> int:
    return max(2, min(20, iters // 10))


def layout(op: str, size: int, world: int, esize: int):
    """(size actually used in bytes, elements per rank input, elements of output)."""
    if op in ("allgather", "reduce_scatter"):
        per = size // (world * esize)
        size = per * world * esize
        return size, (per if op == "allgather" else per * world), (per * world if op == "allgather" else per)
    n = size // esize
    return n * esize, n, n


# ---------------------------------------------------------------------------------------------
# expected values (numpy, float64) of the check op
# ---------------------------------------------------------------------------------------------
def pattern(rank: int, n: int, offset: int = 0) -> np.ndarray:
    return (np.arange(offset, offset + n, dtype=np.int64) % PATTERN_PERIOD + rank + 1).astype(np.float64)


def expected(op: str, rank: int, world: int, n_in: int, n_out: int) -> np.ndarray:
    if op == "allreduce":
        return sum(pattern(r, n_in) for r in range(world))
    if op == "broadcast":
        return pattern(0, n_in)
    if op == "allgather":
        return np.concatenate([pattern(r, n_in) for r in range(world)])
    if op == "reduce_scatter":
        return sum(pattern(r, n_out, offset=rank * n_out) for r in range(world))
    raise ValueError(op)


def count_wrong(got64: np.ndarray, want: np.ndarray) -> int:
    if got64.shape != want.shape:
        return int(max(got64.size, want.size))
    return int(np.count_nonzero(got64 != want))


# ---------------------------------------------------------------------------------------------
# backends (run inside each rank)
# ---------------------------------------------------------------------------------------------
class RcollRank:
    name = "rcoll"

    def __init__(self, timeout):
        import rcoll
        self.comm = rcoll.init(timeout=timeout)
        self.rank, self.world = self.comm.rank, self.comm.size

    def np_dtype(self, dtype):
        if dtype == "bfloat16":
            import ml_dtypes  # noqa: F401  (rcoll takes bfloat16 through ml_dtypes)
            return np.dtype(ml_dtypes.bfloat16)
        return np.dtype(dtype)

    def setup(self, op, dtype, n_in, n_out):
        dt = self.np_dtype(dtype)
        src = np.empty(n_in, dt)
        dst = src if op in ("allreduce", "broadcast") else np.empty(n_out, dt)
        comm = self.comm
        if op == "allreduce":
            call = lambda a: comm.allreduce(src, "sum", async_op=a)  # noqa: E731
        elif op == "broadcast":
            call = lambda a: comm.broadcast(src, 0, async_op=a)  # noqa: E731
        elif op == "allgather":
            call = lambda a: comm.allgather(src, out=dst, async_op=a)  # noqa: E731
        else:
            call = lambda a: comm.reduce_scatter(src, "sum", out=dst, async_op=a)  # noqa: E731

        def fill():
            src[...] = pattern(self.rank, n_in).astype(dt)
            if dst is not src:
                dst[...] = np.zeros(n_out, dt)
        return call, fill, lambda: np.asarray(dst).astype(np.float64)

    def run(self, call, iters, use_async):
        if use_async:
            handles = [call(True) for _ in range(iters)]
            for h in handles:
                h.wait()
        else:
            for _ in range(iters):
                call(False)

    def barrier(self):
        self.comm.barrier()

    def close(self):
        self.comm.shutdown()


class GlooRank:
    """torch.distributed on CPU tensors: Gloo, or rcoll's torch backend (TorchRcollRank)."""
    name = "gloo"

    def __init__(self, timeout):
        import torch
        import torch.distributed as dist
        self.torch, self.dist = torch, dist
        if self.name == "torch-rcoll":
            import rcoll.torch_backend  # noqa: F401 - registers the backend (the entry point does it too)
        dist.init_process_group(self.name.replace("torch-", ""), init_method="env://",
                                timeout=datetime.timedelta(seconds=timeout))
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        # the non-deprecated names in recent torch, the older ones otherwise
        self._ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def setup(self, op, dtype, n_in, n_out):
        torch, dist = self.torch, self.dist
        tdt = getattr(torch, dtype)
        src = torch.empty(n_in, dtype=tdt)
        dst = src if op in ("allreduce", "broadcast") else torch.empty(n_out, dtype=tdt)
        if op == "allreduce":
            call = lambda a: dist.all_reduce(src, dist.ReduceOp.SUM, async_op=a)  # noqa: E731
        elif op == "broadcast":
            call = lambda a: dist.broadcast(src, 0, async_op=a)  # noqa: E731
        elif op == "allgather":
            call = lambda a: self._ag(dst, src, async_op=a)  # noqa: E731
        else:
            call = lambda a: self._rs(dst, src, dist.ReduceOp.SUM, async_op=a)  # noqa: E731

        def fill():
            src.copy_(torch.from_numpy(pattern(self.rank, n_in)).to(tdt))
            if dst is not src:
                dst.zero_()
        return call, fill, lambda: dst.to(torch.float64).numpy()

    def run(self, call, iters, use_async):
        if use_async:
            works = [call(True) for _ in range(iters)]
            for w in works:
                w.wait()
        else:
            for _ in range(iters):
                call(False)

    def barrier(self):
        self.dist.barrier()

    def close(self):
        self.dist.destroy_process_group()


class TorchRcollRank(GlooRank):
    """The same torch.distributed calls with backend="rcoll": what users of the torch backend see."""
    name = "torch-rcoll"


class MpiRank:
    """Open MPI through mpi4py (numpy buffers); only runs under mpirun (see run_mpi)."""
    name = "mpi"
    TYPES = {"float32": "FLOAT", "float64": "DOUBLE", "int32": "INT32_T", "int64": "INT64_T"}

    def __init__(self, timeout):
        from mpi4py import MPI  # MPI_Init happens here (mpi4py's default)
        self.MPI = MPI
        self.comm = MPI.COMM_WORLD
        self.rank, self.world = self.comm.Get_rank(), self.comm.Get_size()
        # MPI has no per-op timeout; run_mpi bounds the whole run (--timeout) instead

    def setup(self, op, dtype, n_in, n_out):
        MPI, comm = self.MPI, self.comm
        if dtype not in self.TYPES:  # Open MPI 4.1 has no (portable) float16 / bfloat16 reductions
            raise NotImplementedError(f"dtype {dtype} is not supported by the mpi backend "
                                      f"(use one of {', '.join(self.TYPES)})")
        mt = getattr(MPI, self.TYPES[dtype])
        src = np.empty(n_in, np.dtype(dtype))
        dst = src if op in ("allreduce", "broadcast") else np.empty(n_out, np.dtype(dtype))
        s, d = [src, mt], [dst, mt]
        if op == "allreduce":  # in place, as for the other backends
            call = lambda a: (comm.Iallreduce if a else comm.Allreduce)(MPI.IN_PLACE, s, MPI.SUM)  # noqa: E731
        elif op == "broadcast":
            call = lambda a: (comm.Ibcast if a else comm.Bcast)(s, root=0)  # noqa: E731
        elif op == "allgather":
            call = lambda a: (comm.Iallgather if a else comm.Allgather)(s, d)  # noqa: E731
        else:
            call = lambda a: (comm.Ireduce_scatter_block if a else comm.Reduce_scatter_block)(s, d, MPI.SUM)  # noqa: E731

        def fill():
            src[...] = pattern(self.rank, n_in).astype(src.dtype)
            if dst is not src:
                dst[...] = 0
        return call, fill, lambda: dst.astype(np.float64)

    def run(self, call, iters, use_async):
        if use_async:
            self.MPI.Request.Waitall([call(True) for _ in range(iters)])
        else:
            for _ in range(iters):
                call(False)

    def barrier(self):
        self.comm.Barrier()

    def close(self):
        pass  # mpi4py finalizes MPI at exit


RANK_CLASSES = {"rcoll": RcollRank, "torch-rcoll": TorchRcollRank, "gloo": GlooRank, "mpi": MpiRank, "mpi-shm": MpiRank}


def rank_main(rank, world, backend, cfg):
    """One rank of one backend: every (op, size). Module level, so spawned processes can import it."""
    b = RANK_CLASSES[backend](cfg["op_timeout"])
    esize = DTYPES[cfg["dtype"]]
    rows = []
    total = len(cfg["ops"]) * len(cfg["sizes"])
    try:
        for op in cfg["ops"]:
            for size in cfg["sizes"]:
                size_used, n_in, n_out = layout(op, size, world, esize)
                row = {"op": op, "bytes": size_used, "count": size_used // esize, "dtype": cfg["dtype"],
                       "rank": rank}
                if n_in == 0:
                    row["error"] = f"size {size} is smaller than world*element size"
                    rows.append(row)
                    continue
                iters = cfg["iters"] or default_iters(size_used)
                warmup = cfg["warmup"] if cfg["warmup"] is not None else default_warmup(iters)
                row.update(iters=iters, warmup=warmup)
                try:
                    call, fill, result = b.setup(op, cfg["dtype"], n_in, n_out)
                    fill()
                    b.run(call, warmup, cfg["async"])
                    b.barrier()
                    t0 = time.perf_counter()
                    b.run(call, iters, cfg["async"])
                    elapsed = time.perf_counter() - t0
                    fill()
                    b.barrier()
                    call(False)
                    row["wrong"] = count_wrong(result(), expected(op, rank, world, n_in, n_out))
                    row["time_us"] = elapsed / iters * 1e6
                except Exception as exc:  # an op the backend lacks: record it, go on with the next op
                    row["error"] = f"{type(exc).__name__}: {exc}"
                    rows.append(row)
                    if rank == 0:
                        print(f"[{backend}] {op} {size_used} B: FAILED: {row['error']}", file=sys.stderr, flush=True)
                    break
                rows.append(row)
                if rank == 0:
                    print(f"[{backend} world {world} {len(rows)}/{total}] {op:<14} {size_used:>10} B "
                          f"{row['time_us']:10.1f} us (rank 0, {iters} iters)", file=sys.stderr, flush=True)
    finally:
        try:
            b.close()
        except Exception:
            pass
    return rows


# ---------------------------------------------------------------------------------------------
# socket ceiling: raw TCP on 127.0.0.1 between two processes, one way and both ways at once
# ---------------------------------------------------------------------------------------------
def _socket_endpoint(role, port, seconds, chunk, send, measure, results):
    """One end of a 127.0.0.1 TCP pair: sends if `send`, times what it receives if `measure`."""
    try:
        if role == "server":
            lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            lsock.bind(("127.0.0.1", port))
            lsock.listen(1)
            lsock.settimeout(30)
            sock, _ = lsock.accept()
            lsock.close()
        else:
            deadline = time.monotonic() + 30
            while True:
                try:
                    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        # One thread per process moving both directions with non-blocking I/O, as rcoll's
        # transport does (two threads per process would fight over the 2 cores here).
        sel = selectors.DefaultSelector()
        sel.register(sock, selectors.EVENT_READ)
        sbuf, rbuf = memoryview(bytearray(chunk)), memoryview(bytearray(chunk))
        sending, eof, wr_closed = send, False, False
        ramp_end = time.perf_counter() + 0.2  # a short ramp-up, then the measured window
        window_end = ramp_end + seconds
        got, window = 0, 0.0
        hard_deadline = window_end + 60
        while not (eof and wr_closed):
            now = time.perf_counter()
            if now > hard_deadline:
                raise TimeoutError("the socket measurement did not finish")
            if (measure and now >= window_end) or (not measure and eof):
                sending = False
            if not sending and not wr_closed and (not measure or now >= window_end):
                sock.shutdown(socket.SHUT_WR)  # the peer sees EOF once it has read everything
                wr_closed = True
            mask = (0 if eof else selectors.EVENT_READ) | (selectors.EVENT_WRITE if sending else 0)
            if mask == 0:
                break
            sel.modify(sock, mask)
            for _, ev in sel.select(timeout=0.1):
                if ev & selectors.EVENT_READ:
                    try:
                        n = sock.recv_into(rbuf)
                    except BlockingIOError:
                        n = -1
                    if n == 0:
                        eof = True
                    elif n > 0 and measure and ramp_end <= time.perf_counter() < window_end:
                        got += n
                if ev & selectors.EVENT_WRITE and sending:
                    try:
                        sock.send(sbuf)
                    except BlockingIOError:
                        pass
        if measure:
            window = seconds
        sel.close()
        sock.close()
        results.put((role, got, window, None))
    except Exception as exc:
        results.put((role, 0, 0.0, f"{type(exc).__name__}: {exc}"))


def _socket_pair(seconds, chunk, both):
    from rcoll.spawn import free_port
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    # both: each end sends and measures; one way: the client sends, the server measures
    spec = {"server": (both, True), "client": (True, both)}
    procs = [ctx.Process(target=_socket_endpoint, args=(role, port, seconds, chunk) + spec[role] + (results,),
                         daemon=True) for role in ("server", "client")]
    for p in procs:
        p.start()
    rates = {}
    try:
        for _ in procs:
            role, got, window, err = results.get(timeout=seconds + 60)
            if err:
                raise RuntimeError(f"socket ceiling, {role}: {err}")
            if window > 0:
                rates[role] = got / window / 1e9
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    return rates


def socket_ceiling(seconds=1.0, chunk=4 << 20, repeats=3):
    """GB/s over a 127.0.0.1 TCP pair between two processes: one way, and both ways at once.

    Each is measured `repeats` times and the best is kept (it is a ceiling; loopback
    throughput on a small VM varies by tens of percent from run to run).
    """
    ones, twos = [], []
    for _ in range(repeats):
        ones.append(_socket_pair(seconds, chunk, both=False)["server"])
        two = _socket_pair(seconds, chunk, both=True)
        twos.append((sum(two.values()) / len(two), two))
    per_dir, best_two = max(twos, key=lambda t: t[0])
    return {"one_direction_GBps": max(ones), "per_direction_GBps": per_dir,
            "both_directions_GBps": sum(best_two.values()), "per_endpoint_GBps": best_two,
            "all_one_direction_GBps": ones, "all_per_direction_GBps": [t[0] for t in twos],
            "seconds": seconds, "chunk_bytes": chunk, "repeats": repeats}


# ---------------------------------------------------------------------------------------------
# outside launchers: mpirun (mpi, mpi-shm)
# ---------------------------------------------------------------------------------------------
class LauncherFailed(RuntimeError):
    """Ranks started by an outside launcher (mpirun, ip netns exec) failed or did not report."""


def mpi_missing():
    """None if mpirun and mpi4py are usable, else a one-line reason."""
    import importlib.util
    import shutil
    if shutil.which("mpirun") is None:
        return "mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"
    if importlib.util.find_spec("mpi4py") is None:
        return f"mpi4py is not installed for {sys.executable} (pip install mpi4py)"
    return None


def mpi_command(backend, world, cfg_path, out_dir, extra=()):
    return (["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(world),
             # like the spawned rcoll and gloo ranks: not pinned (Open MPI binds to cores by default)
             "--bind-to", "none"]
            + MPI_BTL_ARGS[backend] + list(extra)
            + [sys.executable, "-m", "rcoll._sweep_rank",
               "--cfg", cfg_path, "--out", out_dir, "--backend", backend, "--launcher", "mpi"])


def collect_rank_files(out_dir, world, what):
    """Per-rank rows from DIR/rank<r>.json (written by rcoll._sweep_rank); raises on missing or failed ranks."""
    per_rank, failures = [], []
    for r in range(world):
        path = os.path.join(out_dir, f"rank{r}.json")
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as exc:
            failures.append(f"--- rank {r}: no result ({exc})")
            continue
        if "error" in doc:
            failures.append(f"--- rank {r}:\n{doc['error']}")
        else:
            per_rank.append(doc["rows"])
    if failures:
        raise LauncherFailed(f"{len(failures)} of {world} ranks of {what} failed:\n" + "\n".join(failures))
    return per_rank


def run_mpi(backend, world, cfg, timeout, extra=()):
    """Runs sweep.rank_main under mpirun; returns (per-rank rows, the command line)."""
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory(prefix="rcoll-sweep-mpi-") as tmp:
        cfg_path = os.path.join(tmp, "cfg.json")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        cmd = mpi_command(backend, world, cfg_path, tmp, extra)
        print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
        env = dict(os.environ, OMPI_MCA_rmaps_base_oversubscribe="1")
        # stdout/stderr of the ranks (progress lines of rank 0) pass through to our stderr
        proc = subprocess.Popen(cmd, stdout=sys.stderr, stderr=sys.stderr, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            import signal
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            raise LauncherFailed(f"mpirun did not finish within {timeout} s (killed)") from None
        try:
            per_rank = collect_rank_files(tmp, world, f"mpirun ({backend})")
        except LauncherFailed as exc:
            raise LauncherFailed(f"{exc}\nmpirun exit status {rc}") from None
        if rc != 0:
            raise LauncherFailed(f"mpirun exited with status {rc} although every rank reported")
    return per_rank, cmd


# ---------------------------------------------------------------------------------------------
# parent: run, merge, print, save
# ---------------------------------------------------------------------------------------------
def merge(per_rank_rows, world):
    """One row per (op, size): the slowest rank's time, the sum of #wrong."""
    merged = []
    for rows in zip(*per_rank_rows):
        first = rows[0]
        row = {k: first[k] for k in ("op", "bytes", "count", "dtype") if k in first}
        row["iters"], row["warmup"] = first.get("iters"), first.get("warmup")
        errors = [f"rank {r['rank']}: {r['error']}" for r in rows if "error" in r]
        if errors:
            row["error"] = "; ".join(errors)
        else:
            times = [r["time_us"] for r in rows]
            row["time_us"] = max(times)
            row["time_us_per_rank"] = times
            row["wrong"] = sum(r["wrong"] for r in rows)
            algbw = row["bytes"] / (row["time_us"] * 1e-6) / 1e9
            row["algbw_GBps"] = algbw
            row["busbw_GBps"] = algbw * bus_factor(row["op"], world)
        merged.append(row)
    return merged


def median_of_repeats(runs, world):
    """One row per (op, size) from several merged runs of a backend: the median
    of the runs' (slowest-rank) times, every run's time kept, #wrong summed."""
    combined = []
    for rows in zip(*runs):
        row = dict(rows[0])
        failed = [r for r in rows if "error" in r]
        if failed:
            combined.append(dict(failed[0]))
            continue
        times = sorted(r["time_us"] for r in rows)
        mid = len(times) // 2
        row["time_us"] = times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2
        row["time_us_repeats"] = [r["time_us"] for r in rows]
        row["time_us_per_rank"] = [r["time_us_per_rank"] for r in rows]
        row["wrong"] = sum(r["wrong"] for r in rows)
        row["algbw_GBps"] = row["bytes"] / (row["time_us"] * 1e-6) / 1e9
        row["busbw_GBps"] = row["algbw_GBps"] * bus_factor(row["op"], world)
        combined.append(row)
    return combined


def load_snapshot():
    """The 1/5/15-min load averages and how many qemu-system processes run (other work on this host)."""
    qemu = 0
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/comm") as f:
                    qemu += f.read().startswith("qemu-system")
            except OSError:
                pass
    load = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return {"loadavg": load, "qemu_processes": qemu, "time": datetime.datetime.now().isoformat(timespec="seconds")}


def load_line(before, after):
    """'# host load: ...' for the end of a table (the figures depend on what else ran)."""
    def one(s):
        la = "/".join(f"{x:.1f}" for x in s["loadavg"]) if s.get("loadavg") else "?"
        return f"load avg {la}, {s['qemu_processes']} qemu-system"
    return f"# host load before: {one(before)}; after: {one(after)} (on {os.cpu_count()} cpus)"


def machine_info():
    info = {
        "nproc": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "hostname": socket.gethostname(),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("RCOLL_", "GLOO_", "OMP_"))},
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import rcoll
        info["rcoll"] = getattr(rcoll, "__version__", "?")
        info["rcoll_path"] = os.path.dirname(rcoll.__file__)
    except Exception as exc:
        info["rcoll"] = f"import failed: {exc}"
    try:
        import torch
        info["torch"] = torch.__version__
    except Exception:
        info["torch"] = None
    return info


def split_backend(spec):
    """"rcoll:RCOLL_SOCKETS_PER_PEER=2" -> ("rcoll", {"RCOLL_SOCKETS_PER_PEER": "2"}): a backend run with
    extra environment for its ranks, so that settings can be compared in one run (taking turns)."""
    name, *settings = spec.split(":")
    env = {}
    for setting in settings:
        key, eq, value = setting.partition("=")
        if not eq or not key:
            raise ValueError(f"backend '{spec}': '{setting}' is not VAR=VALUE")
        env[key] = value
    return name, env


def ratio_pairs(backends):
    """(a, b) for each busbw-ratio column: rcoll against every other backend (else the first against the rest)."""
    first = "rcoll" if "rcoll" in backends else (backends[0] if backends else None)
    pairs = [(first, b) for b in backends if b != first]
    if first != "torch-rcoll" and "torch-rcoll" in backends and "gloo" in backends:
        pairs.append(("torch-rcoll", "gloo"))  # the torch backend against torch's own, same API
    return pairs


def fmt_table(results, backends, world, args, ceiling):
    lines = []
    lines.append(f"# python -m rcoll bench  world {world}  dtype {args.dtype}  "
                 f"{'async' if args.async_ops else 'blocking'} ops  "
                 f"iters {'adaptive' if not args.iters else args.iters}  cpus {os.cpu_count()}"
                 + ("  (OVERSUBSCRIBED: more ranks than cores)" if world > (os.cpu_count() or 1) else ""))
    if ceiling:
        lines.append(f"# socket ceiling (TCP 127.0.0.1, 2 processes): both directions at once "
                     f"{ceiling['per_direction_GBps']:.2f} GB/s per direction "
                     f"({ceiling['both_directions_GBps']:.2f} GB/s total); one direction only "
                     f"{ceiling['one_direction_GBps']:.2f} GB/s")
    repeats = getattr(args, "repeats", 1)
    lines.append("# time = slowest rank's mean time per op"
                 + (f", median of {repeats} runs (backends taking turns)" if repeats > 1 else "")
                 + "; busbw factor: allreduce 2(n-1)/n, allgather/reduce_scatter (n-1)/n, broadcast 1")
    head = f"{'size(B)':>10} {'count':>10} {'type':>8} {'op':>14}"
    sub = " " * len(head)
    for b in backends:
        cols = f" |{'time(us)':>10} {'algbw':>7} {'busbw':>7} {'#wrong':>6}"
        head += cols
        sub += f" |{b:^33}"
    pairs = ratio_pairs(backends)
    for a, c in pairs:
        w = max(11, len(a) + 1 + len(c))
        head += f" | {a + '/' + c:>{w}}"
        sub += f" | {'busbw ratio':>{w}}"
    lines.append(sub.rstrip())
    lines.append(head + "   (algbw, busbw in GB/s)")
    index = {b: {(r["op"], r["bytes"]): r for r in results.get(b, [])} for b in backends}
    keys = []
    for b in backends:
        for r in results.get(b, []):
            if (r["op"], r["bytes"]) not in keys:
                keys.append((r["op"], r["bytes"]))
    keys.sort(key=lambda k: (list(OPS).index(k[0]) if k[0] in OPS else 99, k[1]))
    for op, nbytes in keys:
        some = next(index[b][(op, nbytes)] for b in backends if (op, nbytes) in index[b])
        line = f"{nbytes:>10} {some['count']:>10} {some['dtype']:>8} {op:>14}"
        for b in backends:
            r = index[b].get((op, nbytes))
            if r is None:
                line += f" |{'-':>10} {'-':>7} {'-':>7} {'-':>6}"
            elif "error" in r:
                line += f" |{'error':>10} {'-':>7} {'-':>7} {'-':>6}"
            else:
                line += (f" |{r['time_us']:>10.1f} {r['algbw_GBps']:>7.3f} {r['busbw_GBps']:>7.3f} "
                         f"{r['wrong']:>6}")
        for an, cn in pairs:
            w = max(11, len(an) + 1 + len(cn))
            a, c = index[an].get((op, nbytes)), index[cn].get((op, nbytes))
            if a and c and "busbw_GBps" in a and "busbw_GBps" in c and c["busbw_GBps"] > 0:
                line += f" | {a['busbw_GBps'] / c['busbw_GBps']:>{w - 1}.2f}x"
            else:
                line += f" | {'-':>{w}}"
        lines.append(line)
    # peak busbw per op and backend, as a fraction of the socket ceiling
    lines.append("# peak busbw per op (GB/s)"
                 + (" and (% of the socket ceiling both ways at once per direction / % of one way)" if ceiling else ""))
    for op in OPS:
        parts = []
        for b in backends:
            vals = [r["busbw_GBps"] for r in results.get(b, []) if r["op"] == op and "busbw_GBps" in r]
            if vals:
                txt = f"{b} {max(vals):.3f}"
                if ceiling:
                    txt += (f" ({100 * max(vals) / ceiling['per_direction_GBps']:.0f}% / "
                            f"{100 * max(vals) / ceiling['one_direction_GBps']:.0f}%)")
                parts.append(txt)
        if parts:
            lines.append(f"#   {op:<14} " + ", ".join(parts))
    for b in backends:
        for r in results.get(b, []):
            if "error" in r:
                lines.append(f"# {b} {r['op']} {r['bytes']} B: {r['error']}")
        wrong = sum(r.get("wrong", 0) for r in results.get(b, []))
        if wrong:
            lines.append(f"# WARNING: {b} returned {wrong} wrong elements in total")
    return "\n".join(lines)


def plot(path, results, backends, world, ceiling):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"--plot {path}: matplotlib is not installed (pip install matplotlib); no plot written",
              file=sys.stderr)
        return
    ops = [op for op in OPS if any(r["op"] == op for b in backends for r in results.get(b, []))]
    fig, axes = plt.subplots(1, len(ops), figsize=(4.5 * len(ops), 4), squeeze=False)
    for ax, op in zip(axes[0], ops):
        for b in backends:
            rows = [r for r in results.get(b, []) if r["op"] == op and "busbw_GBps" in r]
            if rows:
                ax.plot([r["bytes"] for r in rows], [r["busbw_GBps"] for r in rows], marker="o", label=b)
        if ceiling:
            ax.axhline(ceiling["per_direction_GBps"], color="gray", linestyle="--", label="socket ceiling")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{op}, world {world}")
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"plot written to {path}", file=sys.stderr)


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m rcoll bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ops", default="allreduce,allgather,broadcast,reduce_scatter")
    p.add_argument("--min-bytes", "-b", default="4K")
    p.add_argument("--max-bytes", "-e", default="64M")
    p.add_argument("--factor", "-f", type=float, default=4.0, help="size multiplier between steps")
    p.add_argument("--iters", "-n", type=int, default=0, help="timed iterations (default: adaptive per size)")
    p.add_argument("--warmup", "-w", type=int, default=None, help="warm-up iterations (default: adaptive)")
    p.add_argument("--world", "-g", type=int, default=2, help="number of local ranks")
    p.add_argument("--repeats", "-r", type=int, default=1,
                   help="run every backend this many times, taking turns, and report each row's median")
    p.add_argument("--dtype", "-d", default="float32", choices=sorted(DTYPES))
    p.add_argument("--backends", default="rcoll,gloo",
                   help="comma-separated subset of rcoll,torch-rcoll,gloo,mpi,mpi-shm (mpi: Open MPI over loopback "
                        "TCP, mpi-shm: over shared memory; both need mpirun and mpi4py). A backend may carry "
                        "environment for its ranks, to compare settings in one run: "
                        "rcoll,rcoll:RCOLL_SOCKETS_PER_PEER=2")
    p.add_argument("--mpi-args", default="", help="extra mpirun arguments for the mpi backends (one string)")
    p.add_argument("--async", dest="async_ops", action="store_true",
                   help="issue the timed iterations asynchronously and wait for them all at the end")
    p.add_argument("--socket-ceiling", action="store_true", help="measure raw loopback TCP throughput first")
    p.add_argument("--socket-seconds", type=float, default=1.0, help="seconds per socket measurement (3 of each kind)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds a backend's whole sweep may take")
    p.add_argument("--op-timeout", type=float, default=120.0, help="seconds one collective may take")
    p.add_argument("--connect-timeout", type=float, default=60.0,
                   help="RCOLL_CONNECT_TIMEOUT for the ranks, unless set in the environment: a rank that fails "
                        "before rendezvous leaves the others waiting this long (rcoll.spawn.run waits for all)")
    p.add_argument("--json", help="write everything to this JSON file")
    p.add_argument("--plot", help="write busbw vs size to this PNG (needs matplotlib)")
    args = p.parse_args(argv)

    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    bad = [o for o in ops if o not in OPS]
    if bad:
        p.error(f"unknown ops {bad}; choose from {', '.join(OPS)}")
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    try:
        bad = [b for b in backends if split_backend(b)[0] not in BACKENDS]
    except ValueError as exc:
        p.error(str(exc))
    if bad:
        p.error(f"unknown backends {bad}; choose from {', '.join(BACKENDS)}")
    if any(split_backend(b)[1] and b.startswith("mpi") for b in backends):
        p.error("the mpi backends take no environment settings (use --mpi-args)")
    if len(set(backends)) != len(backends):
        p.error("a backend is listed twice")
    if args.world < 1:
        p.error("--world must be >= 1")
    if args.repeats < 1:
        p.error("--repeats must be >= 1")
    if args.factor <= 1:
        p.error("--factor must be > 1")
    lo, hi = parse_size(args.min_bytes), parse_size(args.max_bytes)
    sizes = []
    s = lo
    while s <= hi:
        sizes.append(int(s))
        s = s * args.factor
    if not sizes:
        p.error("--min-bytes is larger than --max-bytes")

    from rcoll import spawn

    info = machine_info()
    info["load_before"] = load_snapshot()
    for b in [b for b in backends if b in ("gloo", "torch-rcoll")]:
        try:
            import torch  # noqa: F401
            import torch.distributed as dist
            if not dist.is_available() or not dist.is_gloo_available():
                raise ImportError("torch.distributed with gloo is not available in this torch build")
        except ImportError as exc:
            print(f"note: skipping the {b} backend: torch is not usable ({exc})", file=sys.stderr)
            backends.remove(b)
    for b in [b for b in backends if b.startswith("mpi")]:
        why = mpi_missing()
        if why:
            print(f"note: skipping the {b} backend: {why}", file=sys.stderr)
            backends.remove(b)
    if any(b.startswith("mpi") for b in backends):
        try:
            import subprocess
            info["mpirun"] = subprocess.run(["mpirun", "--version"], capture_output=True, text=True,
                                            timeout=30).stdout.splitlines()[0]
        except Exception as exc:
            info["mpirun"] = f"mpirun --version failed: {exc}"
    if args.dtype not in MpiRank.TYPES and any(b.startswith("mpi") for b in backends):
        print(f"note: the mpi backends do not support {args.dtype}; their rows will be errors", file=sys.stderr)
    if not backends:
        print("error: no backend left to run", file=sys.stderr)
        return 2
    if args.world > (os.cpu_count() or 1):
        print(f"note: world {args.world} > {os.cpu_count()} CPUs: ranks share cores, timings are pessimistic",
              file=sys.stderr)

    ceiling = None
    if args.socket_ceiling:
        print(f"measuring the loopback TCP socket ceiling ({args.socket_seconds} s)...", file=sys.stderr, flush=True)
        try:
            ceiling = socket_ceiling(args.socket_seconds)
            print(f"socket ceiling: {ceiling['per_direction_GBps']:.2f} GB/s per direction both ways, "
                  f"{ceiling['one_direction_GBps']:.2f} GB/s one way", file=sys.stderr, flush=True)
        except Exception as exc:
            print(f"error: socket ceiling measurement failed: {exc}", file=sys.stderr)

    cfg = {"ops": ops, "sizes": sizes, "iters": args.iters, "warmup": args.warmup, "dtype": args.dtype,
           "async": args.async_ops, "op_timeout": args.op_timeout}
    results, errors, durations = {}, {}, {}
    rank_env = ({} if "RCOLL_CONNECT_TIMEOUT" in os.environ
                else {"RCOLL_CONNECT_TIMEOUT": str(int(args.connect_timeout))})
    info["rank_env"] = rank_env
    # With --repeats R the backends take turns R times (a, b, a, b, ...), so that
    # a slow spell of the machine hits every backend alike; each row is then the
    # median of the R runs.
    runs = {b: [] for b in backends}
    for rep in range(args.repeats):
        for b in backends:
            if b in errors:
                continue
            turn = f", run {rep + 1}/{args.repeats}" if args.repeats > 1 else ""
            print(f"=== {b} ({backends.index(b) + 1}/{len(backends)}{turn}): world {args.world}, "
                  f"{len(ops)} ops x {len(sizes)} sizes", file=sys.stderr, flush=True)
            t0 = time.monotonic()
            try:
                if b.startswith("mpi"):
                    per_rank, cmd = run_mpi(b, args.world, cfg, args.timeout, args.mpi_args.split())
                    info.setdefault("mpi_commands", {})[b] = cmd
                else:
                    name, extra_env = split_backend(b)
                    per_rank = spawn.run(rank_main, args.world, name, cfg, timeout=args.timeout,
                                         env={**rank_env, **extra_env})
                runs[b].append(merge(per_rank, args.world))
            except Exception as exc:
                msg = f"{type(exc).__name__}: {exc}"
                errors[b] = msg
                print(f"\nERROR: backend {b} failed (world {args.world}); its results are missing:\n{msg}\n",
                      file=sys.stderr, flush=True)
                if not isinstance(exc, (spawn.RankFailed, LauncherFailed)):
                    traceback.print_exc()
            durations[b] = durations.get(b, 0.0) + time.monotonic() - t0
    for b in backends:
        if b not in errors and runs[b]:
            results[b] = runs[b][0] if len(runs[b]) == 1 else median_of_repeats(runs[b], args.world)

    info["load_after"] = load_snapshot()
    shown = [b for b in backends if b in results]
    if shown:
        print(fmt_table(results, shown, args.world, args, ceiling))
        print(load_line(info["load_before"], info["load_after"]))
    for b, msg in errors.items():
        print(f"# backend {b} FAILED: {msg.splitlines()[0]}")
    sys.stdout.flush()

    if args.json:
        doc = {"args": vars(args), "sizes": sizes, "world": args.world, "machine": info,
               "socket_ceiling": ceiling, "results": results, "errors": errors,
               "durations_s": durations, "created": datetime.datetime.now().isoformat(timespec="seconds")}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"results written to {args.json}", file=sys.stderr)
    if args.plot and shown:
        plot(args.plot, results, shown, args.world, ceiling)
    return 1 if errors or any(r.get("wrong") for rows in results.values() for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
