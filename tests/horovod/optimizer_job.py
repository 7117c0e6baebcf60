"""hvd.DistributedOptimizer: every rank ends with the same parameters, equal to
single-process training on the union of the ranks' batches (SGD, Average)."""
import os

import torch

import rcoll.horovod.torch as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
torch.manual_seed(0)


def model():
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


local, reference = model(), model()
reference.load_state_dict(local.state_dict())
torch.manual_seed(100 + rank)  # different starting points: broadcast_parameters makes them equal
for p in local.parameters():
    p.data.add_(torch.randn_like(p))
hvd.broadcast_parameters(local.state_dict(), root_rank=0)
reference.load_state_dict(local.state_dict())
groups = int(os.environ.get("GROUPS", "0"))
opt = hvd.DistributedOptimizer(torch.optim.SGD(local.parameters(), lr=0.1, momentum=0.9),
                               named_parameters=local.named_parameters(),
                               compression=hvd.Compression.fp16 if os.environ.get("FP16") else hvd.Compression.none,
                               backward_passes_per_step=2, groups=groups or None)
hvd.broadcast_optimizer_state(opt, root_rank=0)
ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9)
gen = torch.Generator().manual_seed(7)
for _step in range(4):
    batches = [(torch.randn(8, 6, generator=gen), torch.randn(8, 3, generator=gen)) for _ in range(2 * size)]
    opt.zero_grad()
    for half in range(2):  # two backward passes per step, accumulated locally
        x, y = batches[2 * rank + half]
        torch.nn.functional.mse_loss(local(x), y).backward()
    opt.step()
    ref_opt.zero_grad()
    for x, y in batches:
        (torch.nn.functional.mse_loss(reference(x), y) / size).backward()
    ref_opt.step()
tolerance = 2e-2 if os.environ.get("FP16") else 1e-5
for (name, p), q in zip(local.named_parameters(), reference.parameters()):
    every = hvd.allgather(p.detach().unsqueeze(0), name=f"check.{name}")
    assert all(torch.equal(every[0], e) for e in every), f"rank {rank}: {name} differs across ranks"
    assert torch.allclose(p, q, atol=tolerance), f"rank {rank}: {name} differs from single-process training"
# synchronize() then step() inside skip_synchronize(): no warning, no second reduction.
opt.zero_grad()
torch.nn.functional.mse_loss(local(torch.randn(4, 6)), torch.randn(4, 3)).backward()
torch.nn.functional.mse_loss(local(torch.randn(4, 6)), torch.randn(4, 3)).backward()
opt.synchronize()
torch.nn.utils.clip_grad_norm_(local.parameters(), 1.0)
with opt.skip_synchronize():
    opt.step()
hvd.shutdown()
