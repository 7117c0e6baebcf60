"""hvd.elastic: the last rank is killed in the middle of the second epoch;
the others restore the last commit, go on as the ranks that are left and
end with the same parameters, every sample of every epoch trained on
(tests/horovod/test_horovod.py starts the ranks as a scheduler would and kills nobody itself)."""
import os
import signal

import torch

import rcoll.horovod.torch as hvd

hvd.init()
first_size = hvd.size()
victim = first_size - 1  # not rank 0: its process hosts the rendezvous store
torch.manual_seed(0)
model = torch.nn.Linear(4, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                     named_parameters=model.named_parameters())
dataset = list(range(48))
sampler = hvd.elastic.ElasticSampler(dataset, shuffle=True, seed=1)
state = hvd.elastic.TorchState(model, optimizer, sampler=sampler, epoch=0, seen=[])
sizes_after_reset = []
state.register_reset_callbacks([lambda: sizes_after_reset.append(hvd.size())])


@hvd.elastic.run
def train(state):
    loader = torch.utils.data.DataLoader(dataset, batch_size=3, sampler=state.sampler)
    while state.epoch < 3:
        for batch_idx, batch in enumerate(loader):
            if state.epoch == 1 and batch_idx == 2 and hvd.rank() == victim and hvd.size() == first_size:
                os.kill(os.getpid(), signal.SIGKILL)  # dies as a preempted VM's process does
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
assert hvd.size() == first_size - 1 and sizes_after_reset == [first_size - 1], (hvd.size(), sizes_after_reset)
for epoch in range(3):  # every sample of every epoch, whatever the size of the job when it was trained on
    assert {i for e, i in state.seen if e == epoch} == set(dataset), epoch
params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
gathered = hvd.allgather(params.reshape(1, -1))
assert all(torch.equal(gathered[0], row) for row in gathered), gathered
hvd.shutdown()
