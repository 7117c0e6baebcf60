#!/usr/bin/env python3
"""Horovod's synthetic training benchmark, on rcoll.horovod and on DDP.

The loop is the shape of Horovod's examples/pytorch/pytorch_synthetic_benchmark.py
(fixed fake images, SGD, warm-up batches, then iterations of timed batches,
images per second per rank as mean +- 1.96 std), run three ways on the same
model and data:

* `horovod`: `import rcoll.horovod.torch as hvd`, hvd.DistributedOptimizer
  (fused buckets), broadcast_parameters / broadcast_optimizer_state;
* `ddp-rcoll`, `ddp-gloo`: torch's DistributedDataParallel over
  torch.distributed with backend "rcoll" or "gloo".

As a training script, under any launcher (every rank checks at the end that
its parameters equal rank 0's):

    torchrun --nproc-per-node 2 bench/horovod_synthetic.py --path horovod
    mpirun -np 2 python bench/horovod_synthetic.py --path horovod

To compare the paths on this host (ranks started with rcoll.spawn, one path
after another, all in one run):

    PYTHONPATH=python python3 bench/horovod_synthetic.py --compare --worlds 2 [--json out.json]

and across emulated hosts (root: bench/netem.py's network namespaces, each
host's link shaped with tbf; `--worlds 4 --hosts 2` is two ranks per host,
started as a launcher would, with RANK / WORLD_SIZE / MASTER_ADDR):

    sudo PYTHONPATH=python python3 bench/horovod_synthetic.py --compare --worlds 4 --hosts 2 --rate 1gbit

torchvision is not needed: the model is a small ResNet built from torch.nn
(`--width`, `--blocks`; default 1.5 M parameters) on `--image`-pixel images,
so a step takes a fraction of a second on one CPU core.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import timeit

PATHS = ("horovod", "ddp-rcoll", "ddp-gloo")


def build_model(width, blocks, classes=1000):
    import torch.nn as nn

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            super().__init__()
            self.body = nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout),
                                      nn.ReLU(inplace=True), nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
                                      nn.BatchNorm2d(cout))
            self.skip = (nn.Sequential() if stride == 1 and cin == cout else
                         nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)))
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            return self.relu(self.body(x) + self.skip(x))

    layers = [nn.Conv2d(3, width, 3, 1, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(inplace=True)]
    cin = width
    for stage in range(4):
        cout = width * 2 ** stage
        for b in range(blocks):
            layers.append(Block(cin, cout, 2 if b == 0 and stage > 0 else 1))
            cin = cout
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)]
    return nn.Sequential(*layers)


def train(args, log=print):
    """One rank's run of the benchmark; returns (images/s per rank, mean and 1.96 std, rank, size)."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = build_model(args.width, args.blocks)
    if args.path == "horovod":
        import rcoll.horovod.torch as hvd

        hvd.init()
        rank, size = hvd.rank(), hvd.size()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01 * size)
        optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        net = model
    else:
        import torch.distributed as dist

        if args.path == "ddp-rcoll":
            import rcoll.torch_backend  # noqa: F401 - registers "rcoll"
        dist.init_process_group(args.path.split("-")[1])
        rank, size = dist.get_rank(), dist.get_world_size()
        net = torch.nn.parallel.DistributedDataParallel(model)
        optimizer = torch.optim.SGD(net.parameters(), lr=0.01 * size)
    torch.manual_seed(1 + rank)
    data = torch.randn(args.batch_size, 3, args.image, args.image)
    target = torch.randint(0, 1000, (args.batch_size,))

    def step():
        optimizer.zero_grad()
        F.cross_entropy(net(data), target).backward()
        optimizer.step()

    say = log if rank == 0 else (lambda *_: None)
    say(f"Model: resnet-like, {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters; "
        f"path {args.path}; batch size {args.batch_size}; {size} CPU rank(s)")
    timeit.timeit(step, number=args.num_warmup_batches)
    img_secs = []
    for i in range(args.num_iters):
        seconds = timeit.timeit(step, number=args.num_batches_per_iter)
        img_secs.append(args.batch_size * args.num_batches_per_iter / seconds)
        say(f"Iter #{i}: {img_secs[-1]:.1f} img/sec per CPU")
    mean, conf = float(np.mean(img_secs)), float(1.96 * np.std(img_secs))
    say(f"Img/sec per CPU: {mean:.1f} +-{conf:.1f}")
    say(f"Total img/sec on {size} CPU(s): {size * mean:.1f} +-{size * conf:.1f}")
    # Every rank ends with rank 0's parameters: the gradients were averaged.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    if args.path == "horovod":
        first = hvd.broadcast(flat, root_rank=0, name="check")
        hvd.shutdown()
    else:
        first = flat.clone()
        dist.broadcast(first, 0)
        dist.destroy_process_group()
    assert torch.equal(first, flat), f"rank {rank}: parameters differ from rank 0's after training"
    return {"path": args.path, "rank": rank, "size": size, "img_sec_mean": mean, "img_sec_conf": conf}


