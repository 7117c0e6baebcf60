"""Per-rank bodies of the real-GPU collective tests (tests/device/test_cuda_collectives.py).

Every rank uses GPU `rank % device_count` (two ranks may share one GPU), torch
CUDA tensors and backend "rcoll". Inputs and references are built on the CPU
with the torch backend tests' helpers, then moved to the GPU; results come
back to the CPU only to be compared exactly.
"""
import torch
import torch.distributed as dist
from support.device_workers import expected_path
from support.torch_workers import DTYPES, OPS, _input, _reference, _same, _supported

import rcoll.torch_backend  # noqa: F401


def _check_path(world, failures):
    """Device ops of ranks on one host go through CUDA IPC (unless turned off)."""
    path = rcoll.torch_backend.device_path()
    if path != expected_path(world):
        failures.append(f"device ops went through {path!r}, expected {expected_path(world)!r}")


def _init(rank):
    from datetime import timedelta
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("rcoll", init_method="env://", timeout=timedelta(seconds=120))
    return torch.device("cuda", torch.cuda.current_device())


def all_reduce_matrix(rank, world):
    device = _init(rank)
    failures, cases = [], 0
    for dtype in DTYPES:
        for op in OPS:
            if not _supported(dtype, op):
                continue
            for n in (0, 1, 7, 1001, 3 * world + 1, 300007):
                cases += 1
                t = _input(rank, dtype, n, op).to(device)
                want = _reference([_input(r, dtype, n, op) for r in range(world)], dtype, op, world)
                if cases % 2:
                    dist.all_reduce(t, op=OPS[op])
                else:
                    dist.all_reduce(t, op=OPS[op], async_op=True).wait()
                if not _same(t.cpu(), want):
                    failures.append(f"all_reduce {dtype} {op} n={n}")
    _check_path(world, failures)
    dist.destroy_process_group()
    return cases, failures


