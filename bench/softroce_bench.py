#!/usr/bin/env python3
"""rcoll over verbs vs perftest's ib_write_bw, and vs rcoll over TCP, in the Soft-RoCE guest.

    python3 scripts/softroce/guest.py run --timeout 1500 --env PYTHONPATH=$PWD/python -- \\
        python3 bench/softroce_bench.py [--sizes 64K,1M,8M] [--json out.json]

Inside the guest (scripts/softroce/guest.py), rxe0 and rxe1 sit on the two ends
of a veth pair. This measures, in one run:
  - the wire: `ib_write_bw` from rxe0 to rxe1 (RoCE v2, GID index 1) per size;
  - rcoll allreduce and allgather at world 2, rank 0 on rxe0 and rank 1 on rxe1,
    with RCOLL_TRANSPORT=ib, and the same with RCOLL_TRANSPORT=tcp (loopback);
and prints busbw (nccl-tests factors: allreduce 2(n-1)/n, allgather (n-1)/n)
and its ratio to ib_write_bw in both directions at once (perftest -b, per
direction): at world 2 each rank sends and receives at the same time, as in
that mode, so it is the ring's ceiling; the one-way figure is shown too. Soft-RoCE under QEMU's TCG emulation is slow in
absolute terms (tens of MB/s): only the ratios measured in the same run mean
anything. Under emulation both directions share the guest's two vCPUs, so the
bidirectional figure per direction is well below the one-way one.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time

import numpy as np


def parse_size(text: str) -> int:
    t = text.strip().upper().rstrip("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    return int(float(t[:-1] if mult != 1 else t) * mult)


def ib_write_bw(size: int, iters: int, both_ways: bool = False) -> float:
    """Average GB/s of ib_write_bw rxe0 -> rxe1 at `size` bytes per message; with
    both_ways, perftest's bidirectional mode, returned per direction."""
    common = ["-x", "1", "-s", str(size), "-n", str(iters), "-F", "--report_gbits"] + (["-b"] if both_ways else [])
    server = subprocess.Popen(["ib_write_bw", "-d", "rxe1", *common], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
    time.sleep(1.0)
    try:
        client = subprocess.run(["ib_write_bw", "-d", "rxe0", *common, "192.0.2.2"], capture_output=True,
                                text=True, timeout=600)
    finally:
        server.wait(timeout=600)
    # The result line: "#bytes #iterations BW peak[Gb/sec] BW average[Gb/sec] MsgRate[Mpps]"
    for line in client.stdout.splitlines():
        fields = line.split()
        if len(fields) >= 5 and fields[0] == str(size) and re.match(r"^\d+$", fields[1]):
            total = float(fields[3]) / 8.0  # Gb/s -> GB/s
            return total / 2 if both_ways else total
    raise RuntimeError(f"could not parse ib_write_bw output:\n{client.stdout}\n{client.stderr}")


def rank_main(rank, world, sizes, iters, ops):
    import rcoll
    comm = rcoll.init(timeout=600)
    out = {}
    for op in ops:
        for size in sizes:
            n = size // 4
            if op == "allreduce":
                buf = np.full(n, rank + 1, np.float32)
                call = lambda buf=buf: comm.allreduce(buf)  # noqa: E731
            else:
                src = np.full(n // world, rank + 1, np.float32)
                dst = np.empty(world * (n // world), np.float32)
                call = lambda src=src, dst=dst: comm.allgather(src, out=dst)  # noqa: E731
            call()  # warm-up: connections, registrations
            comm.barrier()
            start = time.perf_counter()
            for _ in range(iters):
                call()
            elapsed = (time.perf_counter() - start) / iters
            if op == "allreduce":
                buf[:] = rank + 1
                comm.allreduce(buf)
                ok = bool((buf == world * (world + 1) / 2).all())
            else:
                ok = all((dst.reshape(world, -1)[r] == r + 1).all() for r in range(world))
            out[(op, size)] = (elapsed, ok)
    transport = comm.transport
    comm.shutdown()
    return transport, {f"{op}/{size}": v for (op, size), v in out.items()}


def run_rcoll(transport, sizes, iters, ops):
    from rcoll import spawn
    env = {"RCOLL_TRANSPORT": transport}
    if transport == "ib":
        env["RCOLL_IB_HCA"] = ["rxe0", "rxe1"]
    results = spawn.run(rank_main, 2, sizes, iters, ops, timeout=3600, env=env)
    used = {t for t, _ in results}
    assert used == {transport}, used
    merged = {}
    for key in results[0][1]:
        times = [r[1][key][0] for r in results]
        merged[key] = (max(times), all(r[1][key][1] for r in results))
    return merged


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="64K,1M,8M")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--ops", default="allreduce,allgather")
    parser.add_argument("--json", default="")
    args = parser.parse_args(argv)
    if os.environ.get("RCOLL_SOFTROCE_GUEST") != "1":
        print("run this inside the Soft-RoCE guest: scripts/softroce/guest.py run -- python3 bench/softroce_bench.py",
              file=sys.stderr)
        return 2
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    ops = args.ops.split(",")
    wire = {s: ib_write_bw(s, max(50, args.iters * 5)) for s in sizes}
    wire2 = {s: ib_write_bw(s, max(50, args.iters * 5), both_ways=True) for s in sizes}
    verbs = run_rcoll("ib", sizes, args.iters, ops)
    tcp = run_rcoll("tcp", sizes, args.iters, ops)
    factor = {"allreduce": 2 * (2 - 1) / 2, "allgather": (2 - 1) / 2}
    rows = []
    print(f"{'op':<10} {'size':>8} {'write 1-way':>12} {'write 2-way':>12} {'rcoll ib':>10} {'ratio':>6} "
          f"{'rcoll tcp':>10} {'ib/tcp':>7} {'ok':>3}   (GB/s; rcoll: busbw, world 2; ratio: rcoll ib / 2-way)")
    for op in ops:
        for s in sizes:
            t_ib, ok_ib = verbs[f"{op}/{s}"]
            t_tcp, ok_tcp = tcp[f"{op}/{s}"]
            bus_ib = s / t_ib * factor[op] / 1e9
            bus_tcp = s / t_tcp * factor[op] / 1e9
            row = {"op": op, "bytes": s, "ib_write_bw_GBps": wire[s], "ib_write_bw_bidir_per_dir_GBps": wire2[s],
                   "rcoll_ib_busbw_GBps": bus_ib,
                   "rcoll_tcp_busbw_GBps": bus_tcp, "ok": ok_ib and ok_tcp}
            rows.append(row)
            print(f"{op:<10} {s:>8} {wire[s]:>12.4f} {wire2[s]:>12.4f} {bus_ib:>10.4f} {bus_ib / wire2[s]:>6.2f} "
                  f"{bus_tcp:>10.4f} {bus_ib / bus_tcp:>7.2f} {'yes' if row['ok'] else 'NO':>3}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
