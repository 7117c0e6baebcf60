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
import os
import sys
import time
import traceback

from .combine import median_of_repeats, merge
from .machine import load_line, load_snapshot, machine_info
from .mpi_adapter import MpiRank
from .mpi_launch import mpi_missing, run_mpi
from .ops import DTYPES, OPS, parse_size
from .plot import plot
from .rank_files import LauncherFailed
from .rank_sweep import rank_main
from .report import fmt_table
from .socket_ceiling import socket_ceiling

BACKENDS = ("rcoll", "torch-rcoll", "gloo", "mpi", "mpi-shm")


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