def other_collectives(rank, world):
    device = _init(rank)
    failures, cases = [], 0

    def check(name, ok):
        nonlocal cases
        cases += 1
        if not ok:
            failures.append(name)

    for n in (1, 1001, 300007):
        outs = [torch.empty(n, dtype=torch.float32, device=device) for _ in range(world)]
        dist.all_gather(outs, torch.full((n,), float(rank), device=device))
        check(f"all_gather n={n}", all(torch.equal(o.cpu(), torch.full((n,), float(r))) for r, o in enumerate(outs)))

        out = torch.empty(world * n, dtype=torch.int32, device=device)
        dist.all_gather_into_tensor(out, torch.full((n,), rank, dtype=torch.int32, device=device))
        check(f"all_gather_into_tensor n={n}",
              torch.equal(out.cpu(), torch.arange(world, dtype=torch.int32).repeat_interleave(n)))

        for root in range(world):
            b = torch.full((n,), float(rank + 10), dtype=torch.bfloat16, device=device)
            dist.broadcast(b, src=root)
            check(f"broadcast n={n} root={root}", torch.equal(b.cpu(), torch.full((n,), float(root + 10),
                                                                                   dtype=torch.bfloat16)))

        inp = torch.arange(world * n, dtype=torch.float32, device=device) * (rank + 1)
        got = torch.empty(n, dtype=torch.float32, device=device)
        dist.reduce_scatter_tensor(got, inp)
        want = (torch.arange(world * n, dtype=torch.float32) * (world * (world + 1) // 2))[rank * n:(rank + 1) * n]
        check(f"reduce_scatter_tensor n={n}", torch.equal(got.cpu(), want))

        ins = [torch.full((n,), float(rank + j), device=device) for j in range(world)]
        got = torch.empty(n, device=device)
        dist.reduce_scatter(got, ins, op=dist.ReduceOp.MAX)
        check(f"reduce_scatter list n={n}", torch.equal(got.cpu(), torch.full((n,), float(world - 1 + rank))))
    _check_path(world, failures)  # before alltoall, which always takes the pipeline

    for n in (0, 1, 1001, 300007):
        inp = torch.arange(world * n, dtype=torch.float64, device=device) + 1000 * rank
        out = torch.empty(world * n, dtype=torch.float64, device=device)
        dist.all_to_all_single(out, inp)
        want = torch.cat([torch.arange(rank * n, (rank + 1) * n, dtype=torch.float64) + 1000 * j
                          for j in range(world)])
        check(f"all_to_all_single n={n}", torch.equal(out.cpu(), want))
        outs = [torch.empty(n + j, dtype=torch.int64, device=device) for j in range(world)]
        ins = [torch.full((n + rank,), rank * 100 + j, dtype=torch.int64, device=device) for j in range(world)]
        dist.all_to_all(outs, ins)
        check(f"all_to_all list n={n}", all(torch.equal(o.cpu(), torch.full((n + j,), j * 100 + rank,
                                                                             dtype=torch.int64))
                                            for j, o in enumerate(outs)))
    # Point to point, staged through host memory.
    for n in (1, 300007):
        if rank == 0:
            dist.send(torch.arange(n, dtype=torch.float32, device=device), dst=world - 1)
            got = torch.zeros(n, dtype=torch.float32, device=device)
            dist.recv(got, src=world - 1)
            check(f"recv on rank 0 n={n}", torch.equal(got.cpu(), -torch.arange(n, dtype=torch.float32)))
        elif rank == world - 1:
            got = torch.zeros(n, dtype=torch.float32, device=device)
            dist.irecv(got, src=0).wait()
            check(f"irecv on rank {rank} n={n}", torch.equal(got.cpu(), torch.arange(n, dtype=torch.float32)))
            dist.isend(-got, dst=0).wait()
    dist.destroy_process_group()
    return cases, failures


def stream_semantics(rank, world):
    """A kernel queued on the current stream before the collective is seen by it;
    after wait(), a kernel on the current stream sees the result, with no
    torch.cuda.synchronize() anywhere; GPU tensors stay alive until the op ends."""
    device = _init(rank)
    failures, cases = [], 0
    side = torch.cuda.Stream(device)
    for trial in range(4):
        with torch.cuda.stream(side):  # a non-default current stream, as training loops use
            cases += 1
            t = torch.zeros(1 << 20, device=device)
            torch.cuda._sleep(50_000_000)  # keeps the stream busy: the fill below runs late
            t.fill_(rank + 1.0)
            work = dist.all_reduce(t, async_op=True)
            work.wait()  # the current stream waits for the op; the host does not sync the device
            t.mul_(2)     # queued on the current stream after the op's completion
            result = t.cpu()  # (the copy itself synchronises, after everything above)
            want = 2.0 * world * (world + 1) / 2
            if not torch.all(result == want):
                failures.append(f"trial {trial}: got {result[:3].tolist()} expected {want}")
    # The tensor may be dropped right after issuing: rcoll keeps it alive.
    cases += 1
    work = dist.all_reduce(torch.ones(1 << 22, device=device), async_op=True)
    torch.cuda.empty_cache()
    work.wait()
    dist.destroy_process_group()
    return cases, failures


def numpy_api_with_torch_tensors(rank, world):
    """rcoll.Communicator on torch CUDA tensors through __cuda_array_interface__."""
    import rcoll

    torch.cuda.set_device(rank % torch.cuda.device_count())
    device = torch.device("cuda", torch.cuda.current_device())
    comm = rcoll.init()
    failures, cases = [], 0
    for dtype in (torch.float16, torch.float32, torch.int64):
        for n in (1, 1001, 300007):
            cases += 1
            t = torch.full((n,), rank + 1, dtype=dtype, device=device)
            comm.allreduce(t)
            if not torch.all(t.cpu() == world * (world + 1) // 2):
                failures.append(f"allreduce {dtype} n={n}")
            cases += 1
            g = comm.allgather(torch.full((n,), rank, dtype=dtype, device=device))
            if not torch.equal(g.cpu(), torch.arange(world, dtype=dtype).repeat_interleave(n).reshape(world, n)):
                failures.append(f"allgather {dtype} n={n}")
            cases += 1
            b = torch.full((n,), rank, dtype=dtype, device=device)
            comm.broadcast(b, root=world - 1)
            if not torch.all(b.cpu() == world - 1):
                failures.append(f"broadcast {dtype} n={n}")
            cases += 1
            r = comm.reduce_scatter(torch.ones(world * n, dtype=dtype, device=device))
            if not torch.all(r.cpu() == world):
                failures.append(f"reduce_scatter {dtype} n={n}")
    if comm.device_path != expected_path(world):
        failures.append(f"device ops went through {comm.device_path!r}, expected {expected_path(world)!r}")
    comm.shutdown()
    return cases, failures
