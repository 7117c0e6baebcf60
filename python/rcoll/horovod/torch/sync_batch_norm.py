"""Horovod's SyncBatchNorm: batch normalization over the batches of every
rank, on CPU and CUDA tensors.

In training each rank reduces its own batch to per-channel statistics: its
row count n, n times its mean, its sum of squared deviations from its own
mean (M2, from torch.var_mean, which does not lose precision to a large
mean) and n times its squared mean. One Sum allreduce of these 3C + 1
numbers, in float64, gives every rank the same global mean and

    M2 = sum_r M2_r + (sum_r n_r mean_r^2 - N mean^2)

where only the spread of the ranks' means is found by a difference, in
float64. Backward needs the global sums of dy and dy * (x - mean) for the
input's gradient: one more allreduce of 2C numbers. The weight's and bias's
gradients are this rank's own sums, as in Horovod and torch's SyncBatchNorm
(the optimizer's allreduce combines them).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable
from torch.nn.modules.batchnorm import _BatchNorm

from ..common import basics as _basics
from ..common.basics import Sum
from .mpi_ops import allreduce_async_, synchronize


def _reduced_dims(x):
    """Every dimension but the channels' (1)."""
    return [0, *range(2, x.dim())]


def _per_channel(v, x):
    """A (C,) vector shaped to broadcast against x of shape (N, C, ...)."""
    return v.view(1, -1, *([1] * (x.dim() - 2)))


