"""hvd.SyncBatchNorm checked on every rank against torch's BatchNorm run in one
process on the concatenation of every rank's batch (every rank generates every
rank's data from a seed). tests/horovod/test_horovod.py runs it under torchrun."""
import itertools

import torch

import rcoll.horovod.torch as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
C = 3
TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 5e-2}
# the dims after (N, C) -> the torch BatchNorm that takes them
SHAPES = [((), torch.nn.BatchNorm1d), ((5,), torch.nn.BatchNorm1d), ((4, 3), torch.nn.BatchNorm2d),
          ((2, 3, 2), torch.nn.BatchNorm3d)]
LAYOUTS = {"equal": [4] * size, "unequal": [3 + 2 * r for r in range(size)]}
if size > 1:
    LAYOUTS["one rank empty"] = [0 if r == size - 1 else 3 + r for r in range(size)]


def check(actual, expected, what, tol, dtype=None):
    """actual (of `dtype`, default expected's) is expected, to tol times expected's largest entry."""
    assert actual.shape == expected.shape, f"rank {rank}: {what}: shape {tuple(actual.shape)}"
    assert actual.dtype == (dtype or expected.dtype), f"rank {rank}: {what}: dtype {actual.dtype}"
    if expected.numel() == 0:
        return
    err = (actual.double() - expected.double()).abs().max().item()
    scale = max(1.0, expected.double().abs().max().item())
    assert err <= tol * scale, f"rank {rank}: {what}: max error {err:.3g} (tolerance {tol:g} x {scale:.3g})"


