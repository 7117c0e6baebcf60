#!/usr/bin/env python3
"""GPU benchmarks: rcoll's reduction kernels, and allreduce of CUDA tensors at world 2.

    PYTHONPATH=python python3 bench/gpu_bench.py [--kernels] [--allreduce] [--hosts AABB]
        [--min-bytes 4K] [--max-bytes 256M] [--factor 4] [--iters 20] [--json out.json]

1. Kernels (one process): for each size, the bandwidth of rcoll.cuda.reduce
   (sum and max, float32 and bfloat16; 3 x size bytes moved: two reads, one
   write) as a fraction of the device-to-device copy bandwidth measured in the
   same run (2 x size bytes), and next to torch.add(out=) / torch.maximum(out=)
   on the same tensors. CUDA events time every run.
2. allreduce of CUDA tensors at world 2 (two local processes; they may share
   one GPU): backend "rcoll" (pinned host staging, GPU reductions) against
   torch's Gloo on the same CUDA tensors, in the same run, with nccl-tests'
   definitions: algbw = size / time, busbw = algbw * 2(n-1)/n. Every size's
   result is checked. With --hosts, one rank per letter, each claiming the
   host its letter names (RCOLL_HOSTID; they talk over TCP on loopback
   between "hosts"): "rcoll" sums inside each host through CUDA IPC and
   stages only between hosts (allgather, reduce_scatter and broadcast
   smaller than RCOLL_CUDA_IPC_HOSTS_MIN_BYTES stage), "rcoll-windows" takes
   the windows at every size (that threshold at 0), "rcoll-staging"
   (RCOLL_CUDA_IPC=0) stages on every edge.

Without a GPU (or without rcoll._cuda, or with a CPU build of torch) it says
so and exits with status 2.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))


def parse_bytes(text: str) -> int:
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().rstrip("B")
    return int(float(text[:-1]) * units[text[-1]]) if text and text[-1] in units else int(text)


def gpu_or_exit():
    try:
        import torch
    except ImportError:
        sys.exit("gpu_bench: torch is not installed")
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        print(f"gpu_bench: no GPU here (torch {torch.__version__}, {build}, sees no CUDA device); nothing to "
              f"measure", file=sys.stderr)
        sys.exit(2)
    import rcoll.cuda

    ok, reason = rcoll.cuda.available()
    if not ok:
        print(f"gpu_bench: rcoll's CUDA module cannot run here: {reason}", file=sys.stderr)
        sys.exit(2)
    return torch


def sizes(lo: int, hi: int, factor: int):
    out, n = [], lo
    while n <= hi:
        out.append(n)
        n *= factor
    return out


def time_gpu(torch, fn, iters: int) -> float:
    """Seconds per call, from CUDA events around `iters` calls after a warm-up."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000.0 / iters


def time_graph(torch, fn, iters: int) -> float:
    """Seconds per call of the GPU work alone: `iters` calls captured once in a
    CUDA graph and replayed, so no host launch cost hides a short kernel."""
    fn()  # warm-up outside the capture (lazy initialisation)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            fn()
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(3):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000.0 / (3 * iters)