def _spawned(rank, world, args):
    return train(args, log=lambda *_: None)


def _on_emulated_hosts(args, path, world, cluster, port):
    """Runs one path with world / args.hosts ranks in each host's namespace (its
    own hostname too, as on a real host); returns every rank's result."""
    import subprocess
    import tempfile
    import time

    per_host = world // args.hosts
    argv = [a for a in sys.argv[1:] if a != "--compare"]
    with tempfile.TemporaryDirectory(prefix="rcoll-hvd-bench-") as tmp:
        procs = []
        for r in range(world):
            host = r // per_host
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r % per_host),
                       LOCAL_WORLD_SIZE=str(per_host), MASTER_ADDR=cluster.addr(0), MASTER_PORT=str(port),
                       RCOLL_SOCKET_IFNAME="eth0", GLOO_SOCKET_IFNAME="eth0")
            ns = cluster.ranks[host]
            procs.append(cluster.popen(host, ["unshare", "--uts", "sh", "-c", f'hostname {ns} && exec "$@"', "sh",
                                              sys.executable, os.path.abspath(__file__), *argv, "--path", path,
                                              "--result", os.path.join(tmp, f"rank{r}.json")],
                                       env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        deadline = time.monotonic() + args.timeout
        for r, proc in enumerate(procs):
            try:
                _, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                cluster.kill_all()
                raise RuntimeError(f"{path}: rank {r} did not end within {args.timeout} s") from None
            if proc.returncode != 0:
                cluster.kill_all()
                raise RuntimeError(f"{path}: rank {r} exited {proc.returncode}:\n{err[-3000:]}")
        results = []
        for r in range(world):
            with open(os.path.join(tmp, f"rank{r}.json")) as f:
                results.append(json.load(f))
        return results


def compare(args):
    from rcoll import spawn

    cluster = None
    if args.hosts > 1:
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import netem

        cluster = netem.Cluster(args.hosts, 1500, use_netem=False)
        cluster.create()
        cluster.shape(netem.parse_rate(args.rate), 0)
    rows = []
    try:
        for world in [int(w) for w in args.worlds.split(",")]:
            for n, path in enumerate(args.paths.split(",")):
                if cluster is not None:
                    results = _on_emulated_hosts(args, path, world, cluster, 29400 + 10 * world + n)
                else:
                    run_args = argparse.Namespace(**{**vars(args), "path": path})
                    results = spawn.run(_spawned, world, run_args, timeout=args.timeout)
                total = sum(r["img_sec_mean"] for r in results)
                rows.append({"world": world, "hosts": args.hosts, "path": path, "img_sec_total": total,
                             "per_rank": results})
                print(f"world {world} {path:<10} {total:8.1f} img/sec (sum over ranks)", flush=True)
    finally:
        if cluster is not None:
            cluster.close()
    print(f"\n{'world':>5} {'path':<10} {'img/sec':>9} {'vs ddp-rcoll':>13} {'vs ddp-gloo':>12}")
    for row in rows:
        base = {r["path"]: r["img_sec_total"] for r in rows if r["world"] == row["world"]}
        ratio = [f"{row['img_sec_total'] / base[p]:.3f}" if p in base else "-" for p in ("ddp-rcoll", "ddp-gloo")]
        print(f"{row['world']:>5} {row['path']:<10} {row['img_sec_total']:9.1f} {ratio[0]:>13} {ratio[1]:>12}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "argv": sys.argv, "load": os.getloadavg()}, f, indent=1)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--path", choices=PATHS, default="horovod")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--image", type=int, default=64, help="pixels per side of the fake images")
    p.add_argument("--width", type=int, default=32)
    p.add_argument("--blocks", type=int, default=1, help="residual blocks per stage")
    p.add_argument("--num-warmup-batches", type=int, default=3)
    p.add_argument("--num-batches-per-iter", type=int, default=5)
    p.add_argument("--num-iters", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--compare", action="store_true", help="run every path with rcoll.spawn and print a table")
    p.add_argument("--worlds", default="2")
    p.add_argument("--paths", default=",".join(PATHS))
    p.add_argument("--timeout", type=float, default=1200.0)
    p.add_argument("--json")
    p.add_argument("--hosts", type=int, default=1, help="with --compare: emulated hosts (root), world/hosts ranks each")
    p.add_argument("--rate", default="1gbit", help="with --hosts: each host link's rate (tbf)")
    p.add_argument("--result", help="a training rank writes its result (JSON) here")
    args = p.parse_args(argv)
    if args.compare:
        compare(args)
    else:
        result = train(args)
        if args.result:
            with open(args.result, "w") as f:
                json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
