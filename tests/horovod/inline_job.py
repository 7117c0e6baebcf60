"""A synchronous allreduce of a small named host tensor finishes inside the
negotiation round that agrees on it (RCOLL_HOROVOD_INLINE_BYTES, the core's
agreed round): results exact and the same bits on every rank for every
dtype, op and size, in place and not; the data communicator runs no
allreduce for those calls; and everything around it still right: a tensor
over the limit, an async op pending beside it, two threads issuing at once,
a shape that changes under the name, a process set.
tests/horovod/test_horovod.py runs it under torchrun, and as separate
processes with a rank killed in the middle (KILL_AT)."""
import os
import signal
import threading

import torch

import rcoll.horovod.torch as hvd
from rcoll import _core

hvd.init()
rank, size = hvd.rank(), hvd.size()
INLINE = int(os.environ.get("RCOLL_HOROVOD_INLINE_BYTES", "256"))


def data_allreduces():
    """How many allreduces this process's communicators ran (one that finished inline runs none).
    With RCOLL_HOROVOD_INLINE_BYTES=0 the negotiation's cached rounds are allreduces too: not counted then."""
    return sum(r["count"] for r in _core.stats() if r["op"] == "allreduce") if INLINE else 0


def same_everywhere(t):
    gathered = hvd.allgather(t.reshape(1, -1).view(torch.uint8) if t.numel() else t.reshape(1, 0))
    return all(torch.equal(gathered[0], gathered[r]) for r in range(size))


if "KILL_AT" in os.environ:
    # The last rank dies between two inline allreduces: every other rank's
    # next one raises HorovodInternalError (naming the failure), none hangs.
    kill_at = int(os.environ["KILL_AT"])
    try:
        for step in range(kill_at + 50):
            if step == kill_at and rank == size - 1:
                os.kill(os.getpid(), signal.SIGKILL)
            out = hvd.allreduce(torch.full((2,), float(rank)), name="loss", op=hvd.Sum)
            assert torch.equal(out, torch.full((2,), float(sum(range(size))))), (step, out)
        raise AssertionError("the inline allreduces went on after a rank died")
    except hvd.HorovodInternalError as e:
        assert f"rank {rank}" in str(e), e
    os._exit(0)  # Horovod's shutdown would wait for the dead rank's goodbye

# Every dtype, op and size, three times under one name (the first call
# negotiates in full and runs on the data communicator; the next two finish
# inline when they fit), in place and not.
DTYPES = [torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16, torch.float32,
          torch.float64]
