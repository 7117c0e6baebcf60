"""Per-rank bodies of the torch backend tests (spawned with rcoll.spawn, torchrun-style env)."""
import os
import time

import torch
import torch.distributed as dist

import rcoll.torch_backend  # noqa: F401  (the tests that check autoloading run in a subprocess)

OPS = {
    "sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "min": dist.ReduceOp.MIN, "max": dist.ReduceOp.MAX,
    "avg": dist.ReduceOp.AVG, "band": dist.ReduceOp.BAND, "bor": dist.ReduceOp.BOR, "bxor": dist.ReduceOp.BXOR,
}
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8, torch.uint8, torch.int32,
          torch.int64, torch.bool]


def _supported(dtype, op):
    if op in ("band", "bor", "bxor"):
        return not dtype.is_floating_point
    if op == "avg":
        return dtype.is_floating_point
    return True


def _input(rank, dtype, n, op, seed=0):
    g = torch.Generator().manual_seed(seed * 1000 + rank * 17 + n)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if op in ("sum", "avg"):
        lo = -3 if dtype.is_signed or dtype.is_floating_point else 0
        return torch.randint(lo, 4, (n,), generator=g).to(dtype)
    if op == "prod":
        vals = torch.tensor([1, 2, -1] if (dtype.is_signed or dtype.is_floating_point) else [1, 2, 3])
        return vals[torch.randint(0, 3, (n,), generator=g)].to(dtype)
    if dtype.is_floating_point:
        return (torch.randn(n, generator=g) * 100).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, (n,), generator=g, dtype=torch.int64).to(dtype)


def _reference(inputs, dtype, op, world):
    stack = torch.stack(inputs)
    if dtype == torch.bool:
        if op in ("sum", "max", "bor"):
            return stack.any(0)
        if op in ("prod", "min", "band"):
            return stack.all(0)
        return stack.sum(0) % 2 == 1
    if op == "avg":
        compute = torch.float64 if dtype == torch.float64 else torch.float32
        return (stack.double().sum(0).to(compute) / world).to(dtype)
    if dtype in (torch.float16, torch.bfloat16):
        stack = stack.float()
    if op == "sum":
        out = stack.sum(0, dtype=stack.dtype)
    elif op == "prod":
        out = stack.prod(0, dtype=stack.dtype)
    elif op == "min":
        out = stack.min(0).values
    elif op == "max":
        out = stack.max(0).values
    else:
        out = stack[0].clone()
        for t in stack[1:]:
            out = {"band": torch.bitwise_and, "bor": torch.bitwise_or, "bxor": torch.bitwise_xor}[op](out, t)
    return out.to(dtype)


