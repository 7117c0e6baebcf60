"""Functional collectives inside a torch.compile'd function, backend="rcoll".

torch.compile traces all_reduce / all_gather_tensor / reduce_scatter_tensor of
torch.distributed._functional_collectives into the graph; the compiled code
then calls the process group's ops. Every rank checks the results exactly."""
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

import rcoll  # noqa: F401  (the one line torch 2.4 needs: it loads no entry point; 2.5+ need none)

dist.init_process_group("rcoll")
rank, world = dist.get_rank(), dist.get_world_size()
group = dist.group.WORLD


@torch.compile(fullgraph=True)
def step(x):
    summed = funcol.all_reduce(x * 2, "sum", group)
    gathered = funcol.all_gather_tensor(x + 1, 0, group)
    scattered = funcol.reduce_scatter_tensor(gathered, "sum", 0, group)
    return summed, gathered, scattered


for n in (4, 6):
    x = torch.arange(world * n, dtype=torch.float32) + rank
    summed, gathered, scattered = step(x)
    base = torch.arange(world * n, dtype=torch.float32)
    expect_sum = 2 * (world * base + sum(range(world)))
    expect_gather = torch.cat([base + r + 1 for r in range(world)])
    assert torch.equal(summed, expect_sum), (rank, summed, expect_sum)
    assert torch.equal(gathered, expect_gather), (rank, gathered)
    whole = world * expect_gather  # every rank contributed the same gathered tensor
    chunk = whole.numel() // world
    assert torch.equal(scattered, whole[rank * chunk:(rank + 1) * chunk]), (rank, scattered)
dist.destroy_process_group()
print("RCOLL-JOB-DONE", flush=True)  # the last line every rank prints (tests/support/launch.py)
