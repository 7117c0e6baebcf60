"""One rank of the torchft-style reconfiguration test (tests/failures/test_shrink.py),
run as a script: argv victim store_port out. The ranks build an
RcollProcessGroup on their own (as torchft does, not registered with torch)
over a store the test hosts, at world 3; the victim SIGKILLs itself with an
allreduce in flight. Each survivor sees the op fail and errored() report a
PeerError, calls configure() with a fresh prefix at world 2, and checks an
exact allreduce and an allgather at the new size; then writes out.<rank>."""
import json
import os
import signal
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import rcoll
from rcoll.torch_backend import RcollProcessGroup


def allreduce(pg, t):
    pg.allreduce([t]).wait()
    return t


def main():
    victim, port, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    me = int(os.environ["RANK"])
    store = dist.PrefixStore("quorum0", dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False))
    pg = RcollProcessGroup(store, me, 3, timedelta(seconds=60))
    assert allreduce(pg, torch.ones(4)).tolist() == [3.0] * 4
    x = torch.ones(1 << 20)
    if me == victim:
        pg.allreduce([x])
        time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        for _ in range(1000):
            allreduce(pg, x)
        raise AssertionError(f"rank {me} never heard of the death of rank {victim}")
    except rcoll.PeerError as e:
        error = str(e)
    errored = pg.errored()
    survivors = [r for r in range(3) if r != victim]
    rank = survivors.index(me)
    pg.configure(f"127.0.0.1:{port}/quorum1", rank, 2)
    assert (pg.getRank(), pg.getSize(), pg.errored()) == (rank, 2, None)
    total = allreduce(pg, torch.full((1001,), float(me + 1)))
    assert torch.equal(total, torch.full((1001,), float(sum(r + 1 for r in survivors))))
    outs = [torch.zeros(1), torch.zeros(1)]
    pg.allgather([outs], [torch.tensor([float(me)])]).wait()
    assert [o.item() for o in outs] == [float(r) for r in survivors]
    pg.shutdown()
    with open(f"{out}.{me}", "w") as f:
        json.dump({"error": error, "errored": f"{type(errored).__name__}: {errored}", "rank": rank}, f)
    print("RCOLL-JOB-DONE", flush=True)


if __name__ == "__main__":
    main()