def batches(seed, counts, spatial, dtype, device):
    """Every rank's inputs (channels with large and small means and spreads) and
    upstream gradients, the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    shape = (1, C) + (1,) * len(spatial)
    offset, spread = torch.tensor([40.0, -2.0, 0.5]).view(shape), torch.tensor([3.0, 0.1, 1.0]).view(shape)
    xs = [torch.randn((n, C, *spatial), generator=g, dtype=torch.float64) * spread + offset for n in counts]
    dys = [torch.randn((n, C, *spatial), generator=g, dtype=torch.float64) for n in counts]
    return [x.to(device, dtype) for x in xs], [dy.to(device, dtype) for dy in dys]


def run_config(seed, spatial, reference, dtype, affine, counts, momentum, track, device, steps=3):
    """Training steps, then eval mode, against `reference` run in float64 on the same values: the exact
    answer for float32 inputs too (torch's float32 batch norm is itself a few 1e-5 off it where a
    channel's mean is large against its spread, as in these batches)."""
    tol = TOL[dtype]
    what = f"{spatial} {dtype} affine={affine} counts={counts} momentum={momentum} track={track} {device}"
    sync = hvd.SyncBatchNorm(C, momentum=momentum, affine=affine, track_running_stats=track).to(device, dtype)
    ref = reference(C, momentum=momentum, affine=affine, track_running_stats=track).to(device, torch.float64)
    if affine:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p, q in [(sync.weight, ref.weight), (sync.bias, ref.bias)]:
                p.copy_(torch.rand(C, generator=g) + 0.5)
                q.copy_(p)
    rows = slice(sum(counts[:rank]), sum(counts[:rank + 1]))
    for step in range(steps + 2):
        if step == steps:  # then eval mode, twice: running statistics (if any) must not move
            sync.eval()
            ref.eval()
        xs, dys = batches(seed * 100 + step, counts, spatial, dtype, device)
        x = xs[rank].clone().requires_grad_()
        x_all = torch.cat(xs).double().requires_grad_()
        out, out_all = sync(x), ref(x_all)
        check(out, out_all[rows], f"{what} step {step}: output", tol, dtype)
        (out * dys[rank]).sum().backward()
        (out_all * torch.cat(dys).double()).sum().backward()
        check(x.grad, x_all.grad[rows], f"{what} step {step}: grad_input", tol, dtype)
        if track:
            check(sync.running_mean, ref.running_mean, f"{what} step {step}: running_mean", tol, dtype)
            check(sync.running_var, ref.running_var, f"{what} step {step}: running_var", tol, dtype)
            assert sync.num_batches_tracked.item() == ref.num_batches_tracked.item() == min(step + 1, steps)
        else:
            assert sync.running_mean is None and sync.running_var is None
        if affine:  # this rank's share of the weight's and bias's gradients, summed over the ranks
            grad_w, grad_b = hvd.grouped_allreduce([sync.weight.grad, sync.bias.grad], op=hvd.Sum)
            check(grad_w, ref.weight.grad, f"{what} step {step}: grad_weight", tol, dtype)
            check(grad_b, ref.bias.grad, f"{what} step {step}: grad_bias", tol, dtype)
            with torch.no_grad():  # an SGD step on the summed gradients, the same on every rank
                for p, q, grad in [(sync.weight, ref.weight, grad_w), (sync.bias, ref.bias, grad_b)]:
                    p.sub_(0.01 * grad)
                    q.copy_(p)
                    p.grad = q.grad = None


configs = itertools.product(SHAPES, [torch.float32, torch.float64], [True, False], LAYOUTS.values())
for i, ((spatial, reference), dtype, affine, counts) in enumerate(configs):
    momentum, track = [(0.1, True), (None, True), (0.1, False)][i % 3]
    run_config(i, spatial, reference, dtype, affine, counts, momentum, track, "cpu")

# Half inputs, statistics in float32 and float64 underneath: against float32 arithmetic.
for i, dtype in enumerate([torch.float16, torch.bfloat16]):
    counts = LAYOUTS["unequal"]
    xs, dys = batches(1000 + i, counts, (4,), dtype, "cpu")
    sync = hvd.SyncBatchNorm(C)
    ref = torch.nn.BatchNorm1d(C)
    x = xs[rank].clone().requires_grad_()
    x_all = torch.cat(xs).float().requires_grad_()
    out, out_all = sync(x), ref(x_all)
    rows = slice(sum(counts[:rank]), sum(counts[:rank + 1]))
    check(out, out_all[rows], f"{dtype}: output", TOL[dtype], dtype)
    check(sync.running_mean, ref.running_mean, f"{dtype}: running_mean", TOL[dtype])
    check(sync.running_var, ref.running_var, f"{dtype}: running_var", TOL[dtype])
    (out.float() * dys[rank]).sum().backward()
    (out_all * torch.cat(dys).float()).sum().backward()
    check(x.grad, x_all.grad[rows], f"{dtype}: grad_input", TOL[dtype], dtype)

# Eval mode keeps synchronizing when the module keeps no running statistics (Horovod's rule).
counts = LAYOUTS["unequal"]
xs, _ = batches(2000, counts, (), torch.float64, "cpu")
sync = hvd.SyncBatchNorm(C, track_running_stats=False).double().eval()
ref = torch.nn.BatchNorm1d(C, track_running_stats=False).double().eval()
rows = slice(sum(counts[:rank]), sum(counts[:rank + 1]))
check(sync(xs[rank]), ref(torch.cat(xs))[rows], "eval without running statistics", 1e-10)

# The module's kind and its input check.
assert isinstance(hvd.SyncBatchNorm(C), torch.nn.modules.batchnorm._BatchNorm)
try:
    hvd.SyncBatchNorm(C)(torch.zeros(C))
    raise AssertionError("a 1-D input was accepted")
except ValueError as e:
    assert "expected at least 2D input (got 1D input)" in str(e)

# Horovod's test_horovod_sync_batch_norm, on CPU: one row per rank.
ts_list = [
    torch.stack([torch.tensor([[r, r + 1], [r * 2, r * 2 + 1], [r * 3, r * 3 + 1], [r * 4, r * 4 + 1]])
                 for r in range(size)]),
    torch.stack([torch.tensor([[r + 1], [r * 2 + 1], [r * 3 + 1], [r * 4 + 1]]) for r in range(size)]),
]
for ts in ts_list:
    sync_bn = hvd.SyncBatchNorm(num_features=4)
    bn = torch.nn.BatchNorm1d(num_features=4)
    ts = ts.float()
    ts1 = ts.clone().requires_grad_()
    ts2 = ts.clone().requires_grad_()
    if size == 1 and ts.shape[-1] == 1:  # one value per channel in all: torch refuses to train on it
        try:
            sync_bn(ts1[rank].unsqueeze(0))
            raise AssertionError("one value per channel was accepted")
        except ValueError:
            continue
    sync_bn_out = sync_bn(ts1[rank].unsqueeze(0))
    bn_out = bn(ts2)
    # Horovod's rtol of 1e-6, with an atol of 1e-6 (not 1e-8): on CPU torch's float32 batch norm
    # gives -6e-8 for the exact 0 of a middle value, and the input's gradient (that of a sum of
    # normalized values) is 0 up to rounding
    assert torch.allclose(sync_bn_out, bn_out[rank].unsqueeze(0), 1e-6, 1e-6)
    assert torch.allclose(sync_bn.running_mean, bn.running_mean, 1e-6, 1e-6)
    assert torch.allclose(sync_bn.running_var, bn.running_var, 1e-6, 1e-6)
    sync_bn_out.sum().backward()
    bn_out.mean(dim=0).sum().backward()
    assert torch.allclose(hvd.allreduce(sync_bn.weight.grad, name="sync_bn.weight.grad"), bn.weight.grad, 1e-6, 1e-6)
    assert torch.allclose(hvd.allreduce(sync_bn.bias.grad, name="sync_bn.bias.grad"), bn.bias.grad, 1e-6, 1e-6)
    assert torch.allclose(hvd.allreduce(ts1.grad, name="ts1.grad"), ts2.grad, 1e-6, 1e-6)

# CUDA tensors, where this machine and this rcoll have them.
if torch.cuda.is_available() and hvd.cuda_built():
    device = f"cuda:{hvd.local_rank() % torch.cuda.device_count()}"
    for i, ((spatial, reference), dtype) in enumerate(itertools.product(SHAPES[1:3], [torch.float32, torch.float64])):
        for j, counts in enumerate(LAYOUTS.values()):
            run_config(3000 + 10 * i + j, spatial, reference, dtype, True, counts, 0.1, True, device)

hvd.barrier()
hvd.shutdown()
