"""ElasticSampler: DistributedSampler's partition of a dataset over the
ranks, redone over the ranks that are left after a reset, without the
samples this epoch already processed."""
from __future__ import annotations

import math
import random

import torch.utils.data

from ...common.basics import rank, size


class ElasticSampler(torch.utils.data.Sampler):
    """Each rank's share of `dataset` (shuffled with `seed` + epoch, the same
    order on every rank). Call `record_batch(batch_idx, batch_size)` after
    each batch and `set_epoch(epoch)` at the end of an epoch; kept in a
    TorchState, it goes back to the last commit and repartitions what is
    left of the epoch after a reset."""

    def __init__(self, dataset, shuffle=True, seed=0):
        self.dataset, self.shuffle, self.seed = dataset, shuffle, seed
        self.epoch = 0
        self.processed_num = 0  # samples of this epoch processed by all ranks together
        self.reset()

    def set_epoch(self, epoch):
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx, batch_size):
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self):
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict):
        self.epoch = state_dict["epoch"]
        self.processed_num = state_dict["processed_num"]
        self.reset()

    def reset(self):
        self.num_replicas, self.rank = size(), rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = order[self.processed_num:]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def __iter__(self):
        indices = self.remaining_indices[:]
        indices += indices[:self.total_size - len(indices)]  # evenly divisible, as DistributedSampler
        return iter(indices[self.rank:self.total_size:self.num_replicas])

    def __len__(self):
        return self.num_samples
