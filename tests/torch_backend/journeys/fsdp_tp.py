"""FSDP2 (fully_shard) over tensor parallelism on a 2-D DeviceMesh, backend="rcoll".

4 ranks: mesh ("dp", "tp") = (2, 2). The model's two Linear layers are split
column- then row-wise across "tp" and sharded across "dp". Every rank checks
the trained parameters (gathered to full tensors) against one plain model
trained on the same data in this process: FSDP averages the gradients of the
two dp groups' batches, tensor parallelism computes the same sums exactly."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

import rcoll  # noqa: F401  (the one line torch 2.4 needs: it loads no entry point; 2.5+ need none)

try:
    from torch.distributed.fsdp import fully_shard
except ImportError:  # earlier releases keep FSDP2 in torch.distributed._composable
    from torch.distributed._composable.fsdp import fully_shard

dist.init_process_group("rcoll")
rank, world = dist.get_rank(), dist.get_world_size()
assert world == 4, "run with --nproc-per-node 4"
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
dp_rank = mesh["dp"].get_local_rank()


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def make():
    torch.manual_seed(0)
    return Net()


model = parallelize_module(make(), mesh["tp"], {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
fully_shard(model, mesh=mesh["dp"])
opt = torch.optim.SGD(model.parameters(), lr=0.05)
reference = make()
ref_opt = torch.optim.SGD(reference.parameters(), lr=0.05)


def batch(step, dp):
    return torch.randn(8, 16, generator=torch.Generator().manual_seed(100 * step + dp))


for step in range(3):
    opt.zero_grad()
    model(batch(step, dp_rank)).square().mean().backward()
    opt.step()
    ref_opt.zero_grad()
    (sum(reference(batch(step, d)).square().mean() for d in range(2)) / 2).backward()
    ref_opt.step()

for (name, p), q in zip(model.named_parameters(), reference.parameters()):
    torch.testing.assert_close(p.full_tensor(), q.detach(), rtol=1e-4, atol=1e-5,
                               msg=lambda m, name=name: f"rank {rank}: {name}: {m}")
dist.destroy_process_group()
print("RCOLL-JOB-DONE", flush=True)  # the last line every rank prints (tests/support/launch.py)
