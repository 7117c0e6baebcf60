"""A DDP training job with backend="rcoll" that survives a torchrun restart
(tests/failures/test_restart.py).

Usage (under torchrun): restart_ddp.py DIR [--kill-local-rank L [--before-init]]. Trains a
small model for STEPS steps on data fixed by (step, rank); rank 0 writes a
checkpoint to DIR/ckpt.pt every CKPT_EVERY steps (atomically: a temporary file
renamed), and every rank starts from it when it exists. With --kill-local-rank,
that local rank of this node SIGKILLs itself after KILL_AFTER steps of the
first attempt (TORCHELASTIC_RESTART_COUNT == "0"), leaving DIR/killed.json;
with --before-init, 2 s after it started, while the others wait for it in
init_process_group (that attempt's rendezvous is left cut short).
At the end every rank checks that all ranks hold the same parameters and that
they equal, bit for bit, those of an uninterrupted run of the same job (trained
again here from the seed, over the same group), writes DIR/result-<rank>.json
and prints the job-done marker last (tests/support/launch.py)."""
# ruff: noqa: E402 (the start time is taken before the imports)
import time

started = time.time()  # before the imports: a busy machine's torch import is not the restart's delay

import argparse
import json
import os
import signal

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import rcoll  # noqa: F401  (the one line torch 2.4 needs: it loads no entry point; 2.5+ need none)

STEPS, CKPT_EVERY, KILL_AFTER = 10, 4, 6  # the kill lands after the checkpoint of step 4, before that of step 8

parser = argparse.ArgumentParser()
parser.add_argument("dir")
parser.add_argument("--kill-local-rank", type=int, default=None)
parser.add_argument("--before-init", action="store_true")
args = parser.parse_args()
restart = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
local_rank = int(os.environ["LOCAL_RANK"])
ckpt = os.path.join(args.dir, "ckpt.pt")


def die(after):
    with open(os.path.join(args.dir, "killed.json"), "w") as f:
        json.dump({"local_rank": local_rank, "restart": restart, "after": after, "at": time.time()}, f)
    os.kill(os.getpid(), signal.SIGKILL)


if args.before_init and restart == 0 and local_rank == args.kill_local_rank:
    time.sleep(2)
    die(0)

dist.init_process_group("rcoll")
rank, world = dist.get_rank(), dist.get_world_size()


def fresh():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))
    return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def train(model, opt, start, job=False):
    """Steps start..STEPS; the job's own run (job=True) checkpoints and has the victim."""
    victim = job and restart == 0 and local_rank == args.kill_local_rank and not args.before_init
    ddp = DDP(model)
    for step in range(start, STEPS):
        data = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(8, 16, generator=data), torch.randn(8, 4, generator=data)
        opt.zero_grad()
        (ddp(x) - y).square().mean().backward()
        opt.step()
        done = step + 1
        if victim and done == KILL_AFTER:
            die(done)
        if job and done % CKPT_EVERY == 0 and done < STEPS:
            if rank == 0:
                torch.save({"step": done, "model": model.state_dict(), "opt": opt.state_dict()}, ckpt + ".tmp")
                os.replace(ckpt + ".tmp", ckpt)
            dist.barrier()  # nobody goes on before the checkpoint is complete


def flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


model, opt = fresh()
resumed_from = 0
if os.path.exists(ckpt):
    state = torch.load(ckpt, weights_only=True)  # tensors and numbers only (the default from torch 2.6)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    resumed_from = state["step"]
train(model, opt, resumed_from, job=True)

# Every rank holds the same parameters ...
mine = flat(model)
gathered = [torch.empty_like(mine) for _ in range(world)]
dist.all_gather(gathered, mine)
replicas_equal = all(torch.equal(g, mine) for g in gathered)
# ... and they are those of the same job run without interruption.
reference, reference_opt = fresh()
train(reference, reference_opt, 0)
matches_reference = torch.equal(flat(reference), mine)
with open(os.path.join(args.dir, f"result-{rank}.json"), "w") as f:
    json.dump({"rank": rank, "local_rank": local_rank, "restart": restart, "resumed_from": resumed_from,
               "replicas_equal": replicas_equal, "matches_reference": matches_reference, "started": started}, f)
dist.destroy_process_group()
print("RCOLL-JOB-DONE", flush=True)  # the last line every rank prints (tests/support/launch.py)
