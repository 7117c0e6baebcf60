"""One rank of tests/test_link_failure.py, started with `ip netns exec <ns>`
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, RCOLL_* in the environment).
Runs allreduces of 4 MiB, each checked, until `ops` are done or one fails;
touches <ready>.<rank> after the first. With a third argument "R:S", rank R
sleeps S seconds before its second allreduce (a slow rank, not a dead one). Prints one JSON line: the ops done,
and the failure's class, message and wall-clock time, if any."""
import json
import sys
import time

import numpy as np

import rcoll


def main():
    ready, ops = sys.argv[1], int(sys.argv[2])
    slow_rank, slow_seconds = (int(sys.argv[3].split(":")[0]), float(sys.argv[3].split(":")[1])) \
        if len(sys.argv) > 3 else (-1, 0.0)
    comm = rcoll.init(timeout=120)
    rank, world = comm.rank, comm.size
    out = {"rank": rank, "ops": 0, "wrong": 0, "error": None, "message": "", "failed_at": None}
    x = np.empty(1 << 20, np.float32)
    try:
        for i in range(ops):
            x.fill(rank + i)
            comm.allreduce(x)
            out["ops"] += 1
            out["wrong"] += int(not (x == world * i + world * (world - 1) / 2).all())
            if i == 0:
                open(f"{ready}.{rank}", "w").close()
                if rank == slow_rank:
                    time.sleep(slow_seconds)
    except rcoll.RcollError as exc:
        out.update(error=type(exc).__name__, message=str(exc), failed_at=time.time())
    comm.shutdown()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