def kernels(torch, byte_sizes, iters):
    import rcoll.cuda

    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        es = torch.empty(0, dtype=dtype).element_size()
        for nbytes in byte_sizes:
            n = max(1, nbytes // es)
            a = torch.randn(n, device="cuda").to(dtype)
            b = torch.randn(n, device="cuda").to(dtype)
            dst = torch.empty_like(a)
            # Two timings: "kernel" is the GPU's own time (a replayed CUDA
            # graph), what the kernels cost inside a collective; "call" is
            # one Python call after another, host launch cost included.
            copy = time_graph(torch, lambda dst=dst, a=a: dst.copy_(a), iters)
            copy_bw = 2 * n * es / copy
            for op, torch_fn in (("sum", lambda a=a, b=b, dst=dst: torch.add(a, b, out=dst)),
                                 ("max", lambda a=a, b=b, dst=dst: torch.maximum(a, b, out=dst))):
                ours_fn = lambda dst=dst, a=a, b=b, op=op: rcoll.cuda.reduce(dst, a, b, op)  # noqa: E731
                ours, theirs = time_graph(torch, ours_fn, iters), time_graph(torch, torch_fn, iters)
                ours_call, theirs_call = time_gpu(torch, ours_fn, iters), time_gpu(torch, torch_fn, iters)
                bw, torch_bw = 3 * n * es / ours, 3 * n * es / theirs
                rows.append({"dtype": str(dtype).replace("torch.", ""), "op": op, "bytes": n * es,
                             "rcoll_GBps": bw / 1e9, "copy_GBps": copy_bw / 1e9, "torch_GBps": torch_bw / 1e9,
                             "fraction_of_copy": bw / copy_bw, "vs_torch": bw / torch_bw,
                             "rcoll_kernel_us": ours * 1e6, "torch_kernel_us": theirs * 1e6,
                             "rcoll_call_us": ours_call * 1e6, "torch_call_us": theirs_call * 1e6})
                r = rows[-1]
                print(f"{r['dtype']:>9} {op:>4} {r['bytes']:>11} B  kernel: rcoll {r['rcoll_GBps']:7.1f} GB/s  "
                      f"copy {r['copy_GBps']:7.1f} ({r['fraction_of_copy']:4.2f} of copy)  "
                      f"torch {r['torch_GBps']:7.1f} ({r['vs_torch']:4.2f} x)   call: rcoll "
                      f"{r['rcoll_call_us']:6.1f} us  torch {r['torch_call_us']:6.1f} us", flush=True)
    return rows


def _device_path(dist, torch, group):
    """How rcoll moved the last CUDA op of `group`: "cuda-ipc" or "staging"."""
    try:
        import rcoll.torch_backend
        return rcoll.torch_backend.device_path(group)
    except Exception as e:  # a torch without these internals: say so, measure anyway
        return f"unknown ({type(e).__name__})"


def _op_case(dist, torch, op, nbytes, rank, world):
    """(run(group), check(group) -> #wrong, size in bytes) of one op at `nbytes`
    (nccl-tests: the size of the whole buffer; allgather's output, reduce_scatter's input)."""
    if op == "allreduce":
        t = torch.empty(max(1, nbytes // 4), device="cuda")

        def check(group):
            t.fill_(rank + 1.0)
            dist.all_reduce(t, group=group)
            return int((t != world * (world + 1) / 2).sum().item())
        return (lambda group: dist.all_reduce(t, group=group)), check, t.numel() * 4
    if op == "broadcast":
        t = torch.empty(max(1, nbytes // 4), device="cuda")

        def check(group):
            t.fill_(rank + 1.0)
            dist.broadcast(t, src=0, group=group)
            return int((t != 1.0).sum().item())
        return (lambda group: dist.broadcast(t, src=0, group=group)), check, t.numel() * 4
    count = max(1, nbytes // 4 // world)
    small, big = torch.empty(count, device="cuda"), torch.empty(world * count, device="cuda")
    if op == "allgather":
        def check(group):
            small.fill_(rank + 1.0)
            dist.all_gather_into_tensor(big, small, group=group)
            want = torch.arange(1, world + 1, device="cuda", dtype=torch.float32).repeat_interleave(count)
            return int((big != want).sum().item())
        return ((lambda group: dist.all_gather_into_tensor(big, small, group=group)), check, big.numel() * 4)

    def check(group):
        big.fill_(rank + 1.0)
        dist.reduce_scatter_tensor(small, big, group=group)
        return int((small != world * (world + 1) / 2).sum().item())
    return ((lambda group: dist.reduce_scatter_tensor(small, big, group=group)), check, big.numel() * 4)


# nccl-tests' busbw = algbw * factor (doc/PERFORMANCE.md).
BUSBW_FACTOR = {"allreduce": lambda n: 2 * (n - 1) / n, "allgather": lambda n: (n - 1) / n,
                "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0}


def _group_with(dist, **settings):
    """An rcoll group created while the environment holds `settings` (read once, when a group is made)."""
    saved = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        return dist.new_group(backend="rcoll")
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


def _allreduce_rank(rank, world, byte_sizes, iters, ops=("allreduce",), hosts=False):
    """One rank: the same CUDA tensors through rcoll (default group) and Gloo (a second group)."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import rcoll.torch_backend  # noqa: F401

    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("rcoll", init_method="env://", timeout=timedelta(seconds=300))
    groups = {"rcoll": None}
    # The same ranks through pinned host staging instead of CUDA IPC (rank
    # 0's RCOLL_CUDA_IPC, read when a group is created, decides for all).
    groups["rcoll-staging"] = _group_with(dist, RCOLL_CUDA_IPC="0")
    if hosts:
        # Across hosts, the windows at every size: what the default group's
        # RCOLL_CUDA_IPC_HOSTS_MIN_BYTES threshold chooses against.
        groups["rcoll-windows"] = _group_with(dist, RCOLL_CUDA_IPC_HOSTS_MIN_BYTES="0")
    groups["gloo"] = dist.new_group(backend="gloo")
    rows = []
    for op in ops:
        for nbytes in byte_sizes:
            run, check, size = _op_case(dist, torch, op, nbytes, rank, world)
            for name, group in groups.items():
                reps = max(2, min(iters, (64 << 20) // max(nbytes, 1)))
                try:
                    for _ in range(2):
                        run(group)
                except Exception as e:  # noqa: BLE001 -- Gloo lacks some ops on CUDA tensors: say so, go on
                    rows.append({"op": op, "backend": name, "bytes": size, "error": str(e)[:200]})
                    continue
                dist.barrier()
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(reps):
                    run(group)
                torch.cuda.synchronize()
                seconds = (time.perf_counter() - start) / reps
                wrong = check(group)
                # algbw and busbw come from the slowest rank's time (allreduce() below).
                rows.append({"op": op, "backend": name, "bytes": size, "time_us": seconds * 1e6, "wrong": wrong,
                             "path": _device_path(dist, torch, group) if name.startswith("rcoll") else "gloo"})
    dist.destroy_process_group()
    return rows


def allreduce(byte_sizes, iters, layout=None, ops=("allreduce",)):
    from rcoll import spawn

    world = len(layout) if layout else 2
    env = {"RCOLL_HOSTID": list(layout)} if layout else None
    results = spawn.run(_allreduce_rank, world, byte_sizes, iters, tuple(ops), bool(layout), timeout=1800, env=env)
    rows = []
    for i, row in enumerate(results[0]):  # the slower rank's time, as nccl-tests reports
        row = dict(row)
        if layout:
            row["layout"] = layout
        if "error" in row or any("error" in r[i] for r in results):
            row["error"] = row.get("error") or next(r[i]["error"] for r in results if "error" in r[i])
            rows.append(row)
            continue
        row["time_us"] = max(r[i]["time_us"] for r in results)
        row["algbw_GBps"] = row["bytes"] / (row["time_us"] / 1e6) / 1e9
        row["busbw_GBps"] = row["algbw_GBps"] * BUSBW_FACTOR[row["op"]](world)
        row["wrong"] = sum(r[i]["wrong"] for r in results)
        rows.append(row)
    print(f"{'op':>14} {'size':>11} {'backend':>13} {'time us':>10} {'algbw':>8} {'busbw':>8} {'#wrong':>6}  path")
    for r in rows:
        if "error" in r:
            print(f"{r['op']:>14} {r['bytes']:>11} {r['backend']:>13}  not run: {r['error']}")
            continue
        print(f"{r['op']:>14} {r['bytes']:>11} {r['backend']:>13} {r['time_us']:>10.1f} {r['algbw_GBps']:>8.2f} "
              f"{r['busbw_GBps']:>8.2f} {r['wrong']:>6}  {r['path']}")
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kernels", action="store_true", help="only the kernel benchmark")
    p.add_argument("--allreduce", action="store_true", help="only the world-2 allreduce benchmark")
    p.add_argument("--hosts", help="allreduce with one rank per letter on emulated hosts, e.g. AABB")
    p.add_argument("--ops", default="allreduce",
                   help="with --allreduce: any of allreduce,allgather,reduce_scatter,broadcast")
    p.add_argument("--min-bytes", default="4K")
    p.add_argument("--max-bytes", default="256M")
    p.add_argument("--factor", type=int, default=4)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--json", help="write every row here")
    args = p.parse_args(argv)
    torch = gpu_or_exit()
    both = not args.kernels and not args.allreduce
    byte_sizes = sizes(parse_bytes(args.min_bytes), parse_bytes(args.max_bytes), args.factor)
    out = {"device": torch.cuda.get_device_name(0)}
    print(f"device: {out['device']}")
    if args.kernels or both:
        out["kernels"] = kernels(torch, [s for s in byte_sizes if s >= 1 << 16], args.iters)
    if args.allreduce or both:
        out["allreduce"] = allreduce(byte_sizes, args.iters, args.hosts, args.ops.split(","))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 1 if any(r.get("wrong") for r in out.get("allreduce", [])) else 0


if __name__ == "__main__":
    sys.exit(main())
