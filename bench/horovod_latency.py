"""Small-op latency of rcoll.horovod.torch against rcoll's numpy API, in the
same processes (world 2, ranks on this host), as docs/horovod.md reports it.

    PYTHONPATH=python python3 bench/horovod_latency.py [--iters 5000] [--sizes 8,4096] [--json out.json]

Paths: a synchronous `hvd.allreduce` of a named tensor (agreed in a cached
round of the negotiation), the same in place (`hvd.allreduce_`), an unnamed
one (a full round every call, as in Horovod), and `Communicator.allreduce`
on the Horovod job's own communicator. Prints median and 10th-percentile
microseconds per call.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

from torch_floor import _time  # the same timing of batches of calls (bench/ is on sys.path when run as a script)


def _rank_main(rank, world, sizes, iters, warmup):
    import numpy as np
    import torch

    import rcoll.horovod.torch as hvd
    from rcoll.horovod.common import basics

    torch.set_num_threads(1)
    os.environ.update({"RANK": str(rank), "WORLD_SIZE": str(world)})
    hvd.init()
    comm = basics.job().comm
    results = []
    for nbytes in sizes:
        t = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
        x = np.ones(max(1, nbytes // 4), np.float32)
        paths = [("hvd.allreduce named", lambda t=t: hvd.allreduce(t, name="bench", op=hvd.Sum), iters),
                 ("hvd.allreduce_ named", lambda t=t: hvd.allreduce_(t, name="bench_", op=hvd.Sum), iters),
                 ("hvd.allreduce unnamed", lambda t=t: hvd.allreduce(t, op=hvd.Sum), max(500, iters // 5)),
                 ("numpy API", lambda x=x: comm.allreduce(x), iters * 4)]
        for label, fn, n in paths:
            hvd.barrier()
            med, p10 = _time(fn, n, warmup)
            results.append({"path": label, "bytes": nbytes, "median_us": med, "p10_us": p10})
    hvd.shutdown()
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iters", type=int, default=5000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--sizes", default="8,4096", help="bytes per rank, comma-separated")
    parser.add_argument("--json")
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]

    from rcoll import spawn

    results = spawn.run(_rank_main, 2, sizes, args.iters, args.warmup, timeout=1800)
    rows = results[0]
    print(f"{'path':<22} {'bytes':>7} {'median us':>10} {'p10 us':>8}")
    for r in rows:
        print(f"{r['path']:<22} {r['bytes']:>7} {r['median_us']:>10.1f} {r['p10_us']:>8.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rank0": rows, "rank1": results[1], "argv": sys.argv, "load": os.getloadavg()}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
