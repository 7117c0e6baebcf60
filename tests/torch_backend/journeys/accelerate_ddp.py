"""A Hugging Face Accelerate job on rcoll. Accelerate picks the backend itself
(on CPU gloo, or mpi) and refuses any other name given through
InitProcessGroupKwargs, but a process group initialized before Accelerator()
is used as it is: that is the way to run it on rcoll.

Usage (under torchrun): accelerate_ddp.py --backend rcoll|gloo. Every rank prints
`RESULT <json>` (losses, parameters, a gathered prediction), which
tests/torch_backend/test_frameworks.py compares with the same job on Gloo."""
import argparse
import gc
import json

import torch
import torch.distributed as dist
import torch.nn as nn

import rcoll  # noqa: F401  (torch 2.4 loads no entry point; 2.5+ need no import)

parser = argparse.ArgumentParser()
parser.add_argument("--backend", default="rcoll")
args = parser.parse_args()

dist.init_process_group(args.backend)  # before Accelerator(): Accelerate keeps this group

from accelerate import Accelerator  # noqa: E402

accelerator = Accelerator(cpu=True)
assert accelerator.num_processes == 2 and accelerator.state.distributed_type == "MULTI_CPU"
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 33), nn.ReLU(), nn.Linear(33, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
data = torch.Generator().manual_seed(0)
x = torch.randn(256, 16, generator=data)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16,
                                     shuffle=True, generator=torch.Generator().manual_seed(1))
model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
losses = []
for _epoch in range(2):
    for xb, yb in loader:
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(xb), yb)
        accelerator.backward(loss)
        optimizer.step()
        losses.append(accelerator.reduce(loss.detach(), "mean").item())
accelerator.wait_for_everyone()
with torch.no_grad():
    predictions = accelerator.gather_for_metrics(model(x[:10] + accelerator.process_index))
assert dist.get_backend() == args.backend, dist.get_backend()
print("RESULT", json.dumps({"losses": losses, "predictions": predictions.flatten().tolist(),
                            "params": [p.detach().flatten().tolist() for p in model.parameters()]}))
if args.backend == "gloo":
    # torch's Gloo aborts now and then when a group is freed at the interpreter's
    # exit ("terminate called without an active exception", 2 jobs in 5 here:
    # tests/torch_backend/journeys/ddp.py says why), and the prepared model's reducer holds
    # the group past end_training(): the reference run lets go of it first.
    accelerator.free_memory(model, optimizer)
    del model, optimizer
    gc.collect()
    dist.barrier()
accelerator.end_training()  # destroys the process group
assert not dist.is_initialized()
print("RCOLL-JOB-DONE", flush=True)  # the last line every rank prints (tests/support/launch.py)
