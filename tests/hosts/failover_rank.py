"""One rank of tests/hosts/test_failover.py, started in an emulated host's
namespace with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT:
FAILOVER_OPS allreduces of FAILOVER_BYTES back to back, each followed
by 4 MiB sent to and received from the rank on the other host, all checked
exactly, while the test takes one of the hosts' two links away (with
FAILOVER_STREAM set: point-to-point streams instead, stream()). Rank 0
touches FAILOVER_MARK once the first op is done (the test cuts the link
after that). Prints one JSON line (each op's seconds, failures), then the
DONE line."""
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

import rcoll


def stream(comm, i, failures):
    """FAILOVER_STREAM messages of 4 MiB from each rank of the first host to
    its partner on the other, all posted at once and received one by one, then
    the other way: the receiver holds whatever comes before its receive (the
    TCP transport's stash, bounded at 64 MiB), so a message sent again after a
    link failed comes behind more than that bound on the live socket."""
    rank, world = comm.rank, comm.size
    partner = (rank + world // 2) % world
    count = int(os.environ["FAILOVER_STREAM"])
    message = np.empty(1 << 20, np.float32)
    for senders in (range(world // 2), range(world // 2, world)):
        if rank in senders:
            outgoing = [np.full(1 << 20, rank * 1000 + k, np.float32) for k in range(count)]
            handles = [comm.send(m, partner, async_op=True) for m in outgoing]
            for h in handles:
                h.wait()
        else:
            for k in range(count):
                comm.recv(message, partner)
                if not (message == partner * 1000 + k).all():
                    failures.append(f"op {i}: message {k} from rank {partner} wrong")


def main():
    comm = rcoll.init(timeout=120)
    rank, world = comm.rank, comm.size
    if os.environ.get("FAILOVER_STREAM"):
        seconds, failures = [], []
        for i in range(int(os.environ.get("FAILOVER_OPS", "8"))):
            start = time.monotonic()
            stream(comm, i, failures)
            seconds.append(round(time.monotonic() - start, 3))
            if i == 0 and rank == 0:
                Path(os.environ["FAILOVER_MARK"]).touch()
        print(json.dumps({"rank": rank, "seconds": seconds, "failures": failures}), flush=True)
        comm.shutdown()
        print("RCOLL-JOB-DONE", flush=True)
        return 1 if failures else 0
    n = int(os.environ.get("FAILOVER_BYTES", str(64 << 20))) // 4
    # Integers below 2**24 in float32, whose sums over any world size here stay exact.
    mine = (np.arange(n, dtype=np.int64) % 1000 + rank).astype(np.float32)
    want = (np.arange(n, dtype=np.int64) % 1000 * world + world * (world - 1) // 2).astype(np.float32)
    got = np.empty_like(mine)
    ring = np.empty(1 << 20, np.float32)
    seconds, failures = [], []
    for i in range(int(os.environ.get("FAILOVER_OPS", "8"))):
        start = time.monotonic()
        comm.allreduce(mine, out=got)
        seconds.append(round(time.monotonic() - start, 3))
        if not np.array_equal(got, want):
            failures.append(f"op {i}: {int(np.count_nonzero(got != want))} elements wrong")
        # Point-to-point across the hosts (its own connections, one per network too).
        handle = comm.send(mine[:1 << 20], (rank + world // 2) % world, async_op=True)
        comm.recv(ring, (rank + world // 2) % world)
        handle.wait()
        if not np.array_equal(ring, mine[:1 << 20] - rank + (rank + world // 2) % world):
            failures.append(f"op {i}: send/recv wrong")
        if i == 0 and rank == 0:
            Path(os.environ["FAILOVER_MARK"]).touch()
    print(json.dumps({"rank": rank, "seconds": seconds, "failures": failures}), flush=True)
    comm.shutdown()
    print("RCOLL-JOB-DONE", flush=True)  # tests/support/launch.py DONE
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
