"""hvd.elastic: ranks started after the job (RCOLL_ELASTIC_JOIN=1, the job's
store address) join at the next commit; the job goes on with them and every
rank ends with the same parameters, every sample of every epoch trained on.
tests/horovod/test_horovod.py starts the first ranks and, once they train,
the newcomers (JOINERS of them), as a scheduler adding capacity would."""
import os
import pathlib
import time

import torch

import rcoll.horovod.torch as hvd
from rcoll.horovod.common import basics

JOINERS = int(os.environ["JOINERS"])
newcomer = os.environ.get("RCOLL_ELASTIC_JOIN") == "1"
hvd.init()
first_size = hvd.size()
torch.manual_seed(hvd.rank())  # different everywhere: the first sync must make the models equal
model = torch.nn.Linear(4, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                                     named_parameters=model.named_parameters())
dataset = list(range(48))
sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=1)
state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, seen=[])
sizes_after_reset = []
state.register_reset_callbacks([lambda: sizes_after_reset.append(hvd.size())])
started = pathlib.Path(os.environ["TRAINING_FLAG"])


@hvd.elastic.run
def train(state):
    loader = torch.utils.data.DataLoader(dataset, batch_size=3, sampler=state.sampler)
    while state.epoch < 3:
        for batch_idx, batch in enumerate(loader):
            if state.epoch == 1 and batch_idx == 2 and hvd.size() == first_size and not newcomer:
                # The scheduler starts the newcomers now; rank 0 waits for them
                # to ask (the next commit admits them), so they join mid-epoch.
                started.touch()
                deadline = time.monotonic() + 60
                while hvd.rank() == 0 and basics.job().comm.joiners_waiting() < JOINERS:
                    assert time.monotonic() < deadline, "the newcomers never asked to join"
                    time.sleep(0.05)
            x = torch.stack([batch.float() / 48, (batch % 3).float(), torch.ones(len(batch)), -batch.float() / 96], 1)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
            optimizer.step()
            # Which samples every rank trained on, kept with the commit.
            state.seen = state.seen + [(state.epoch, i) for i in hvd.allgather_object(batch.tolist()) for i in i]
            state.sampler.record_batch(batch_idx, 3)
            state.commit()
        state.epoch += 1
        state.sampler.set_epoch(state.epoch)
        state.commit()


train(state)
final = first_size if newcomer else first_size + JOINERS
assert hvd.size() == final, (hvd.size(), final)
assert sizes_after_reset == ([] if newcomer else [final]), sizes_after_reset
assert newcomer == (hvd.rank() >= final - JOINERS), hvd.rank()
for epoch in range(3):  # every sample of every epoch, whatever the size of the job when it was trained on
    assert {i for e, i in state.seen if e == epoch} == set(dataset), epoch
params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]
                   + [optimizer.state[p]["momentum_buffer"].reshape(-1) for p in model.parameters()])
gathered = hvd.allgather(params.reshape(1, -1))
assert all(torch.equal(gathered[0], row) for row in gathered), gathered
hvd.shutdown()
