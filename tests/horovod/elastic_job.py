"""hvd.elastic as a scheduler changes the job (tests/horovod/test_horovod.py
starts the ranks as a scheduler would and names the change in ELASTIC_CHANGE):

- kill: the last rank dies (SIGKILL) in the middle of the second epoch; the
  others restore the last commit and go on as the ranks that are left;
- join: once training runs (TRAINING_FLAG), JOINERS more ranks start with
  RCOLL_ELASTIC_JOIN=1 and the job's store address; every rank's next commit
  takes them in and the job goes on with them.

Either way every rank ends with the same parameters and momentum, and every
sample of every epoch was trained on, whatever the size of the job then."""
import os
import pathlib
import signal
import time

import torch

import rcoll.horovod.torch as hvd
from rcoll.horovod.common import basics

CHANGE = os.environ["ELASTIC_CHANGE"]
JOINERS = int(os.environ.get("JOINERS", "0"))
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


def change_the_job():
    if CHANGE == "kill" and hvd.rank() == first_size - 1:  # not rank 0: its process hosts the rendezvous store
        os.kill(os.getpid(), signal.SIGKILL)  # dies as a preempted VM's process does
    if CHANGE == "join":
        # The scheduler starts the newcomers now; rank 0 waits for them to
        # ask (the next commit admits them), so that they join mid-epoch.
        pathlib.Path(os.environ["TRAINING_FLAG"]).touch()
        deadline = time.monotonic() + 60
        while hvd.rank() == 0 and basics.job().comm.joiners_waiting() < JOINERS:
            assert time.monotonic() < deadline, "the newcomers never asked to join"
            time.sleep(0.05)


@hvd.elastic.run
def train(state):
    loader = torch.utils.data.DataLoader(dataset, batch_size=3, sampler=state.sampler)
    while state.epoch < 3:
        for batch_idx, batch in enumerate(loader):
            if state.epoch == 1 and batch_idx == 2 and hvd.size() == first_size and not newcomer:
                change_the_job()
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
final = first_size - 1 if CHANGE == "kill" else first_size if newcomer else first_size + JOINERS
assert hvd.size() == final, (hvd.size(), final)
assert sizes_after_reset == ([] if newcomer else [final]), sizes_after_reset
assert newcomer == (CHANGE == "join" and hvd.rank() >= final - JOINERS), hvd.rank()
for epoch in range(3):  # every sample of every epoch, whatever the size of the job when it was trained on
    assert {i for e, i in state.seen if e == epoch} == set(dataset), epoch
params = torch.cat([p.detach().reshape(-1) for p in model.parameters()]
                   + [optimizer.state[p]["momentum_buffer"].reshape(-1) for p in model.parameters()])
gathered = hvd.allgather(params.reshape(1, -1))
assert all(torch.equal(gathered[0], row) for row in gathered), gathered
hvd.shutdown()
