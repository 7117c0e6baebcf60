"""One rank of tests/hosts/test_networks.py, started in an emulated host's
namespace with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT: allreduce,
allgather and send/recv around the ring checked exactly (sizes from one
element to several pipeline chunks), then one JSON line with its transports and data interfaces, then the DONE line."""
import json
import sys

import numpy as np

import rcoll
from rcoll import _core


def main():
    comm = rcoll.init(timeout=60)
    rank, world = comm.rank, comm.size
    failures = []
    for n in (1, 1003, 3_000_001):
        got = comm.allreduce(np.arange(n, dtype=np.int64) * (rank + 1))
        if not np.array_equal(got, np.arange(n, dtype=np.int64) * (world * (world + 1) // 2)):
            failures.append(f"allreduce n={n}")
    rows = comm.allgather(np.full(777, rank, np.int32))
    if not (rows == np.arange(world, dtype=np.int32)[:, None]).all():
        failures.append("allgather")
    # Point-to-point around the ring (its own connections): sent while the receive is posted.
    for n in (1, 300_001):
        handle = comm.send(np.arange(n, dtype=np.int32) + rank, (rank + 1) % world, async_op=True)
        got = np.empty(n, np.int32)
        comm.recv(got, (rank - 1) % world)
        handle.wait()
        if not np.array_equal(got, np.arange(n, dtype=np.int32) + (rank - 1) % world):
            failures.append(f"send/recv n={n}")
    print(json.dumps({"rank": rank, "world": world, "transports": comm.transports,
                      "interfaces": _core.data_interfaces()["chosen"], "failures": failures}), flush=True)
    comm.shutdown()
    print("RCOLL-JOB-DONE", flush=True)  # tests/support/launch.py DONE
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
