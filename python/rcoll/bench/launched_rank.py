"""One rank of the sweep (`python -m rcoll bench`) started by an outside
launcher instead of rcoll.spawn.

    mpirun -np W ... python3 -m rcoll.bench.launched_rank --cfg cfg.json --out DIR --backend mpi --launcher mpi
    ip netns exec NS env RANK=r WORLD_SIZE=W MASTER_ADDR=... MASTER_PORT=... \\
        python3 -m rcoll.bench.launched_rank --cfg cfg.json --out DIR --backend rcoll --launcher env

It runs rank_sweep.rank_main (the same warm-up, timed iterations and check as
the spawned ranks of the sweep) and writes DIR/rank<r>.json: {"rank", "rows"} or
{"rank", "error"} with the traceback (rank_files). The exit status is 1 on an error.

`--launcher mpi` takes the rank and world size from MPI.COMM_WORLD (the sweep's
--backends mpi, mpi-shm); `--launcher env` from RANK / WORLD_SIZE, as torchrun
sets them (bench/netem.py, one rank per network namespace).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import traceback

from rcoll.bench.rank_files import write_rank_file


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cfg", required=True, help="JSON file with rank_sweep.rank_main's cfg")
    p.add_argument("--out", required=True, help="directory for rank<r>.json")
    p.add_argument("--backend", required=True)
    p.add_argument("--launcher", choices=("mpi", "env"), required=True)
    args = p.parse_args(argv)
    with open(args.cfg) as f:
        cfg = json.load(f)
    rank = -1
    try:
        if args.launcher == "mpi":
            from mpi4py import MPI
            rank, world = MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()
        else:
            rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        from rcoll.bench.rank_sweep import rank_main
        rows = rank_main(rank, world, args.backend, cfg)
        doc = {"rank": rank, "rows": rows}
        status = 0
    except BaseException as exc:  # reported to the parent through the file
        doc = {"rank": rank, "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"}
        print(f"rank {rank}: {doc['error']}", file=sys.stderr, flush=True)
        status = 1
    write_rank_file(args.out, rank, doc)
    if status and args.launcher == "mpi":
        try:  # do not leave the other ranks waiting in a collective
            from mpi4py import MPI
            MPI.COMM_WORLD.Abort(1)
        except Exception:
            pass
    return status


if __name__ == "__main__":
    sys.exit(main())
