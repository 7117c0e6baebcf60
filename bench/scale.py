#!/usr/bin/env python3
"""Start-up at scale: many ranks on one machine, as threads of one process.

    python bench/scale.py --ranks 64,128,256 --ranks-per-host 1,8 [--json out.json]

(rcoll installed, or PYTHONPATH=python in a checkout with the core built.)

Each configuration starts P ranks as threads (the core releases the GIL while
it blocks, as tests/support/rank_threads.py relies on), in as few worker processes as
the per-process descriptor limit allows (every rank holds sockets), every
rank with an emulated host identity (RCOLL_HOSTID, `--ranks-per-host` ranks per
host: shared memory inside a host, TCP over the loopback between hosts). All
ranks start at once; each builds its communicator (rendezvous through rank
0's store, connections) and runs one allreduce, checked. Reported, per
configuration:

  startup_s       from the common start to the last rank's first allreduce done
  init_s          median and slowest communicator construction
  sockets/rank    sockets the workers hold, divided by P (both ends of every
                  connection are here, so this is what one rank of a real job holds)
  threads/rank    threads the workers gained, divided by P
  rss_mb/rank     resident memory the workers gained, divided by P
  correct         every rank's allreduce equals the reference

The numbers are for the model in docs/scale.md; the machine has 2 cores, so
start-up time here is CPU-bound well before it is network-bound.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

import rcoll  # an installed rcoll, or PYTHONPATH=<checkout>/python with the core built there
from rcoll.spawn import free_port


def _sockets() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                count += 1
        except OSError:
            pass  # closed meanwhile
    return count


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _worker(world: int, per_host: int, first: int, last: int, count: int, timeout: float, start_at: float) -> dict:
    """Ranks first..last-1 as threads of this process, all started at `start_at`
    (time.time() of the parent, so that every worker's clock agrees)."""
    base_sockets, base_threads, base_rss = _sockets(), _status("Threads"), _status("VmRSS")
    mine = range(first, last)
    init_s, done_s, correct, errors, comms = {}, {}, {}, [], []
    expected = np.full(count, world * (world - 1) / 2, np.float32)

    def body(rank: int) -> None:
        try:
            time.sleep(max(0.0, start_at - time.time()))
            comm = rcoll.init(rank, world, timeout=timeout, settings={"RCOLL_HOSTID": f"host{rank // per_host}"})
            comms.append(comm)
            init_s[rank] = time.time() - start_at
            x = np.full(count, rank, np.float32)
            comm.allreduce(x)
            done_s[rank] = time.time() - start_at
            correct[rank] = bool(np.array_equal(x, expected))
        except BaseException as exc:  # reported with the configuration
            errors.append(f"rank {rank}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in mine]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout + 30)
    out = {"init_s": list(init_s.values()), "done_s": list(done_s.values()), "correct": sum(correct.values()),
           "sockets": _sockets() - base_sockets, "threads": _status("Threads") - base_threads,
           "rss_kb": _status("VmRSS") - base_rss, "errors": errors[:5]}
    # Hold every communicator until all workers have measured: a rank that
    # shut down early would close sockets the others are still counting.
    print(json.dumps(out), flush=True)
    sys.stdin.readline()
    for comm in comms:
        comm.shutdown()
    return out


def measure(world: int, per_host: int, count: int, timeout: float, nofile: int) -> dict:
    # Each rank holds about 2 sockets per peer (see docs/scale.md) and both ends
    # of every connection are on this machine: fill each worker to 80 % of its limit.
    per_worker = max(1, min(world, int(0.8 * nofile) // (2 * world + 16)))
    workers = []
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    n_workers = (world + per_worker - 1) // per_worker
    start_at = time.time() + 2.0 + 0.6 * n_workers  # every worker has imported numpy and rcoll and waits
    for first in range(0, world, per_worker):
        last = min(world, first + per_worker)
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", f"{world},{per_host},{first},{last},{count},"
               f"{timeout},{start_at}"]
        workers.append(subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    reports = []
    for w in workers:
        line = w.stdout.readline()
        reports.append(json.loads(line) if line else {"init_s": [], "done_s": [], "correct": 0, "sockets": 0,
                                                       "threads": 0, "rss_kb": 0, "errors": ["worker died"]})
    for w in workers:
        w.communicate("go\n", timeout=timeout + 60)
    init_s = [t for r in reports for t in r["init_s"]]
    done_s = [t for r in reports for t in r["done_s"]]
    errors = [e for r in reports for e in r["errors"]]
    return {
        "world": world, "ranks_per_host": per_host, "hosts": (world + per_host - 1) // per_host,
        "workers": len(workers), "startup_s": round(max(done_s, default=float("nan")), 3),
        "init_s_median": round(statistics.median(init_s), 3) if init_s else None,
        "init_s_max": round(max(init_s, default=float("nan")), 3),
        "sockets_per_rank": round(sum(r["sockets"] for r in reports) / world, 1),
        "threads_per_rank": round(sum(r["threads"] for r in reports) / world, 2),
        "rss_mb_per_rank": round(sum(r["rss_kb"] for r in reports) / 1024 / world, 2),
        "correct": sum(r["correct"] for r in reports) == world and not errors, "errors": errors[:5],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ranks", default="16,64,128,256", help="world sizes, comma-separated")
    parser.add_argument("--ranks-per-host", default="1,8", help="ranks per emulated host, comma-separated")
    parser.add_argument("--count", type=int, default=1024, help="float32 elements of the allreduce")
    parser.add_argument("--timeout", type=float, default=300.0)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)  # world,per_host,first,last,count,timeout,start_at
    args = parser.parse_args(argv)
    if args.worker:
        w, p, first, last, count, timeout, start_at = args.worker.split(",")
        _worker(int(w), int(p), int(first), int(last), int(count), float(timeout), float(start_at))
        return 0
    # Workers inherit the raised soft limit (up to the hard one: a container may refuse more).
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    # Small shared-memory rings: hundreds of ranks' rings in one process, and
    # start-up, not bandwidth, is measured.
    os.environ.setdefault("RCOLL_SHM_RING_BYTES", "64K")
    results = []
    print(f"{'world':>6} {'hosts':>6} {'per host':>8} {'startup s':>10} {'init med':>9} {'init max':>9} "
          f"{'sockets/rank':>12} {'threads/rank':>12} {'MB/rank':>8}  correct")
    for world in (int(w) for w in args.ranks.split(",")):
        for per_host in (int(p) for p in args.ranks_per_host.split(",")):
            r = measure(world, per_host, args.count, args.timeout, hard)
            results.append(r)
            print(f"{r['world']:>6} {r['hosts']:>6} {per_host:>8} {r['startup_s']:>10} {r['init_s_median']:>9} "
                  f"{r['init_s_max']:>9} {r['sockets_per_rank']:>12} {r['threads_per_rank']:>12} "
                  f"{r['rss_mb_per_rank']:>8}  {r['correct']}{'  ' + r['errors'][0] if r['errors'] else ''}",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "nofile_limit": hard, "cpus": os.cpu_count(), "results": results}, f,
                      indent=1)
    return 0 if all(r["correct"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
