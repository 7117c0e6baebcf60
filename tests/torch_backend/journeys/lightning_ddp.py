"""A PyTorch Lightning job as its users write it, on rcoll: the one change is
DDPStrategy(process_group_backend="rcoll"). Lightning initializes the group,
wraps the model in DDP and shards the data with a DistributedSampler.

Usage (under torchrun): lightning_ddp.py --backend rcoll|gloo. Every rank prints
`RESULT <json>`: its losses at every step and its parameters, which
tests/torch_backend/test_frameworks.py compares with the same job on Gloo."""
import argparse
import json

import lightning as L
import torch
import torch.distributed as dist
import torch.nn as nn
from lightning.pytorch.strategies import DDPStrategy

import rcoll  # noqa: F401  (torch 2.4 loads no entry point; 2.5+ need no import)

parser = argparse.ArgumentParser()
parser.add_argument("--backend", default="rcoll")
args = parser.parse_args()


class Regression(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 33), nn.ReLU(), nn.Linear(33, 1))
        self.losses = []

    def training_step(self, batch, _batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.losses.append(loss.item())
        self.log("train_loss", loss, sync_dist=True)  # an allreduce per step, from Lightning
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


data = torch.Generator().manual_seed(0)
x = torch.randn(256, 16, generator=data)
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=16)
L.seed_everything(0, verbose=False)
model = Regression()
trainer = L.Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend=args.backend),
                    max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False)
trainer.fit(model, loader)
assert dist.get_backend() == args.backend, dist.get_backend()
print("RESULT", json.dumps({"losses": model.losses, "logged": trainer.callback_metrics["train_loss"].item(),
                            "params": [p.detach().flatten().tolist() for p in model.parameters()]}))
# No destroy_process_group: Lightning destroys only an NCCL group at exit, and rcoll's must exit cleanly without it.
print("RCOLL-JOB-DONE", flush=True)  # the last line every rank prints (tests/support/launch.py)
