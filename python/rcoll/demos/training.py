"""A real DistributedDataParallel training run on synthetic data, with
backend="rcoll" and then backend="gloo" in the same invocation: loss, time per
step for each, and whether both produced the same parameters.

    python -m rcoll train --world-size 2 --steps 30
"""
from __future__ import annotations

import time


def _train_rank(rank, world, backend, steps, hidden, batch):
    from datetime import timedelta

    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)  # ranks share the machine's cores
    dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=120))
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
        torch.nn.Linear(hidden, 10))
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(100 + rank)
    inputs = torch.randn(batch, 256, generator=gen)
    labels = torch.randint(0, 10, (batch,), generator=gen)
    losses, times = [], []
    for _step in range(steps):
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(ddp(inputs), labels)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        losses.append(loss.item())
    params = np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])
    dist.destroy_process_group()
    n_params = sum(p.numel() for p in model.parameters())
    return {"losses": losses, "times": times, "params": params, "n_params": n_params}


def run_training(world_size: int, steps: int, hidden: int, batch: int, backends, timeout: float) -> int:
    import numpy as np

    import rcoll.torch_backend  # noqa: F401  (registers "rcoll" when not installed with its entry point)
    from rcoll import spawn

    results = {}
    for backend in backends:
        out = spawn.run(_train_rank, world_size, backend, steps, hidden, batch, timeout=timeout)
        results[backend] = out
        warm = sorted(max(r["times"][i] for r in out) for i in range(min(5, steps // 2), steps))
        median_ms = warm[len(warm) // 2] * 1e3
        first, last = out[0]["losses"][0], out[0]["losses"][-1]
        print(f"{backend:>6}: {world_size} ranks, {out[0]['n_params'] / 1e6:.2f} M parameters "
              f"({out[0]['n_params'] * 4 / 2**20:.1f} MiB of gradients per step), loss {first:.4f} -> {last:.4f}, "
              f"median step {median_ms:.1f} ms")
        results[backend + "_ms"] = median_ms
    ok = True
    if "rcoll" in results and "gloo" in results:
        a, b = results["rcoll"][0]["params"], results["gloo"][0]["params"]
        same = a.tobytes() == b.tobytes()
        diff = float(np.abs(a - b).max())
        ratio = results["gloo_ms"] / results["rcoll_ms"]
        speed = f"{ratio:.2f}x faster" if ratio >= 1 else f"{1 / ratio:.2f}x slower"
        print(f"rcoll vs gloo: step time {speed}; final parameters "
              f"{'identical bit for bit' if same else f'differ by at most {diff:.3g} (summation order)'}")
        ok = same or world_size > 2
    replicas = all(r["params"].tobytes() == results[backends[0]][0]["params"].tobytes() for r in results[backends[0]])
    print(f"replicas identical across ranks: {'yes' if replicas else 'NO'}")
    return 0 if ok and replicas else 1
