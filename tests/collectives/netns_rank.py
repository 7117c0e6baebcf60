"""One rank of tests/collectives/test_mixed.py's two-namespace ring, started with
`ip netns exec <ns> python3 netns_rank.py` (RANK, WORLD_SIZE, MASTER_ADDR and
MASTER_PORT in the environment); prints one JSON line with what it saw."""
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # tests/: support

from support.reference import DTYPES, make_input, reduce_reference, same  # noqa: E402

import rcoll  # noqa: E402


def main():
    comm = rcoll.init(timeout=60)
    rank, world = comm.rank, comm.size
    failures = []
    for dtype in DTYPES:
        for n in (0, 1, 1003, 300_001):
            x = make_input(11, rank, dtype, n, "max")
            comm.allreduce(x, "max")
            want = reduce_reference(np.stack([make_input(11, r, dtype, n, "max") for r in range(world)]), dtype,
                                    "max", world)
            if not same(x, want):
                failures.append(f"allreduce max {dtype} n={n}")
    rows = comm.allgather(np.arange(1001, dtype=np.int32) + rank)
    if not (rows == np.arange(1001, dtype=np.int32)[None, :] + np.arange(world, dtype=np.int32)[:, None]).all():
        failures.append("allgather")
    print(json.dumps({"rank": rank, "transport": comm.transport, "transports": comm.transports,
                      "failures": failures}), flush=True)
    comm.shutdown()


if __name__ == "__main__":
    main()
