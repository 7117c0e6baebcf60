"""One rank of tests/failures/test_link_failure.py, started with `ip netns exec <ns>`
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, RCOLL_* in the environment).
Runs allreduces of float32 (`--elements`, default 1 Mi: 4 MiB), each checked,
until `ops` are done or one fails; touches <ready>.<rank> after the first.
`--slow R:S`: rank R sleeps S seconds before its second allreduce (a slow rank,
not a dead one). `--abort R,...`: on those ranks a second thread waits for the
file <ready>.abort, which holds a wall-clock time (time.time(); every
namespace shares the clock), and at that time calls comm.abort("test abort").
Prints one JSON line: the ops done, the failure's class, message and
wall-clock time, if any, when abort() was called and returned, and when
shutdown() was."""
import argparse
import json
import os
import threading
import time

import numpy as np

import rcoll

REASON = "test abort"


def abort_at_the_signal(comm, path, out):
    while not os.path.exists(path):
        time.sleep(0.005)
    with open(path) as f:
        at = float(f.read())
    time.sleep(max(0.0, at - time.time()))
    out["abort_called"] = time.time()
    comm.abort(REASON)
    out["abort_returned"] = time.time()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("ready")
    parser.add_argument("ops", type=int)
    parser.add_argument("--elements", type=int, default=1 << 20)
    parser.add_argument("--slow", default="-1:0")
    parser.add_argument("--abort", default="")
    args = parser.parse_args()
    slow_rank, slow_seconds = int(args.slow.split(":")[0]), float(args.slow.split(":")[1])
    comm = rcoll.init(timeout=120)
    rank, world = comm.rank, comm.size
    out = {"rank": rank, "ops": 0, "wrong": 0, "error": None, "message": "", "failed_at": None,
           "abort_called": None, "abort_returned": None, "shutdown_called": None}
    aborter = None
    if str(rank) in args.abort.split(","):
        aborter = threading.Thread(target=abort_at_the_signal, args=(comm, f"{args.ready}.abort", out), daemon=True)
        aborter.start()
    x = np.empty(args.elements, np.float32)
    try:
        for i in range(args.ops):
            x.fill(rank + i)
            comm.allreduce(x)
            out["ops"] += 1
            out["wrong"] += int(not (x == world * i + world * (world - 1) / 2).all())
            if i == 0:
                open(f"{args.ready}.{rank}", "w").close()
                if rank == slow_rank:
                    time.sleep(slow_seconds)
    except rcoll.RcollError as exc:
        out.update(error=type(exc).__name__, message=str(exc), failed_at=time.time())
    if aborter is not None:
        aborter.join(timeout=30)
    out["shutdown_called"] = time.time()
    comm.shutdown()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
