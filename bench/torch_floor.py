"""The floor of a Python torch.distributed backend: what `dist.all_reduce` costs
before any byte moves.

rcoll's torch backend is a Python ProcessGroup (the core is never compiled
against libtorch), so every `dist.all_reduce` goes torch -> c10d's C++
dispatcher -> a pybind11 trampoline into Python -> the backend's `allreduce`,
and back with a Work object that `wait()` is called on. This script measures
that path alone with a backend that does nothing (`noop`: it returns an
already finished Work), with one that also reads what any backend honouring
its arguments must read and then does nothing (`noop-reads`: the reduce op,
the timeout, asyncOp, the tensor's dtype, layout, device, contiguity, address
and size), next to rcoll's torch path, rcoll's numpy API and torch's Gloo, all
in the same processes (world 2, ranks on this host), so a latency target for
small torch ops can be read against what no Python backend can go below.

    PYTHONPATH=python python3 bench/torch_floor.py [--iters 20000] [--sizes 8,4096] [--json out.json]

Prints median and 10th-percentile microseconds per call, per path and size.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time


def _noop_backend():
    import torch
    import torch.distributed as dist

    class DoneWork(dist._Work):
        def __init__(self, result):
            super().__init__()
            self._result = result

        def wait(self, timeout=None):
            return True

        def is_completed(self):
            return True

        def is_success(self):
            return True

        def result(self):
            return self._result

        def get_future(self):
            fut = torch.futures.Future()
            fut.set_result(self._result)
            return fut

    class NoopProcessGroup(dist.ProcessGroup):
        """Answers every all_reduce at once without touching the tensor."""

        def allreduce(self, tensors, opts=None):
            return DoneWork(tensors)

        def getBackendName(self):
            return "noop"

    SUM = dist.ReduceOp.SUM

    class ReadingNoopProcessGroup(NoopProcessGroup):
        """Reads the arguments a real backend acts on, then answers as `noop`."""

        def allreduce(self, tensors, opts=None):
            t = tensors[0]
            _ = (t.dtype, t.layout, t.is_cpu, t.is_contiguous(), t.data_ptr(), t.numel())
            _ = (opts.reduceOp == SUM, opts.timeout.total_seconds(), opts.asyncOp)
            return DoneWork(tensors)

        def getBackendName(self):
            return "noop-reads"

    dist.Backend.register_backend("noop", lambda store, rank, size, timeout: NoopProcessGroup(rank, size),
                                  devices=["cpu"])
    dist.Backend.register_backend("noop-reads", lambda store, rank, size, timeout: ReadingNoopProcessGroup(rank, size),
                                  devices=["cpu"])


def _time(fn, iters, warmup):
    for _ in range(warmup):
        fn()
    samples = []
    # Batches of 50 calls: perf_counter's own cost stays out of the per-call figure.
    batch = 50
    for _ in range(max(1, iters // batch)):
        t0 = time.perf_counter()
        for _ in range(batch):
            fn()
        samples.append((time.perf_counter() - t0) / batch * 1e6)
    samples.sort()
    return statistics.median(samples), samples[len(samples) // 10]


def _rank_main(rank, world, sizes, iters, warmup):
    import numpy as np
    import torch
    import torch.distributed as dist

    import rcoll
    import rcoll.torch_backend  # noqa: F401 - registers "rcoll"

    torch.set_num_threads(1)
    _noop_backend()
    results = []
    port = int(os.environ["MASTER_PORT"])
    # One group per backend, each on its own store port, every rank in each.
    for i, backend in enumerate(["noop", "noop-reads", "rcoll", "gloo"]):
        os.environ["MASTER_PORT"] = str(port + 1 + i)
        dist.init_process_group(backend, rank=rank, world_size=world)
        for nbytes in sizes:
            t = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
            dist.barrier() if not backend.startswith("noop") else None
            med, p10 = _time(lambda t=t: dist.all_reduce(t), iters if backend != "gloo" else max(500, iters // 20),
                             warmup)
            results.append({"path": f"torch {backend}", "bytes": nbytes, "median_us": med, "p10_us": p10})
        dist.destroy_process_group()
    os.environ["MASTER_PORT"] = str(port + 20)
    comm = rcoll.init(rank=rank, world_size=world)
    for nbytes in sizes:
        x = np.ones(max(1, nbytes // 4), np.float32)
        comm.barrier()
        med, p10 = _time(lambda x=x: comm.allreduce(x), iters, warmup)
        results.append({"path": "rcoll numpy", "bytes": nbytes, "median_us": med, "p10_us": p10})
    comm.shutdown()
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=20000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--sizes", default="8,4096", help="bytes per rank, comma-separated")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]

    from rcoll import spawn

    results = spawn.run(_rank_main, 2, sizes, args.iters, args.warmup, timeout=1800)
    rows = results[0]
    print(f"{'path':<14} {'bytes':>7} {'median us':>10} {'p10 us':>8}")
    for r in rows:
        print(f"{r['path']:<14} {r['bytes']:>7} {r['median_us']:>10.1f} {r['p10_us']:>8.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rank0": rows, "rank1": results[1], "argv": sys.argv,
                       "load": os.getloadavg()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
