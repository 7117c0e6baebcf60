"""hvd.DistributedOptimizer: gradients reduced as backward produces them, in
fused buckets (fusion.py), before the wrapped optimizer steps."""
from __future__ import annotations

import os
import warnings
from contextlib import contextmanager

import torch

from ..common import basics as _basics
from ..common.basics import Adasum, Average
from ..common.process_sets import global_process_set
from .compression import Compression
from .fusion import fusion_threshold, plan_buckets, split_groups
from .mpi_ops import grouped_allreduce_async_, sparse_allreduce_async, synchronize
from .optimizer_adasum import _DistributedAdasumOptimizer
from .parameter_names import checked_named_parameters


class _Bucket:
    """Parameters reduced together: one grouped allreduce (one core op per dtype)."""

    __slots__ = ("params", "ready", "handle", "ctxs", "sparse")

    def __init__(self, params):
        self.params = params
        self.ready = 0
        self.handle = None
        self.ctxs = None
        self.sparse = False


class _DistributedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, named_parameters, compression, backward_passes_per_step=1, op=Average,
                 gradient_predivide_factor=1.0, groups=None, sparse_as_dense=False,
                 process_set=global_process_set):
        super(self.__class__, self).__init__(params)
        self._compression = compression
        all_params = [p for group in self.param_groups for p in group["params"]]
        named_parameters = checked_named_parameters(self.param_groups, named_parameters,
                                                    lambda i, j: f"allreduce.noname.{i}.{j}")
        if groups is not None:
            if isinstance(groups, list):
                seen = set()
                for group in groups:
                    for p in group:
                        if not isinstance(p, torch.Tensor):
                            raise ValueError("groups must consist of torch.Tensor.")
                        if id(p) in seen:
                            raise ValueError("A parameter can only appear once in groups.")
                        seen.add(id(p))
            elif not isinstance(groups, int) or groups <= 0:
                raise ValueError("groups should be a non-negative integer or a list of list of torch.Tensor.")
        self._parameter_names = {id(v): k for k, v in named_parameters}
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        self.gradient_predivide_factor = gradient_predivide_factor
        self.sparse_as_dense = sparse_as_dense
        self.process_set = process_set
        self._groups = groups
        self._synchronized = False
        self._should_synchronize = True
        self._grad_accs = []
        self._buckets = []
        self._bucket_of = {}
        self._delay = {}
        self._next_to_issue = 0
        if self.process_set.included() and (_basics.size() > 1 or os.environ.get("HOROVOD_ELASTIC") == "1"):
            self._register_hooks(all_params)

    # -- set-up ---------------------------------------------------------------------------
    def _register_hooks(self, all_params):
        trained = [p for p in all_params if p.requires_grad]
        groups = self._groups
        if isinstance(groups, int):
            groups = split_groups(trained, groups)
        # The same buckets on every rank: fusion.py orders them from the parameters' order.
        for params in plan_buckets(trained, fusion_threshold(), groups):
            bucket = _Bucket(params)
            for p in params:
                self._bucket_of[p] = bucket
            self._buckets.append(bucket)
        for p in trained:
            self._delay[p] = self.backward_passes_per_step
            grad_acc = p.expand_as(p).grad_fn.next_functions[0][0]
            grad_acc.register_hook(self._make_hook(p))
            self._grad_accs.append(grad_acc)

    def set_backward_passes_per_step(self, passes):
        self.backward_passes_per_step = passes
        for p in self._delay:
            self._delay[p] = passes

    def load_state_dict(self, *args, **kwargs):
        self._reset_buckets()
        self._synchronized = False
        self._should_synchronize = True
        for p in self._delay:
            self._delay[p] = self.backward_passes_per_step
        super(self.__class__, self).load_state_dict(*args, **kwargs)

    # -- gradients as they come -----------------------------------------------------------
    def _make_hook(self, p):
        def hook(*ignore):
            bucket = self._bucket_of[p]
            if bucket.handle is not None or self._delay[p] <= 0:
                raise AssertionError("Gradients were computed more than backward_passes_per_step times before "
                                     "call to step(). Increase backward_passes_per_step to accumulate gradients "
                                     "locally.")
            self._delay[p] -= 1
            if self._delay[p] == 0:
                bucket.ready += 1
                self._issue_ready()
        return hook

    def _issue_ready(self):
        """Issues, in bucket order, every bucket whose gradients are all ready."""
        while self._next_to_issue < len(self._buckets):
            bucket = self._buckets[self._next_to_issue]
            if bucket.ready < len(bucket.params):
                return
            self._issue(bucket)
            self._next_to_issue += 1

    def _issue(self, bucket):
        for p in bucket.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p.data)
        first = bucket.params[0]
        if first.grad.is_sparse and not self.sparse_as_dense:
            bucket.sparse = True
            bucket.handle = [sparse_allreduce_async(p.grad, name=None, op=self.op, process_set=self.process_set)
                             for p in bucket.params]
            return
        grads = [p.grad.to_dense() if p.grad.is_sparse else p.grad for p in bucket.params]
        compressed, bucket.ctxs = zip(*[self._compression.compress(g) for g in grads])
        if self.op == Average:
            pre, post = 1.0 / self.gradient_predivide_factor, self.gradient_predivide_factor
        else:
            pre, post = 1.0, 1.0
        name = f"allreduce.{self._parameter_names.get(id(first))}"
        bucket.handle = grouped_allreduce_async_(list(compressed), name=name, op=self.op, prescale_factor=pre,
                                                 postscale_factor=post, process_set=self.process_set)

    def _reset_buckets(self):
        for bucket in self._buckets:
            bucket.ready, bucket.handle, bucket.ctxs, bucket.sparse = 0, None, None, False
        self._next_to_issue = 0

    def synchronize(self):
        """Waits for every gradient's allreduce (issuing those backward did not
        produce, with zero gradients, as Horovod) and writes the results into .grad."""
        if not self.process_set.included():
            self._synchronized = True
            return
        for bucket in self._buckets:
            bucket.ready = len(bucket.params)
        self._issue_ready()
        try:
            for bucket in self._buckets:
                if bucket.sparse:
                    for p, handle in zip(bucket.params, bucket.handle):
                        reduced = handle()
                        p.grad.zero_().add_(reduced)
                    continue
                outputs = synchronize(bucket.handle)
                for p, out, ctx in zip(bucket.params, outputs, bucket.ctxs):
                    result = self._compression.decompress(out, ctx)
                    if p.grad.is_sparse:
                        p.grad = result.to_sparse()
                    elif result is not p.grad:
                        p.grad.copy_(result)
        finally:
            self._reset_buckets()
            for p in self._delay:
                self._delay[p] = self.backward_passes_per_step
        self._synchronized = True

    @contextmanager
    def skip_synchronize(self):
        """step() without synchronize(), after the caller synchronized (to clip gradients in between)."""
        self._should_synchronize = False
        try:
            yield
        finally:
            self._should_synchronize = True

    def step(self, closure=None):
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() context after "
                              "optimizer.synchronize(). This can cause training slowdown. You may want to consider "
                              "using optimizer.skip_synchronize() context if you use optimizer.synchronize() in "
                              "your code.", stacklevel=2)
            self.synchronize()
        self._synchronized = False
        return super(self.__class__, self).step(closure)

    def zero_grad(self, *args, **kwargs):
        if any(b.handle is not None for b in self._buckets) or any(b.ready for b in self._buckets):
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but before "
                                 "optimizer.step() or optimizer.synchronize(). This is prohibited as it can cause a "
                                 "race condition.")
        return super(self.__class__, self).zero_grad(*args, **kwargs)


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none, backward_passes_per_step=1,
                         op=Average, gradient_predivide_factor=1.0, num_groups=0, groups=None,
                         sparse_as_dense=False, process_set=global_process_set):
    """Wraps `optimizer` so that step() applies gradients averaged (or reduced
    with `op`) over the process set. Gradients are reduced while backward
    runs, fused into buckets (HOROVOD_FUSION_THRESHOLD bytes, or `groups`:
    lists of parameters, or `num_groups` equal runs); synchronize() waits for
    them, skip_synchronize() lets step() skip it after an explicit one.
    `backward_passes_per_step` accumulates that many backward passes locally
    first; `gradient_predivide_factor` divides before the sum and multiplies
    after (Average only); `sparse_as_dense` reduces sparse gradients densely.
    With op=hvd.Adasum the model updates are combined instead, as Horovod's
    delta optimizer does (optimizer_adasum.py)."""
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if num_groups != 0:
        warnings.warn("Parameter `num_groups` has been replaced by `groups` and will be removed in v0.23.0.",
                      DeprecationWarning, stacklevel=2)
        if groups is None:
            groups = num_groups
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    if op == Adasum and _basics.size() > 1:
        if process_set != global_process_set:
            raise NotImplementedError("Adasum does not support non-global process sets yet.")
        cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedAdasumOptimizer.__dict__))
        return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step)
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,), dict(_DistributedOptimizer.__dict__))
    return cls(optimizer.param_groups, named_parameters, compression, backward_passes_per_step, op,
               gradient_predivide_factor, groups, sparse_as_dense, process_set)