def _work_dtype(x):
    """float64 stays float64; every other floating type is computed in float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _local_moments(x, n):
    """This rank's per-channel mean and sum of squared deviations from it
    (M2), in float64, from x's own dtype: deviations from a first estimate
    of the mean are exact near the mean, and their sum corrects it, so the
    mean is accurate to a rounding of the spread rather than of the mean."""
    dims = _reduced_dims(x)
    shift = x.mean(dims)
    deviation = x - _per_channel(shift, x)
    s1 = deviation.sum(dims).double()
    s2 = deviation.square().sum(dims).double()
    return shift.double() + s1 / n, (s2 - s1 * s1 / n).clamp_min(0)


def _centered(x, mean):
    """x - mean in x's dtype, mean (float64) subtracted as a rounded part and
    the rest: near the mean the first difference is exact, so a large mean
    costs no more than a rounding of the result."""
    high = mean.to(x.dtype)
    centered = x - _per_channel(high, x)
    if x.dtype != torch.float64:
        centered = centered - _per_channel((mean - high.double()).to(x.dtype), x)
    return centered


def _allreduce_sum(flat):
    """flat summed over the ranks (with one rank: flat itself, no op)."""
    return flat if _basics.size() == 1 else synchronize(allreduce_async_(flat, op=Sum))


class _SyncBatchNormFunction(torch.autograd.Function):

    @staticmethod
    def forward(ctx, input, weight, bias, running_mean, running_var, eps, factor):
        channels = input.shape[1]
        work = _work_dtype(input)
        x = input.to(work)
        n = input.numel() // channels if channels else 0
        if n > 0:
            mean, m2 = _local_moments(x, n)
        else:  # a rank with no rows still takes part, with zeros
            mean = m2 = torch.zeros(channels, dtype=torch.float64, device=input.device)
        local = torch.cat([torch.full((1,), float(n), dtype=torch.float64, device=input.device),
                           mean * n, m2, mean * mean * n])
        total = _allreduce_sum(local)
        count, sum_x, m2_within, sum_mean_sq = total[:1], total[1:1 + channels], \
            total[1 + channels:1 + 2 * channels], total[1 + 2 * channels:]
        mean = sum_x / count
        m2 = m2_within + (sum_mean_sq - sum_x * mean).clamp_min(0)
        invstd = torch.rsqrt(m2 / count + eps)
        if running_mean is not None:
            running_mean.mul_(1 - factor).add_(mean.to(running_mean.dtype), alpha=factor)
        if running_var is not None:  # the unbiased variance, as torch's BatchNorm keeps
            running_var.mul_(1 - factor).add_((m2 / (count - 1)).to(running_var.dtype), alpha=factor)

        scale = invstd if weight is None else invstd * weight.double()
        centered = _centered(x, mean)
        if bias is None:
            out = centered * _per_channel(scale.to(work), x)
        else:
            out = torch.addcmul(_per_channel(bias.to(work), x), centered, _per_channel(scale.to(work), x))
        ctx.save_for_backward(input, weight, mean, invstd, count)
        ctx.bias_dtype = None if bias is None else bias.dtype
        return out.to(input.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        input, weight, mean, invstd, count = ctx.saved_tensors
        need_input, need_weight, need_bias = ctx.needs_input_grad[:3]
        channels = input.shape[1]
        work = _work_dtype(input)
        x, dy = input.to(work), grad_output.to(work)
        dims = _reduced_dims(x)
        centered = _centered(x, mean)
        sum_dy = dy.sum(dims)
        sum_dy_xmu = (dy * centered).sum(dims)

        grad_input = grad_weight = grad_bias = None
        if need_input:
            total = _allreduce_sum(torch.cat([sum_dy, sum_dy_xmu]).double())
            mean_dy = total[:channels] / count
            slope = total[channels:] / count * invstd * invstd
            scale = invstd if weight is None else invstd * weight.double()
            grad_input = torch.addcmul(dy - _per_channel(mean_dy.to(work), x), centered,
                                       _per_channel(slope.to(work), x), value=-1)
            grad_input = (grad_input * _per_channel(scale.to(work), x)).to(input.dtype)
        if weight is not None and need_weight:
            grad_weight = (sum_dy_xmu.double() * invstd).to(weight.dtype)
        if ctx.bias_dtype is not None and need_bias:
            grad_bias = sum_dy.to(ctx.bias_dtype)
        return grad_input, grad_weight, grad_bias, None, None, None, None


class SyncBatchNorm(_BatchNorm):
    """Batch normalization whose statistics in training are those of the batches
    of every rank together (Horovod's `hvd.SyncBatchNorm`), for inputs of shape
    (N, C), (N, C, L), (N, C, H, W), ... on CPU or CUDA. Ranks may have batches
    of different sizes, or none.

    Arguments as torch's BatchNorm: num_features (C), eps, momentum (None: a
    cumulative average), affine, track_running_stats. In training the output,
    the running statistics and num_batches_tracked are those torch's BatchNorm
    would give on the concatenation of every rank's batch; the input's gradient
    is that of the loss summed over the ranks, and the weight's and bias's
    gradients are this rank's part (to be summed or averaged by the optimizer).
    With running statistics in eval mode it is plain batch norm, on this rank
    alone. Batch statistics are always synchronized: in eval mode too when the
    module keeps no running statistics (as in Horovod). With one rank it is
    torch's batch norm.

    Every rank must call it in the same order (its allreduces are unnamed) and,
    where the input requires a gradient, run backward through it (every rank's
    backward takes part in one allreduce).
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def forward(self, input):
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average
                factor = 1.0 / float(self.num_batches_tracked)
        batch_stats = self.training or (self.running_mean is None and self.running_var is None)
        # running statistics: updated in training when tracked, read in eval mode
        keep = not self.training or self.track_running_stats
        running_mean = self.running_mean if keep else None
        running_var = self.running_var if keep else None
        if not batch_stats:
            return F.batch_norm(input, running_mean, running_var, self.weight, self.bias, batch_stats, factor,
                                self.eps)
        if self.training and _basics.size() == 1 and input.numel() // max(input.shape[1], 1) <= 1:
            raise ValueError(f"Expected more than 1 value per channel when training, got input size {input.size()}")
        return self._sync_batch_norm(input, running_mean, running_var, factor)

    @torch.jit.unused
    def _sync_batch_norm(self, input, running_mean, running_var, factor):
        return _SyncBatchNormFunction.apply(input, self.weight, self.bias, running_mean, running_var, self.eps,
                                            factor)
