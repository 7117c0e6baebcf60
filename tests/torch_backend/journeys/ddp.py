"""A DDP training job as users write it, with backend="rcoll"; a replica of the
model trained with Gloo in the same job is the reference.

Usage (under torchrun): ddp.py [--hook none|allreduce|fp16] [--no-sync]
[--static-graph] [--sparse] [--no-destroy]. --sparse: the model starts with an
nn.Embedding(sparse=True), whose gradients DDP allreduces as sparse COO tensors.
Every rank checks its parameters against the Gloo replica's (bit for bit at
world 2 without compression: a + b has one order) and prints the job-done
marker last (tests/support/launch.py)."""
import argparse
import gc
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import rcoll  # noqa: F401  (the one line torch 2.4 needs: it loads no entry point; 2.5+ need none)

parser = argparse.ArgumentParser()
parser.add_argument("--hook", default="none", choices=["none", "allreduce", "fp16"])
parser.add_argument("--no-sync", action="store_true", help="accumulate two micro-batches under no_sync()")
parser.add_argument("--static-graph", action="store_true")
parser.add_argument("--sparse", action="store_true", help="a sparse embedding (sparse gradients)")
parser.add_argument("--no-destroy", action="store_true", help="exit without destroy_process_group()")
args = parser.parse_args()

dist.init_process_group("rcoll")
rank, world = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")


class EmbeddingBagOfWords(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(50, 16, sparse=True)
        self.head = nn.Linear(16, 4)

    def forward(self, tokens):
        return self.head(self.embedding(tokens).mean(dim=1))


def make_model():
    torch.manual_seed(0)
    if args.sparse:
        return EmbeddingBagOfWords()
    return nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))


def wrap(group):
    model = DDP(make_model(), process_group=group, static_graph=args.static_graph)
    if args.hook == "allreduce":
        model.register_comm_hook(group, default_hooks.allreduce_hook)
    elif args.hook == "fp16":
        model.register_comm_hook(group, default_hooks.fp16_compress_hook)
    return model, torch.optim.SGD(model.parameters(), lr=0.05)


models = {"rcoll": wrap(None), "gloo": wrap(gloo)}
data = torch.Generator().manual_seed(1000 + rank)
for _step in range(4):
    batches = [torch.randint(0, 50, (8, 6), generator=data) if args.sparse else torch.randn(8, 16, generator=data)
               for _ in range(2 if args.no_sync else 1)]
    for model, opt in models.values():
        opt.zero_grad()
        if args.no_sync:
            with model.no_sync():
                model(batches[0]).square().mean().backward()
        model(batches[-1]).square().mean().backward()
        opt.step()

exact = world == 2 and args.hook != "fp16"
for (name, p), q in zip(models["rcoll"][0].named_parameters(), models["gloo"][0].parameters()):
    if exact:
        assert torch.equal(p, q), f"rank {rank}: {name} differs from Gloo's"
    else:
        torch.testing.assert_close(p, q, rtol=2e-3 if args.hook == "fp16" else 1e-5, atol=1e-5)
# Every rank holds the same parameters.
flat = torch.cat([p.detach().flatten() for p in models["rcoll"][0].parameters()])
gathered = [torch.empty_like(flat) for _ in range(world)]
dist.all_gather(gathered, flat)
assert all(torch.equal(g, gathered[0]) for g in gathered), f"rank {rank}: replicas diverged"
# The Gloo reference is torn down here, before exit, in both modes: its DDP
# replica first (the reducer holds the group), then the group, so that
# ProcessGroupGloo's destructor joins its worker threads now. Left to the
# interpreter's exit, torch's Gloo backend aborts the job now and then (1 job in
# ~20 with busy CPUs; a core dump shows why): a pt_gloo_runloop thread drops the
# last reference to a finished AsyncWork while the interpreter finalizes, the
# work's ThreadLocalState takes the GIL to release a Python object, CPython ends
# the thread with a forced unwind, and the unwind through that destructor is
# std::terminate ("terminate called without an active exception").
# On torch 2.4 a Gloo thread drops a comm hook's Python callback after its
# future completes, which takes the GIL; destroying the group joins it with the
# GIL held and the job hangs. Barriers, waited with the GIL released, let it.
for _ in range(3):
    dist.barrier(group=gloo)
    time.sleep(0.02)
del models["gloo"], model, opt
dist.destroy_process_group(gloo)
del gloo
gc.collect()
if not args.no_destroy:
    dist.destroy_process_group()
# --no-destroy: rcoll's group is left for the interpreter's exit to tear down.
print("RCOLL-JOB-DONE", flush=True)  # the last line every rank prints (tests/support/launch.py)
