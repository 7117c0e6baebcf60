"""A DeepSpeed ZeRO job on the CPU, on rcoll: deepspeed.init_distributed(
dist_backend="rcoll"). Stage 1 partitions the optimizer state, 2 the gradients
too (reduce-scatter), 3 the parameters too (gathered for each forward and
backward); the thresholds below are 0 so that even this small model's
parameters are partitioned and gathered.

Usage (under torchrun): deepspeed_zero.py --backend rcoll|gloo --stage 1|2|3.
Every rank prints `RESULT <json>` (its loss at every step, averaged over the
ranks, and the full parameters gathered at the end), which
tests/torch_backend/test_frameworks.py compares with the same job on Gloo."""
import argparse
import json
import os

import deepspeed
import torch
import torch.distributed as dist
import torch.nn as nn

import rcoll  # noqa: F401  (torch 2.4 loads no entry point; 2.5+ need no import)

parser = argparse.ArgumentParser()
parser.add_argument("--backend", default="rcoll")
parser.add_argument("--stage", type=int, default=1, choices=[1, 2, 3])
args = parser.parse_args()

deepspeed.init_distributed(dist_backend=args.backend)
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 33), nn.ReLU(), nn.Linear(33, 1))
config = {
    "train_micro_batch_size_per_gpu": 8,
    "steps_per_print": 1000,
    "zero_allow_untested_optimizer": True,  # a torch optimizer, not DeepSpeed's fused ones (they need a GPU)
    "zero_optimization": {"stage": args.stage, "reduce_bucket_size": 256, "allgather_bucket_size": 256,
                          "stage3_param_persistence_threshold": 0, "stage3_prefetch_bucket_size": 0},
}
engine, _, _, _ = deepspeed.initialize(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                                       config=config)
data = torch.Generator().manual_seed(100 + rank)
losses = []
for _step in range(6):
    x = torch.randn(8, 16, generator=data)
    loss = nn.functional.mse_loss(engine(x), x.sum(1, keepdim=True))
    engine.backward(loss)
    engine.step()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    losses.append(mean.item() / world)
with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), enabled=args.stage == 3):
    params = [p.detach().flatten().tolist() for p in engine.module.parameters()]
assert dist.get_backend() == args.backend, dist.get_backend()
print("RESULT", json.dumps({"losses": losses, "params": params}))
if args.backend == "gloo":
    # The reference run skips the interpreter's teardown. torch's Gloo aborts
    # now and then when a group that something still holds is freed at exit
    # ("terminate called without an active exception"; tests/torch_backend/journeys/ddp.py
    # says why), and DeepSpeed's engine and groups module hold theirs past
    # destroy_process_group() (1 Gloo job in ~30 aborted so). rcoll's run ends
    # as DeepSpeed users' scripts do, its groups left to the exit.
    dist.barrier()  # nothing of either rank's last op left unread
    print("RCOLL-JOB-DONE", flush=True)
    os._exit(0)
print("RCOLL-JOB-DONE", flush=True)  # the last line every rank prints (tests/support/launch.py)