OPS = {hvd.Sum: "sum", hvd.Min: "min", hvd.Max: "max", hvd.Product: "prod", hvd.Average: "avg"}
expected_data_ops = 0
before = data_allreduces()
for dtype in DTYPES:
    itemsize = torch.empty(0, dtype=dtype).element_size()
    for count in [0, 1, 7, INLINE // itemsize, INLINE // itemsize + 1]:
        for op, op_name in OPS.items():
            if op == hvd.Average and not dtype.is_floating_point:
                continue  # integer Average truncates after a sum: the general path, tested elsewhere
            for in_place in (False, True):
                name = f"{dtype}.{count}.{op_name}.{in_place}"
                for call in range(3):
                    # Small values: every sum and product is exact in every dtype.
                    per_rank = [(torch.arange(count, dtype=torch.float64) + call + r) % (2 if op == hvd.Product
                                                                                        else 5) + 1
                                for r in range(size)]
                    stacked = torch.stack(per_rank)
                    exact = {hvd.Sum: stacked.sum(0), hvd.Min: stacked.min(0).values,
                             hvd.Max: stacked.max(0).values, hvd.Product: stacked.prod(0),
                             hvd.Average: stacked.mean(0)}[op]
                    mine = per_rank[rank].to(dtype)
                    if in_place:
                        assert hvd.allreduce_(mine, name=name, op=op) is mine
                        out = mine
                    else:
                        out = hvd.allreduce(mine, name=name, op=op)
                        assert torch.equal(mine, per_rank[rank].to(dtype)), "the input changed"
                    assert out.dtype == dtype and out.shape == (count,), (name, out)
                    if op == hvd.Average:  # a sum and one division: one rounding in the narrow types
                        tol = {torch.float16: 1e-3, torch.bfloat16: 8e-3}.get(dtype, 1e-6)
                        assert torch.allclose(out.double(), exact, rtol=tol, atol=0), (name, call, out, exact)
                    else:
                        assert torch.equal(out, exact.to(dtype)), (name, call, out, exact)
                    assert same_everywhere(out), name
                inline = INLINE > 0 and count * itemsize <= INLINE
                expected_data_ops += 1 if inline else 3
ran = data_allreduces() - before
assert ran == (expected_data_ops if INLINE else 0), (ran, expected_data_ops)

# A 2-D tensor and a name used by async calls too: the cache's key is the
# dtype, shape, op and scale factors, whichever call made it.
# The async calls run on the data communicator, the synchronous ones inline.
grid = torch.arange(6, dtype=torch.float32).reshape(2, 3) + rank
before = data_allreduces()
for _ in range(3):
    handle = hvd.allreduce_async(grid, name="grid", op=hvd.Max)
    assert torch.equal(hvd.synchronize(handle), torch.arange(6.).reshape(2, 3) + size - 1)
    assert torch.equal(hvd.allreduce(grid, name="grid", op=hvd.Max), torch.arange(6.).reshape(2, 3) + size - 1)
assert data_allreduces() - before == (0 if not INLINE else 3 if INLINE >= grid.numel() * 4 else 6)

# An async op pending beside a synchronous one, issued in opposite orders by
# odd and even ranks: both run, exactly, on every rank.
for step in range(20):
    side = torch.full((3,), float(rank + step))
    main = torch.full((2,), float(rank * step))
    if rank % 2 == 0:
        handle = hvd.allreduce_async(side, name="side", op=hvd.Sum)
        a = hvd.allreduce(main, name="main", op=hvd.Sum)
        b = hvd.synchronize(handle)
    else:
        a = hvd.allreduce(main, name="main", op=hvd.Sum)
        b = hvd.allreduce(side, name="side", op=hvd.Sum)
    assert torch.equal(a, torch.full((2,), float(sum(range(size)) * step))), (step, a)
    assert torch.equal(b, torch.full((3,), float(sum(range(size)) + size * step))), (step, b)

# Two threads, each with its own name, at once: the ranks' threads meet in
# any order and every result is exact.
errors = []


def worker(index):
    try:
        for step in range(40):
            out = hvd.allreduce(torch.full((4,), float(rank + index + step)), name=f"thread{index}", op=hvd.Sum)
            assert torch.equal(out, torch.full((4,), float(sum(range(size)) + size * (index + step)))), out
    except BaseException as e:  # noqa: BLE001 - reported below
        errors.append(e)


threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
for t in threads:
    t.start()
for t in threads:
    t.join(60)
assert not any(t.is_alive() for t in threads), "a thread's allreduce hung"
assert not errors, errors

# A shape that changes on one rank under a name that ran inline: every rank
# gets Horovod's mismatch error, and the job goes on.
for _ in range(2):
    assert torch.equal(hvd.allreduce(torch.ones(2), name="changes", op=hvd.Sum), torch.full((2,), float(size)))
if size > 1:
    try:
        hvd.allreduce(torch.ones(3 if rank == size - 1 else 2), name="changes", op=hvd.Sum)
        raise AssertionError("a mismatched shape under an inline name ran")
    except hvd.HorovodInternalError as e:
        assert "changes" in str(e) and "shape" in str(e), e
assert torch.equal(hvd.allreduce(torch.ones(2), name="changes", op=hvd.Sum), torch.full((2,), float(size)))

# Names are any str: one UTF-8 cannot carry (a lone surrogate) is cached and
# runs as any other. The same elements in another shape under one name are
# another op (the cache's key holds the shape), each result exact.
for call in range(3):
    out = hvd.allreduce(torch.full((2,), float(rank + call)), name="odd\udc80name", op=hvd.Sum)
    assert torch.equal(out, torch.full((2,), float(sum(range(size)) + size * call))), out
    for shape in ((2, 3), (3, 2), (6,)):
        out = hvd.allreduce(torch.arange(6.).reshape(shape) + rank, name="reshaped", op=hvd.Sum)
        assert torch.equal(out, (torch.arange(6.) * size + sum(range(size))).reshape(shape)), (shape, out)

# A synchronous allreduce under the name of this rank's async op still in
# flight is refused on this rank (Horovod's "already in flight"), whichever
# path would have run it; the async op then completes as it was. Rank 0
# tries before the others submit theirs (the barrier), so its op cannot
# have finished yet.
if size > 1:
    if rank == 0:
        handle = hvd.allreduce_async(torch.ones(2), name="busy", op=hvd.Sum)
        try:
            hvd.allreduce(torch.ones(2), name="busy", op=hvd.Sum)
            raise AssertionError("a second op under the name of one in flight ran")
        except ValueError as e:
            assert "already in flight" in str(e), e
        hvd.barrier()
    else:
        hvd.barrier()
        handle = hvd.allreduce_async(torch.ones(2), name="busy", op=hvd.Sum)
    assert torch.equal(hvd.synchronize(handle), torch.full((2,), float(size)))
    for _ in range(2):
        assert torch.equal(hvd.allreduce(torch.ones(2), name="busy", op=hvd.Sum), torch.full((2,), float(size)))

# A process set of the first two ranks (of three or more: Horovod refuses a
# duplicate of the global set): its own negotiation, inline too.
if size > 2:
    pair = hvd.add_process_set([0, 1])
    if rank < 2:
        before = data_allreduces()
        for call in range(3):
            out = hvd.allreduce(torch.full((2,), float(rank + call)), name="pair", op=hvd.Sum, process_set=pair)
            assert torch.equal(out, torch.full((2,), float(1 + 2 * call))), out
        assert data_allreduces() - before == (0 if not INLINE else 1 if INLINE >= 8 else 3)
    hvd.remove_process_set(pair)
hvd.shutdown()
