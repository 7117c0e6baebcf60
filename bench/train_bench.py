#!/usr/bin/env python3
"""DDP training benchmark: backend "rcoll" and "gloo" side by side at world 1, 2, 4.

    PYTHONPATH=python python3 bench/train_bench.py --worlds 1,2,4 --backends rcoll,gloo \\
        [--rounds 3 --steps-per-block 3 --warmup 2] [--json /tmp/train.json]

The model is built from torch.nn alone: a decoder-only transformer language model
(token + position embeddings, `--layers` pre-norm nn.TransformerEncoderLayer with a
causal mask, a final LayerNorm and an untied output projection). The defaults
(d_model 512, 6 layers, 8 heads, feed-forward 2048, vocabulary 8192, sequence 64)
give 27.3 M parameters, so every step allreduces 109 MB of float32 gradients,
while a step of the tiny per-rank batch (2 sequences, 128 tokens) stays near
0.3 s on one core. The data are synthetic: random token sequences, different on
every rank, fixed in advance (no input pipeline is measured).

Ranks are started with rcoll.spawn.run (one process per rank on this host, RANK /
WORLD_SIZE / MASTER_ADDR set as torchrun would) and join with
init_process_group(backend, init_method="env://"). Each rank uses `--threads`
intra-op threads (default 1), and the per-rank batch is fixed (weak scaling), so
world W processes W times the samples of world 1 per step when scaling is perfect.

Method (how "communication wait" is measured)
---------------------------------------------
DDP is given one comm hook (register_comm_hook) with a switch:

* real mode: the gradient bucket is divided by the world size and allreduced
  with dist.all_reduce(async_op=True), exactly what DDP's default hook does; the
  hook also records, for each bucket, the time it was issued and the time its
  future completed (a .then() callback), so the JSON has the allreduce activity
  of each step.
* no-op mode: the hook returns an already completed future holding the bucket
  unchanged: no byte is sent, but everything else (forward, backward, the
  reducer's bucketing and copies, the optimizer step) is identical.

The timed steps are interleaved in blocks (`--rounds` x [`--steps-per-block` real
steps and as many no-op steps, real first in even rounds and no-op first in odd
ones], each block started after a barrier), so slow drifts of the machine's load
hit both modes alike. A block's time is its slowest rank's, per step; step(real)
and step(no-op) are the medians over the rounds, and

    comm wait  = median over rounds of (step(real) - step(no-op)) of that round:
                 the time a step is longer because of communication: allreduce
                 that backward compute did not hide, plus the CPU time the
                 communication took from compute (noise can make it negative)
    wait share = comm wait / step(real)
    ar busy    = per step, the time during which at least one bucket's allreduce
                 is in flight (the union of its [issued, future completed]
                 intervals; rank 0, median), as a share of step(real): overlapped
                 or not. ar busy well above wait share means backward compute hid
                 much of the communication.

samples/s = world * batch / step(real); scaling efficiency = samples/s at world W
/ (W * samples/s at world 1) of the same backend (world 1 runs DDP too, whose
allreduce over one rank is nearly free). No-op steps let the replicas drift
apart; that does not change their cost. A final real step checks that every
rank ended with the same averaged gradients (rank checksums compared).

Caveat: on this project's 2-core VM, world 2 already uses both cores for compute,
so the communication threads (rcoll's progress thread, gloo's) compete with
compute rather than overlap it, and world 4 oversubscribes the cores 2x: the
efficiency there measures the CPU as much as the library.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import sys
import time


# ---------------------------------------------------------------------------------------------
# model (torch.nn only)
# ---------------------------------------------------------------------------------------------
def build_model(cfg):
    import torch
    import torch.nn as nn

    class TinyLM(nn.Module):
        def __init__(self, vocab, d, layers, heads, ff, seq):
            super().__init__()
            self.tok = nn.Embedding(vocab, d)
            self.pos = nn.Embedding(seq, d)
            layer = nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True, norm_first=True)
            self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
            self.norm = nn.LayerNorm(d)
            self.head = nn.Linear(d, vocab)
            self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(seq), persistent=False)
            self.register_buffer("positions", torch.arange(seq), persistent=False)

        def forward(self, x):
            n = x.shape[1]
            h = self.tok(x) + self.pos(self.positions[:n])
            h = self.blocks(h, mask=self.mask[:n, :n], is_causal=True)
            return self.head(self.norm(h))

    return TinyLM(cfg["vocab"], cfg["d_model"], cfg["layers"], cfg["heads"], cfg["ff"], cfg["seq"])


# ---------------------------------------------------------------------------------------------
# one rank
# ---------------------------------------------------------------------------------------------
class HookState:
    def __init__(self, world):
        self.world = world
        self.mode = "real"
        self.events = []  # (issue, done) perf_counter times of the current step's buckets


def busy_time(events):
    """Seconds covered by the union of the [issue, done] intervals: time with an allreduce in flight."""
    total, end = 0.0, None
    for t0, t1 in sorted(events):
        if end is None or t0 > end:
            total += t1 - t0
            end = t1
        elif t1 > end:
            total += t1 - end
            end = t1
    return total


def switch_hook(state, bucket):
    import torch
    import torch.distributed as dist

    buf = bucket.buffer()
    if state.mode == "noop":
        fut = torch.futures.Future()
        fut.set_result(buf)
        return fut
    t0 = time.perf_counter()
    buf.div_(state.world)
    fut = dist.all_reduce(buf, async_op=True).get_future()

    def done(f):
        state.events.append((t0, time.perf_counter()))
        return f.value()[0]
    return fut.then(done)


def train_rank(rank, world, backend, cfg):
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    if backend == "rcoll":
        import rcoll.torch_backend  # noqa: F401  (registers "rcoll" when rcoll is not pip-installed)
    torch.set_num_threads(cfg["threads"])
    dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=cfg["op_timeout"]))
    try:
        torch.manual_seed(0)
        model = build_model(cfg)
        n_params = sum(p.numel() for p in model.parameters())
        ddp = DDP(model, bucket_cap_mb=cfg["bucket_mb"])
        state = HookState(world)
        ddp.register_comm_hook(state, switch_hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-3, momentum=0.9)
        gen = torch.Generator().manual_seed(1000 + rank)
        batches = [torch.randint(0, cfg["vocab"], (cfg["batch"], cfg["seq"] + 1), generator=gen) for _ in range(4)]
        step_no = [0]

        def step():
            x = batches[step_no[0] % len(batches)]
            step_no[0] += 1
            opt.zero_grad(set_to_none=False)
            logits = ddp(x[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, cfg["vocab"]), x[:, 1:].reshape(-1))
            loss.backward()
            opt.step()
            return loss

        def block(mode, n):
            """Per-step seconds of n steps in `mode` (after a barrier), and the per-step allreduce busy times."""
            state.mode = mode
            dist.barrier()
            spans = []
            t0 = time.perf_counter()
            for _ in range(n):
                state.events = []
                step()
                spans.append(busy_time(state.events))
            return (time.perf_counter() - t0) / n, spans

        for _ in range(cfg["warmup"]):  # warm-up: both modes, so both code paths are warm
            block("real", 1)
            block("noop", 1)
        real, noop, spans = [], [], []
        for i in range(cfg["rounds"]):
            # alternate which mode goes first, so that a drift of the machine's load within a
            # round falls on both modes alike
            for mode in (("real", "noop") if i % 2 == 0 else ("noop", "real")):
                t, s = block(mode, cfg["steps_per_block"])
                if mode == "real":
                    real.append(t)
                    spans += s
                else:
                    noop.append(t)

        # correctness: one real step; every rank must hold the same averaged gradients
        state.mode = "real"
        dist.barrier()
        loss = step()
        sums = torch.tensor([float(sum(p.grad.double().sum() for p in model.parameters()))], dtype=torch.float64)
        gathered = [torch.zeros(1, dtype=torch.float64) for _ in range(world)]
        dist.all_gather(gathered, sums)
        grads_equal = all(float(g) == float(gathered[0]) for g in gathered)
        buckets = len(state.events)
        return {"rank": rank, "real_s": real, "noop_s": noop, "ar_busy_s": spans, "n_params": n_params,
                "grads_equal": grads_equal, "buckets_per_step": buckets, "final_loss": loss.item()}
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------
# parent
# ---------------------------------------------------------------------------------------------
def summarize(per_rank, world, cfg):
    rounds = len(per_rank[0]["real_s"])
    real = statistics.median(max(r["real_s"][i] for r in per_rank) for i in range(rounds))
    noop = statistics.median(max(r["noop_s"][i] for r in per_rank) for i in range(rounds))
    spans = per_rank[0]["ar_busy_s"]
    busy = statistics.median(spans) if spans else 0.0
    # paired per round (the real and no-op blocks of one round ran back to back), then the median
    wait = statistics.median(max(r["real_s"][i] for r in per_rank) - max(r["noop_s"][i] for r in per_rank)
                             for i in range(rounds))
    return {
        "world": world, "step_real_ms": real * 1e3, "step_noop_ms": noop * 1e3,
        "comm_wait_ms": wait * 1e3, "wait_share": wait / real if real > 0 else 0.0,
        "ar_busy_ms": busy * 1e3, "ar_busy_share": busy / real if real > 0 else 0.0,
        "samples_per_s": world * cfg["batch"] / real, "tokens_per_s": world * cfg["batch"] * cfg["seq"] / real,
        "n_params": per_rank[0]["n_params"], "grads_equal": all(r["grads_equal"] for r in per_rank),
        "buckets_per_step": per_rank[0]["buckets_per_step"],
        "per_rank": per_rank,
    }


def fmt_table(summary, backends, worlds, cfg):
    any_row = next(iter(s for b in backends for s in summary.get(b, {}).values()), None)
    n = any_row["n_params"] if any_row else 0
    lines = [f"# bench/train_bench.py: DDP, TinyLM {n / 1e6:.1f} M params ({n * 4 / 1e6:.0f} MB of fp32 gradients "
             f"per step), batch {cfg['batch']} x seq {cfg['seq']} per rank, {cfg['threads']} thread(s) per rank, "
             f"bucket {cfg['bucket_mb']} MB, cpus {os.cpu_count()}",
             "# step = median over rounds of the slowest rank; eff = samples/s / (world * samples/s at world 1); "
             "wait = step(real) - step(no-op comm hook); ar busy = time with an allreduce in flight",
             f"{'backend':>8} {'world':>5} {'step ms':>8} {'no-op ms':>8} {'samples/s':>9} {'eff':>5} "
             f"{'wait ms':>8} {'wait %':>6} {'ar busy %':>9} {'grads ok':>8}"]
    for b in backends:
        base = summary.get(b, {}).get(1)
        for w in worlds:
            s = summary.get(b, {}).get(w)
            if s is None:
                lines.append(f"{b:>8} {w:>5} {'failed':>8}")
                continue
            eff = f"{s['samples_per_s'] / (w * base['samples_per_s']):.2f}" if base else "-"
            lines.append(f"{b:>8} {w:>5} {s['step_real_ms']:>8.0f} {s['step_noop_ms']:>8.0f} "
                         f"{s['samples_per_s']:>9.2f} {eff:>5} {s['comm_wait_ms']:>8.0f} "
                         f"{100 * s['wait_share']:>5.0f}% {100 * s['ar_busy_share']:>8.0f}% "
                         f"{'yes' if s['grads_equal'] else 'NO':>8}")
    if len(backends) > 1 and "rcoll" in backends:
        for other in backends:
            if other == "rcoll":
                continue
            parts = []
            for w in worlds:
                a, c = summary.get("rcoll", {}).get(w), summary.get(other, {}).get(w)
                if a and c:
                    parts.append(f"world {w} {a['samples_per_s'] / c['samples_per_s']:.2f}x")
            if parts:
                lines.append(f"# rcoll/{other} samples/s: " + ", ".join(parts))
    if any(w > (os.cpu_count() or 1) for w in worlds):
        lines.append(f"# world > {os.cpu_count()} cpus is oversubscribed: its efficiency measures CPU sharing too")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worlds", default="1,2,4")
    p.add_argument("--backends", default="rcoll,gloo")
    p.add_argument("--rounds", type=int, default=6, help="rounds of (real block, no-op block), order alternating")
    p.add_argument("--steps-per-block", type=int, default=2)
    p.add_argument("--warmup", type=int, default=2, help="warm-up steps in each mode")
    p.add_argument("--batch", type=int, default=2, help="sequences per rank per step")
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--ff", type=int, default=2048)
    p.add_argument("--bucket-mb", type=float, default=25.0, help="DDP bucket_cap_mb")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads per rank")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds one (backend, world) run may take")
    p.add_argument("--op-timeout", type=float, default=300.0, help="init_process_group timeout")
    p.add_argument("--json", help="write everything to this JSON file")
    args = p.parse_args(argv)

    worlds = [int(w) for w in args.worlds.split(",") if w.strip()]
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if not worlds or min(worlds) < 1:
        p.error("--worlds: positive sizes")
    try:
        import torch  # noqa: F401
        import torch.distributed as dist  # noqa: F401

        from rcoll import spawn
    except ImportError as exc:
        print(f"error: needs torch and rcoll ({exc}); run with PYTHONPATH=<repo>/python", file=sys.stderr)
        return 2
    cfg = {"batch": args.batch, "seq": args.seq, "vocab": args.vocab, "d_model": args.d_model,
           "layers": args.layers, "heads": args.heads, "ff": args.ff, "bucket_mb": args.bucket_mb,
           "threads": args.threads, "rounds": args.rounds, "steps_per_block": args.steps_per_block,
           "warmup": args.warmup, "op_timeout": args.op_timeout}
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from sweep import load_line, load_snapshot
    load_before = load_snapshot()
    summary, errors = {}, {}
    runs = [(b, w) for w in worlds for b in backends]
    for i, (b, w) in enumerate(runs, 1):
        print(f"=== [{i}/{len(runs)}] {b}, world {w}: {args.warmup} warm-up + {args.rounds} x "
              f"({args.steps_per_block} real + {args.steps_per_block} no-op) steps", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        try:
            per_rank = spawn.run(train_rank, w, b, cfg, timeout=args.timeout,
                                 env={"RCOLL_CONNECT_TIMEOUT": os.environ.get("RCOLL_CONNECT_TIMEOUT", "60")})
            s = summarize(per_rank, w, cfg)
            summary.setdefault(b, {})[w] = s
            print(f"    step {s['step_real_ms']:.0f} ms (no-op comm {s['step_noop_ms']:.0f} ms), "
                  f"{s['samples_per_s']:.2f} samples/s, {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
        except Exception as exc:
            errors[f"{b}/{w}"] = f"{type(exc).__name__}: {exc}"
            print(f"ERROR: {b} world {w}: {exc}", file=sys.stderr, flush=True)
    load_after = load_snapshot()
    print(fmt_table(summary, backends, worlds, cfg))
    print(load_line(load_before, load_after))
    for k, v in errors.items():
        print(f"# {k} FAILED: {v.splitlines()[0]}")
    if args.json:
        import platform
        doc = {"args": vars(args), "cfg": cfg, "summary": summary, "errors": errors,
               "load_before": load_before, "load_after": load_after,
               "machine": {"nproc": os.cpu_count(), "platform": platform.platform(), "torch": torch.__version__,
                           "python": sys.version.split()[0]},
               "created": datetime.datetime.now().isoformat(timespec="seconds")}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1, default=str)
        print(f"results written to {args.json}", file=sys.stderr)
    bad = errors or any(not s["grads_equal"] for d in summary.values() for s in d.values())
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
