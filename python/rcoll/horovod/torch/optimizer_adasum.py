"""hvd.DistributedOptimizer(op=hvd.Adasum): Horovod's delta optimizer.

Adasum combines model *updates*, not gradients: as each gradient becomes
ready, the wrapped optimizer steps that one parameter locally, the change it
made (the delta) is combined across ranks with Adasum, and step() applies
the combined delta to the parameter as it was before the local step. Each
parameter is its own op (Adasum's coefficients are per tensor), named after
the parameter.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from .mpi_ops import Adasum, allreduce_async_, synchronize
from .parameter_names import checked_named_parameters


class _DistributedAdasumOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        all_params = [p for group in self.param_groups for p in group["params"]]
        # Horovod numbers unnamed parameters within their group only, here as there.
        named_parameters = checked_named_parameters(self.param_groups, named_parameters,
                                                    lambda i, j: f"allreduce.noname.{j}")
        self._names = {id(v): k for k, v in named_parameters}
        self.backward_passes_per_step = backward_passes_per_step
        self._delay = {id(p): backward_passes_per_step for p in all_params}
        self._handles = {}  # id(param) -> (param, handle, ctx); handle None: the local step is still to come
        self._start = {id(p): torch.zeros_like(p, requires_grad=False) for p in all_params}
        self._requires_update = []
        self._grad_accs = []
        for p in all_params:
            if p.requires_grad:
                p.grad = torch.zeros_like(p)
                self._requires_update.append(p)
                accumulator = p.expand_as(p).grad_fn.next_functions[0][0]
                accumulator.register_hook(self._make_hook(p))
                self._grad_accs.append(accumulator)

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for key in self._delay:
            self._delay[key] = passes

    def _delta_async(self, p):
        """Steps the wrapped optimizer on `p` alone from where it stands and
        starts combining the change with Adasum; returns (handle, ctx)."""
        start = self._start[id(p)]
        start.copy_(p.data)
        stashed = [group["params"] for group in self.param_groups]
        try:
            for group in self.param_groups:
                group["params"] = [p] if any(p is v for v in group["params"]) else []
            super(self.__class__, self).step()
        finally:
            for group, params in zip(self.param_groups, stashed):
                group["params"] = params
        p.data.sub_(start)  # the delta, in place of the parameter until step()
        compressed, ctx = self._compression.compress(p.data)
        return allreduce_async_(compressed, name=self._names[id(p)], op=Adasum), ctx

    def _make_hook(self, p):
        def hook(*_):
            entry = self._handles.get(id(p))
            if entry is not None and entry[1] is not None and self._delay[id(p)] <= 0:
                raise AssertionError("Gradients were computed more than backward_passes_per_step times before call "
                                     "to step(). Increase backward_passes_per_step to accumulate gradients locally.")
            self._delay[id(p)] -= 1
            handle, ctx = (self._delta_async(p) if self._delay[id(p)] == 0 else (None, None))
            self._handles[id(p)] = (p, handle, ctx)
        return hook

    def synchronize(self):
        pass  # the deltas are applied by step()

    @contextmanager
    def skip_synchronize(self):
        raise AssertionError("Skipping synchronization is not supported when using Adasum optimizer.")
        yield  # pragma: no cover - a generator for contextmanager

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for p in self._requires_update:
            if id(p) not in self._handles or self._handles[id(p)][1] is None:
                self._handles[id(p)] = (p, *self._delta_async(p))
        for p, handle, ctx in self._handles.values():
            delta = self._compression.decompress(synchronize(handle), ctx)
            start = self._start[id(p)]
            start.add_(delta.data)
            p.data.copy_(start)
            self._delay[id(p)] = self.backward_passes_per_step
        self._handles.clear()
        return loss

    def zero_grad(self, *args, **kwargs):
        if self._handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize(). This is prohibited as it can cause a "
                                 "race condition.")
        return super(self.__class__, self).zero_grad(*args, **kwargs)
