"""One rank of the torch shrink test (tests/failures/test_shrink.py), run as a script
with the launcher's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

argv: victim out. Every rank trains a DDP model and runs 4 MiB all_reduces;
the victim SIGKILLs itself with one in flight. Each survivor sees the op fail,
finds the group errored() with a PeerError, calls rcoll.torch_backend.shrink(),
and on the survivors' default group checks an exact all_reduce and trains a
DDP step whose parameters agree on every survivor; it writes its report to
out.<rank>."""
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import rcoll
import rcoll.torch_backend


def ddp_step(seed):
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(16, 4))
    torch.manual_seed(seed)  # each rank its own batch
    model(torch.randn(8, 16)).sum().backward()
    with torch.no_grad():
        for p in model.parameters():
            p -= 0.1 * p.grad
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    lowest, highest = flat.clone(), flat.clone()
    dist.all_reduce(lowest, dist.ReduceOp.MIN)
    dist.all_reduce(highest, dist.ReduceOp.MAX)
    assert torch.equal(lowest, highest), "the DDP replicas differ"


def main():
    victim, out = int(sys.argv[1]), sys.argv[2]
    me = int(os.environ["RANK"])
    dist.init_process_group("rcoll")
    ddp_step(me)
    x = torch.ones(1 << 20)
    dist.all_reduce(x, dist.ReduceOp.MAX)
    if me == victim:
        dist.all_reduce(x, dist.ReduceOp.MAX, async_op=True)
        time.sleep(0.02)
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        for _ in range(1000):
            dist.all_reduce(x, dist.ReduceOp.MAX)
        raise AssertionError(f"rank {me} never heard of the death of rank {victim}")
    except rcoll.PeerError as e:
        error = f"{type(e).__name__}: {e}"
    errored = dist.group.WORLD.errored()  # the rcoll group itself
    start = time.monotonic()
    rank, size = rcoll.torch_backend.shrink()
    shrink_s = time.monotonic() - start
    members = [r for r in range(int(os.environ["WORLD_SIZE"])) if r != victim]
    assert (rank, size) == (members.index(me), len(members)) == (dist.get_rank(), dist.get_world_size())
    total = torch.full((1001,), float(me + 1))
    dist.all_reduce(total)
    assert torch.equal(total, torch.full((1001,), float(sum(r + 1 for r in members))))
    ddp_step(rank)
    dist.destroy_process_group()
    with open(f"{out}.{me}", "w") as f:
        json.dump({"error": error, "errored": f"{type(errored).__name__}: {errored}", "rank": rank, "size": size,
                   "shrink_s": shrink_s}, f)
    print("RCOLL-JOB-DONE", flush=True)


if __name__ == "__main__":
    main()