def _same(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def _init(timeout_s=60):
    from datetime import timedelta
    dist.init_process_group("rcoll", init_method="env://", timeout=timedelta(seconds=timeout_s))
    return dist.get_rank(), dist.get_world_size()


def all_reduce_matrix(rank, world):
    _init()
    checked = _all_reduce_checks(rank, world)
    dist.destroy_process_group()
    return checked


def _all_reduce_checks(rank, world):
    """every dtype x op x size, 0-dim and non-contiguous tensors; (cases, failures)."""
    failures = []
    cases = 0
    for dtype in DTYPES:
        for op in OPS:
            if not _supported(dtype, op):
                continue
            for n in (0, 1, 7, 1000):
                cases += 1
                t = _input(rank, dtype, n, op)
                want = _reference([_input(r, dtype, n, op) for r in range(world)], dtype, op, world)
                if cases % 3 == 0:
                    dist.all_reduce(t, op=OPS[op], async_op=True).wait()
                else:
                    dist.all_reduce(t, op=OPS[op])
                if not _same(t, want):
                    failures.append(f"all_reduce {dtype} {op} n={n}: {t[:4]} != {want[:4]}")
    # 0-dim and non-contiguous tensors (Gloo 2.13 reduces the wrong elements of the latter).
    scalar = torch.tensor(float(rank + 1))
    dist.all_reduce(scalar)
    if scalar.item() != world * (world + 1) / 2:
        failures.append(f"0-dim all_reduce: {scalar}")
    base = torch.arange(40, dtype=torch.float32).reshape(10, 4) * (rank + 1)
    column = base[:, 1]
    assert not column.is_contiguous()
    dist.all_reduce(column)
    want = torch.arange(40, dtype=torch.float32).reshape(10, 4)[:, 1] * (world * (world + 1) // 2)
    if not torch.equal(column, want) or not torch.equal(base[:, 0], torch.arange(0, 40, 4).float() * (rank + 1)):
        failures.append("non-contiguous all_reduce wrong (or touched other elements)")
    return cases, failures


def collectives_tour(rank, world):
    """Every collective torch dispatches besides all_reduce, sync and async, checked."""
    _init()
    failures = []

    def check(name, ok):
        if not ok:
            failures.append(name)

    # all_reduce_coalesced (fused into one op)
    ts = [torch.full((3,), float(rank)), torch.full((5,), 2.0 * rank)]
    dist.all_reduce_coalesced(ts)
    s = sum(range(world))
    check("all_reduce_coalesced", torch.equal(ts[0], torch.full((3,), float(s))) and
          torch.equal(ts[1], torch.full((5,), 2.0 * s)))

    # all_gather (list outputs), async
    outs = [torch.empty(4, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(outs, torch.full((4,), rank, dtype=torch.int64), async_op=True).wait()
    check("all_gather", all(torch.equal(o, torch.full((4,), r, dtype=torch.int64)) for r, o in enumerate(outs)))

    # all_gather_coalesced: outputs indexed [rank][input]
    inputs = [torch.full((2,), float(rank)), torch.full((3,), 10.0 + rank)]
    out_lists = [[torch.empty(2), torch.empty(3)] for _ in range(world)]
    dist.all_gather_coalesced(out_lists, inputs)
    check("all_gather_coalesced", all(torch.equal(out_lists[r][0], torch.full((2,), float(r))) and
                                      torch.equal(out_lists[r][1], torch.full((3,), 10.0 + r)) for r in range(world)))

    # all_gather_into_tensor
    out = torch.empty(world * 3, dtype=torch.bfloat16)
    dist.all_gather_into_tensor(out, torch.full((3,), float(rank), dtype=torch.bfloat16))
    check("all_gather_into_tensor", torch.equal(out, torch.arange(world).repeat_interleave(3).to(torch.bfloat16)))

    # reduce_scatter (list input) and reduce_scatter_tensor
    out = torch.empty(2)
    dist.reduce_scatter(out, [torch.full((2,), float(r + rank)) for r in range(world)])
    check("reduce_scatter", torch.equal(out, torch.full((2,), float(world * rank + s))))
    inp = torch.arange(world * 2, dtype=torch.float64) * (rank + 1)
    out = torch.empty(2, dtype=torch.float64)
    dist.reduce_scatter_tensor(out, inp, op=dist.ReduceOp.MAX)
    check("reduce_scatter_tensor max",
          torch.equal(out, torch.arange(world * 2, dtype=torch.float64)[rank * 2:rank * 2 + 2] * world))
    # ... into non-contiguous outputs (copied back; the elements in between untouched)
    backing = torch.full((world * 6,), -1.0)
    dist.all_gather_into_tensor(backing[::2], torch.full((3,), float(rank)))
    check("all_gather_into_tensor, strided output",
          torch.equal(backing[::2], torch.arange(world).repeat_interleave(3).float()) and
          bool((backing[1::2] == -1).all()))
    backing = torch.full((4,), -1.0, dtype=torch.float64)
    dist.reduce_scatter_tensor(backing[::2], inp, op=dist.ReduceOp.MAX)
    check("reduce_scatter_tensor, strided output",
          torch.equal(backing[::2], torch.arange(world * 2, dtype=torch.float64)[rank * 2:rank * 2 + 2] * world) and
          bool((backing[1::2] == -1).all()))

    # broadcast from the last rank
    t = torch.full((6,), float(rank))
    dist.broadcast(t, src=world - 1)
    check("broadcast", torch.equal(t, torch.full((6,), float(world - 1))))

    # reduce, gather, scatter (root = last rank)
    root = world - 1
    t = torch.full((3,), float(rank + 1))
    dist.reduce(t, dst=root, op=dist.ReduceOp.SUM)
    if rank == root:
        check("reduce", torch.equal(t, torch.full((3,), float(world * (world + 1) // 2))))
    gathered = [torch.empty(2) for _ in range(world)] if rank == root else None
    dist.gather(torch.full((2,), float(rank)), gathered, dst=root)
    if rank == root:
        check("gather", all(torch.equal(g, torch.full((2,), float(r))) for r, g in enumerate(gathered)))
    out = torch.empty(2)
    dist.scatter(out, [torch.full((2,), float(r * 3)) for r in range(world)] if rank == root else None, src=root)
    check("scatter", torch.equal(out, torch.full((2,), float(rank * 3))))

    # all_to_all (lists) and all_to_all_single with uneven splits
    outs = [torch.empty(1 + r) for r in range(world)]
    dist.all_to_all(outs, [torch.full((1 + rank,), float(rank * 10 + j)) for j in range(world)])
    check("all_to_all", all(torch.equal(outs[r], torch.full((1 + r,), float(r * 10 + rank))) for r in range(world)))
    in_splits = [(rank + j) % 3 for j in range(world)]
    out_splits = [(r + rank) % 3 for r in range(world)]
    inp = torch.cat([torch.full(((rank + j) % 3, 2), float(rank * 100 + j)) for j in range(world)])
    out = torch.empty(sum(out_splits), 2)
    dist.all_to_all_single(out, inp, out_splits, in_splits)
    want = torch.cat([torch.full(((r + rank) % 3, 2), float(r * 100 + rank)) for r in range(world)])
    check("all_to_all_single uneven", torch.equal(out, want))
    out = torch.empty(world * 2)
    dist.all_to_all_single(out, torch.arange(world * 2, dtype=torch.float32) + 100 * rank)
    want = torch.cat([torch.arange(rank * 2, rank * 2 + 2, dtype=torch.float32) + 100 * r for r in range(world)])
    check("all_to_all_single even", torch.equal(out, want))

    # objects
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "x": [rank] * rank})
    check("all_gather_object", objs == [{"rank": r, "x": [r] * r} for r in range(world)])
    lst = [f"from {rank}", {"k": rank}] if rank == 0 else [None, None]
    dist.broadcast_object_list(lst, src=0)
    check("broadcast_object_list", lst == ["from 0", {"k": 0}])

    # barrier, sync and async
    dist.barrier()
    dist.barrier(async_op=True).wait()

    # Works and futures: value, is_completed, a callback that issues and waits on another collective.
    t = torch.ones(5)
    work = dist.all_reduce(t, async_op=True)
    fut = work.get_future()
    second = {}

    def chained(f):
        x = torch.ones(2)
        dist.all_reduce(x, async_op=True).wait()
        second["x"] = x
        return f.value()

    value = fut.then(chained).wait()
    check("future value", isinstance(value, list) and torch.equal(value[0], torch.full((5,), float(world))))
    check("callback collective", torch.equal(second.get("x", torch.zeros(2)), torch.full((2,), float(world))))
    check("is_completed", work.is_completed())
    dist.destroy_process_group()
    return 1, failures


def subgroups(rank, world):
    """new_group subgroups alive beside the default group."""
    _init()
    evens = dist.new_group([r for r in range(world) if r % 2 == 0])
    odds = dist.new_group([r for r in range(world) if r % 2 == 1])
    mine = evens if rank % 2 == 0 else odds
    t = torch.tensor([float(rank)])
    dist.all_reduce(t, group=mine)
    members = [r for r in range(world) if r % 2 == rank % 2]
    whole = torch.tensor([1.0])
    dist.all_reduce(whole)
    ok = t.item() == sum(members) and whole.item() == world
    dist.destroy_process_group()
    return ok


def init_methods(rank, world, method, path):
    from datetime import timedelta
    if method == "tcp":
        init = f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}"
    else:
        init = f"file://{path}"
    dist.init_process_group("rcoll", init_method=init, rank=rank, world_size=world, timeout=timedelta(seconds=60))
    t = torch.tensor([rank + 1.0])
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.item() == world * (world + 1) / 2


def unsupported_input(rank, world):
    _init()
    errors = []
    # (a float8 made by a view: torch 2.4 cannot fill float8_e4m3fnuz)
    float8 = torch.full((3,), 0x40, dtype=torch.uint8).view(torch.float8_e4m3fnuz)
    for call in (lambda: dist.all_reduce(float8),  # moved, never reduced
                 lambda: dist.all_reduce(torch.ones(3, dtype=torch.complex64), op=dist.ReduceOp.MAX),
                 lambda: dist.all_reduce(torch.ones(3), op=dist.ReduceOp.BXOR),
                 lambda: dist.all_reduce(torch.ones(3, dtype=torch.int32), op=dist.ReduceOp.AVG)):
        try:
            call()
            errors.append(None)
        except (ValueError, RuntimeError) as e:
            errors.append(str(e))
    t = torch.ones(2)
    dist.all_reduce(t)  # still usable
    # torch views complex tensors as real pairs for SUM: that works.
    c = torch.full((2,), 1 + 2j, dtype=torch.complex64)
    dist.all_reduce(c)
    dist.destroy_process_group()
    return errors, t.tolist() + [complex(x) for x in c.tolist()]


def mismatch(rank, world):
    """Rank 1 passes a different count: wait() and the future both raise."""
    _init(timeout_s=20)
    n = 100 + (1 if rank == 1 else 0)
    work = dist.all_reduce(torch.ones(n), async_op=True)
    fut = work.get_future()
    results = {}
    try:
        work.wait()
        results["wait"] = "ok"
    except Exception as e:  # noqa: BLE001
        results["wait"] = f"{type(e).__name__}: {e}"
    try:
        fut.wait()
        results["future"] = "ok"
    except Exception as e:  # noqa: BLE001
        results["future"] = f"{type(e).__name__}: {e}"
    results["exception"] = str(work.exception())
    results["is_success"] = work.is_success()
    return results


def ddp_against_gloo(rank, world, steps, hook, bucket_view, seed=0):
    """The same training over rcoll (the default group) and over a Gloo group
    beside it, in one job: (rcoll's final parameters, Gloo's). One torch
    import and one rendezvous per rank instead of two jobs."""
    _init()
    trained = _train_twice(rank, steps, hook, bucket_view, seed)
    dist.destroy_process_group()
    return trained


def torch_tour(rank, world):
    """all_reduce_matrix and ddp_against_gloo in one job (for the Soft-RoCE
    guest, where each torch import takes a minute): (checked, rcoll's, Gloo's)."""
    _init()
    checked = _all_reduce_checks(rank, world)
    mine, gloo = _train_twice(rank, 3, None, False, 0)
    dist.destroy_process_group()
    return checked, mine, gloo


def _train_twice(rank, steps, hook, bucket_view, seed):
    from support.torch_features import let_gloo_threads_finish
    mine = _train_ddp(rank, steps, hook, bucket_view, seed)
    group = dist.new_group(backend="gloo")
    gloo = _train_ddp(rank, steps, hook, bucket_view, seed, group=group)
    let_gloo_threads_finish(group)
    return mine, gloo


def _train_ddp(rank, steps, hook, bucket_view, seed, group=None):
    """Trains a small model with DDP over `group` (None: the default group);
    returns the final parameters."""
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    ddp = DDP(model, gradient_as_bucket_view=bucket_view, bucket_cap_mb=0.01, process_group=group)
    if hook == "allreduce":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(group, default_hooks.allreduce_hook)  # the hook's state: its group
    elif hook == "fp16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(group, default_hooks.fp16_compress_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1000 + rank)
    for _ in range(steps):
        x = torch.randn(16, 32, generator=g)
        y = torch.randn(16, 8, generator=g)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
    # numpy, not tensors: torch pickles tensors through shared-memory file
    # descriptors, which die with this process.
    return [p.detach().numpy().copy() for p in model.parameters()]


def ddp_peer_dies(rank, world):
    """A DDP job whose last rank dies: the survivors get a Python error, not a crash or a hang."""
    from datetime import timedelta

    from torch.nn.parallel import DistributedDataParallel as DDP
    dist.init_process_group("rcoll", init_method="env://", timeout=timedelta(seconds=30))
    model = DDP(torch.nn.Linear(256, 256))
    model(torch.randn(4, 256)).sum().backward()
    if rank == world - 1:
        os._exit(7)
    time.sleep(0.5)
    t0 = time.monotonic()
    try:
        for _ in range(5):
            model(torch.randn(4, 256)).sum().backward()
        return ("ok", "", time.monotonic() - t0)
    except Exception as e:  # noqa: BLE001
        return (type(e).__name__, str(e), time.monotonic() - t0)


def p2p_tour(rank, world):
    """send/recv, isend/irecv, batch_isend_irecv (a ring exchange), a large
    exchange in both directions at once, and receives from any source."""
    _init()
    failures = []
    nxt, prv = (rank + 1) % world, (rank - 1) % world
    # Blocking send/recv along the ring (even ranks send first).
    out, got = torch.full((5,), float(rank)), torch.empty(5)
    if rank % 2 == 0:
        dist.send(out, nxt)
        dist.recv(got, prv)
    else:
        dist.recv(got, prv)
        dist.send(out, nxt)
    if not torch.equal(got, torch.full((5,), float(prv))):
        failures.append("send/recv ring")
    # isend/irecv of 32 MiB both ways at once, beside a collective.
    big = torch.full((8 << 20,), float(rank))
    into = torch.empty(8 << 20)
    reqs = [dist.isend(big, nxt), dist.irecv(into, prv)]
    t = torch.ones(3)
    dist.all_reduce(t)
    for r in reqs:
        r.wait()
    if not torch.equal(into[:10], torch.full((10,), float(prv))) or into[-1].item() != prv:
        failures.append("isend/irecv big")
    if not torch.equal(t, torch.full((3,), float(world))):
        failures.append("all_reduce beside isend/irecv")
    # batch_isend_irecv with tags, into a non-contiguous destination.
    dest = torch.zeros(4, 2)
    ops = [dist.P2POp(dist.isend, torch.tensor([rank * 10.0, rank * 10.0 + 1, 7.0, 8.0]), nxt, tag=3),
           dist.P2POp(dist.irecv, dest[:, 1], prv, tag=3)]
    for r in dist.batch_isend_irecv(ops):
        r.wait()
    if dest[:, 1].tolist() != [prv * 10.0, prv * 10.0 + 1, 7.0, 8.0] or dest[:, 0].abs().sum() != 0:
        failures.append(f"batch_isend_irecv: {dest.tolist()}")
    # recv without src: dist.recv returns the sender, irecv's work names it.
    if rank == 0:
        senders = []
        for i in range(world - 1):
            got = torch.empty(2, dtype=torch.complex64)
            if i % 2 == 0:
                src = dist.recv(got, tag=11)
            else:
                work = dist.irecv(got, tag=11)
                work.wait()
                src = work._source_rank()
            senders.append(src)
            if got.tolist() != [complex(src, 1), complex(-src, 2)]:
                failures.append(f"recv from any source: {got.tolist()} from {src}")
        if sorted(senders) != list(range(1, world)):
            failures.append(f"recv from any source: senders {senders}")
    else:
        dist.send(torch.tensor([complex(rank, 1), complex(-rank, 2)], dtype=torch.complex64), 0, tag=11)
    dist.barrier()
    dist.destroy_process_group()
    return 1, failures


def _fsdp_model_and_batches(rank):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    g = torch.Generator().manual_seed(50 + rank)
    return model, lambda: (torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g))


def fsdp_training(rank, world, backend, steps=3):
    """fully_shard (FSDP2) on CPU: sharded parameters, all-gather and reduce-scatter every step."""
    from datetime import timedelta

    from support.torch_features import fully_shard
    fully_shard = fully_shard()
    dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=60))
    model, batch = _fsdp_model_and_batches(rank)
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        x, y = batch()
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    full = [p.full_tensor().detach().numpy().copy() for p in model.parameters()]
    dist.destroy_process_group()
    return full


def fsdp_reference(world, steps=3):
    """fsdp_training's model trained in this process on every rank's batches
    (the mean of the ranks' losses, which is what FSDP's averaged gradients
    descend): its final parameters."""
    model, _ = _fsdp_model_and_batches(0)
    batches = [_fsdp_model_and_batches(rank)[1] for rank in range(world)]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        loss = sum(torch.nn.functional.mse_loss(model(x), y) for x, y in (b() for b in batches)) / world
        loss.backward()
        opt.step()
    return [p.detach().numpy().copy() for p in model.parameters()]


def torch_timeout(rank, world):
    """Rank 1 never joins: rank 0's op fails after the group's timeout with an error naming rank 1."""
    from datetime import timedelta
    dist.init_process_group("rcoll", init_method="env://", timeout=timedelta(seconds=2))
    if rank == 1:
        time.sleep(5)
        return ("ok", "", 0)
    t0 = time.monotonic()
    work = dist.all_reduce(torch.ones(4), async_op=True)
    try:
        work.wait()
        return ("ok", "", time.monotonic() - t0)
    except Exception as e:  # noqa: BLE001
        return (type(e).__name__, str(e), time.monotonic() - t0)


def work_wait_timeout(rank, world):
    """wait(timeout) gives up while the op is still running; a later wait() gets the result."""
    from datetime import timedelta
    _init()
    if rank == 1:
        time.sleep(2)
    t = torch.ones(3)
    work = dist.all_reduce(t, async_op=True)
    outcome = {}
    if rank == 0:
        t0 = time.monotonic()
        try:
            work.wait(timedelta(seconds=0.3))
            outcome["short"] = "ok"
        except Exception as e:  # noqa: BLE001
            outcome["short"] = type(e).__name__
        outcome["short_s"] = time.monotonic() - t0
        outcome["completed_early"] = work.is_completed()
    work.wait()
    outcome["value"] = t.tolist()
    outcome["exception"] = work.exception()
    dist.destroy_process_group()
    return outcome


def blocking_work_api(rank, world):
    """A blocking call that ran inline returns a finished Work whose whole API answers."""
    _init()
    pg = dist.group.WORLD
    out = {}
    t = torch.full((5,), float(rank + 1))
    opts = dist.AllreduceOptions()
    opts.asyncOp = False
    work = pg.allreduce([t], opts)
    out["allreduce"] = t.tolist()
    b = torch.full((3,), float(rank))
    bopts = dist.BroadcastOptions()
    bopts.rootRank = world - 1
    bopts.asyncOp = False
    bwork = pg.broadcast([b], bopts)
    out["broadcast"] = b.tolist()
    for name, wk, tensor in (("allreduce", work, t), ("broadcast", bwork, b)):
        fut = wk.get_future()
        out[name + "_api"] = [wk.is_completed(), wk.is_success(), wk.exception() is None, wk.wait(),
                              wk.result()[0] is tensor, fut.done(), fut.wait()[0] is tensor,
                              wk.get_future() is fut]
    # A blocking call refused up front raises, and the group stays usable ...
    try:
        dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.AVG)
        out["error"] = None
    except Exception as e:  # noqa: BLE001
        out["error"] = str(e)
    dist.all_reduce(t)
    out["after"] = t.tolist()
    # ... and one that fails on the wire (rank 1 passes one element more) raises too.
    out["mismatch"] = None
    if world > 1:
        try:
            dist.all_reduce(torch.ones(4 + (rank == 1)))
        except Exception as e:  # noqa: BLE001
            out["mismatch"] = str(e)
    dist.destroy_process_group()
    return out


# dtypes beyond the original nine: reduced by the core (the first six), or only
# moved as bytes (the rest: reductions refuse them).
NEW_REDUCIBLE = [torch.int16, torch.uint16, torch.uint32, torch.uint64, torch.float8_e4m3fn, torch.float8_e5m2]
MOVED_ONLY = [torch.float8_e4m3fnuz, torch.float8_e5m2fnuz, torch.complex32, torch.complex64, torch.complex128]


def _pattern(rank, dtype, n):
    """n elements of `dtype` whose bytes say which rank made them (any bit pattern)."""
    size = torch.empty(0, dtype=dtype).element_size()
    raw = (torch.arange(n * size, dtype=torch.int64) * 7 + rank * 31) % 251
    return raw.to(torch.uint8).view(dtype)


def _bytes(t):
    return t.contiguous().view(torch.uint8)


def any_dtype_tour(rank, world):
    """Every data-movement op on every dtype (bytes compared), and the reductions
    of the new dtypes against numpy / ml_dtypes. Returns the failures."""
    import ml_dtypes
    import numpy as np

    _init()
    failures = []
    for dtype in NEW_REDUCIBLE + MOVED_ONLY:
        n = 5
        mine = _pattern(rank, dtype, n)
        every = [_pattern(r, dtype, n) for r in range(world)]

        def check(name, got, want, dtype=dtype):
            if not torch.equal(_bytes(got), _bytes(want)):
                failures.append(f"{dtype} {name}")

        t = mine.clone()
        dist.broadcast(t, src=world - 1)
        check("broadcast", t, every[-1])
        outs = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(outs, mine)
        for r in range(world):
            check(f"all_gather[{r}]", outs[r], every[r])
        flat = torch.empty(world * n, dtype=dtype)
        dist.all_gather_into_tensor(flat, mine)
        check("all_gather_into_tensor", flat, torch.cat([_bytes(e) for e in every]).view(dtype))
        gathered = [torch.empty_like(mine) for _ in range(world)] if rank == 0 else None
        dist.gather(mine, gathered, dst=0)
        if rank == 0:
            for r in range(world):
                check(f"gather[{r}]", gathered[r], every[r])
        got = torch.empty_like(mine)
        dist.scatter(got, [_pattern(100 + r, dtype, n) for r in range(world)] if rank == 0 else None, src=0)
        check("scatter", got, _pattern(100 + rank, dtype, n))
        a2a_in = torch.cat([_bytes(_pattern(10 * rank + r, dtype, 2)) for r in range(world)]).view(dtype)
        a2a_out = torch.empty_like(a2a_in)
        dist.all_to_all_single(a2a_out, a2a_in)
        check("all_to_all_single", a2a_out,
              torch.cat([_bytes(_pattern(10 * r + rank, dtype, 2)) for r in range(world)]).view(dtype))
        if world > 1:
            if rank == 0:
                dist.send(mine, dst=1)
            elif rank == 1:
                got = torch.empty_like(mine)
                dist.recv(got, src=0)
                check("send/recv", got, every[0])

    # Reductions of the new dtypes: values whose sums are exact in any order.
    for dtype in NEW_REDUCIBLE:
        is_float8 = dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
        np_dtype = np.dtype(getattr(ml_dtypes, str(dtype).rpartition(".")[2])) if is_float8 else \
            np.dtype(str(dtype).rpartition(".")[2])
        for op in ["sum", "prod", "min", "max"] + (["avg"] if is_float8 else ["band", "bor", "bxor"]):
            if is_float8:
                values = {"sum": [-1, 0, 1], "avg": [-1, 0, 1], "prod": [1, 2, -1]}.get(op)
                arrays = [np.random.default_rng([r, NEW_REDUCIBLE.index(dtype), len(op)]).choice(
                    values, 33).astype(np.float32).astype(np_dtype) if values else
                    (np.random.default_rng([r, 9, len(op)]).standard_normal(33) * 8).astype(np.float32).astype(np_dtype)
                    for r in range(world)]
            else:
                info = np.iinfo(np_dtype)
                arrays = [np.random.default_rng([r, NEW_REDUCIBLE.index(dtype), len(op)]).integers(
                    info.min, info.max, 33, dtype=np_dtype, endpoint=True) for r in range(world)]
            t = torch.from_numpy(arrays[rank].view(f"u{np_dtype.itemsize}").copy()).view(dtype)
            dist.all_reduce(t, op=OPS[op])
            stack = np.stack(arrays)
            with np.errstate(over="ignore"):
                if is_float8:
                    f = stack.astype(np.float32)
                    want = {"sum": f.sum(0), "prod": f.prod(0), "min": f.min(0), "max": f.max(0),
                            "avg": f.sum(0) / np.float32(world)}[op].astype(np_dtype)
                else:
                    ufunc = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum,
                             "band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}[op]
                    want = ufunc.reduce(stack, axis=0, dtype=np_dtype)
            got = t.view(getattr(torch, f"uint{8 * np_dtype.itemsize}")).numpy().view(np_dtype)
            if not np.array_equal(got.view(f"u{np_dtype.itemsize}"), want.view(f"u{np_dtype.itemsize}")):
                failures.append(f"{dtype} all_reduce {op}: {got[:4]} != {want[:4]}")
    dist.destroy_process_group()
    return failures


# (shape, sparse dims): a dense dimension, none, two sparse dimensions
SPARSE_LAYOUTS = [((20, 3), 1), ((20,), 1), ((20, 5), 2)]


def _sparse_input(rank, step):
    shape, sparse_dims = SPARSE_LAYOUTS[step % len(SPARSE_LAYOUTS)]
    g = torch.Generator().manual_seed(1000 * step + rank)
    nnz = [0, 1, 7, 12][(rank + step) % 4]  # some ranks contribute nothing
    indices = torch.stack([torch.randint(0, shape[d], (nnz,), generator=g) for d in range(sparse_dims)])  # duplicates
    values = torch.randint(-3, 4, (nnz, *shape[sparse_dims:]), generator=g).double()
    return torch.sparse_coo_tensor(indices, values, shape)


def sparse_allreduce(rank, world):
    """Sparse COO allreduce (SUM, AVG) against the sum of every rank's dense input;
    a shape mismatch raises on every rank. Returns the failures."""
    _init()
    failures = []
    for step in range(6):
        for op in ("sum", "avg"):
            t = _sparse_input(rank, step)
            work = dist.all_reduce(t, op=OPS[op], async_op=True)
            work.wait()
            want = sum(_sparse_input(r, step).to_dense() for r in range(world))
            want = want / world if op == "avg" else want
            if not (t.is_sparse and torch.equal(t.to_dense(), want)):
                failures.append(f"step {step} {op}: {t.to_dense()} != {want}")
            if not torch.equal(work.result()[0].to_dense(), want):
                failures.append(f"step {step} {op}: the Work's result differs")
    try:
        dist.all_reduce(torch.sparse_coo_tensor(torch.zeros(1, 0, dtype=torch.int64), torch.zeros(0, 3),
                                                (20 + rank, 3)))
        failures.append("a shape mismatch did not raise")
    except RuntimeError as e:
        if "shape" not in str(e) or f"rank {rank}" not in str(e):
            failures.append(f"mismatch message: {e}")
    dist.destroy_process_group()
    return failures


def works_handed_to_torch(rank, world):
    """What C++ consumers do with Works (DDP's parameter check and reducer,
    _broadcast_coalesced, a comm hook's future) and what users do (wait an
    async op, take its future): every result right, and on releases where
    rcoll holds the Works torch's C++ side uses, none held once consumed."""
    from rcoll._torch_work import _HANDED_OVER
    _init()
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))  # checks, broadcasts
    model(torch.ones(2, 4)).sum().backward()  # the reducer's buckets: futures
    t = torch.ones(3)
    dist.all_reduce(t, async_op=True).wait()
    u = torch.ones(3)
    dist.all_reduce(u, async_op=True).get_future().wait()
    out = [torch.empty(3) for _ in range(world)]
    dist.all_gather(out, t)
    dist.barrier()
    held = _HANDED_OVER._held
    dist.destroy_process_group()
    return t.tolist() == [world] * 3 and u.tolist() == [world] * 3, (len(held) if held else 0)
