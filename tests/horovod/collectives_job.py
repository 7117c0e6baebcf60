"""Horovod's collectives on rcoll.horovod.torch, checked exactly on every rank
(tests/horovod/test_horovod.py runs it under torchrun and mpirun's environment)."""
import json
import os
import tempfile

import torch

import rcoll.horovod.torch as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()
assert hvd.is_initialized() and hvd.local_size() == size and hvd.cross_size() == 1
assert not hvd.mpi_built() and not hvd.gloo_built() and hvd.nccl_built() == 0

# allreduce: every op, dtype and dimension, against the same sum computed here.
for dtype in [torch.int32, torch.int64, torch.float32, torch.float64, torch.float16, torch.uint8]:
    for dim in [1, 2, 3]:
        per_rank = [torch.arange(5 ** dim, dtype=torch.float64).reshape([5] * dim) % 7 + r for r in range(size)]
        mine = per_rank[rank].to(dtype)
        exact = torch.stack(per_rank)
        assert torch.equal(hvd.allreduce(mine, op=hvd.Sum), exact.sum(0).to(dtype))
        assert torch.equal(hvd.allreduce(mine, op=hvd.Min), exact.min(0).values.to(dtype))
        assert torch.equal(hvd.allreduce(mine, op=hvd.Max), exact.max(0).values.to(dtype))
        if dtype.is_floating_point:
            assert torch.allclose(hvd.allreduce(mine).double(), exact.mean(0), atol=1e-2)
        elif dtype != torch.uint8:  # integer Average truncates toward zero, as Horovod
            assert torch.equal(hvd.allreduce(mine), torch.div(exact.sum(0), size, rounding_mode="trunc").to(dtype))
# prescale / postscale, in place and async, grouped
x = torch.full((7,), float(rank + 1))
assert torch.equal(hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5),
                   torch.full((7,), float(sum(range(1, size + 1)))))
h = hvd.allreduce_async_(x, op=hvd.Sum)
assert hvd.synchronize(h) is x and torch.equal(x, torch.full((7,), float(sum(range(1, size + 1)))))
outs = hvd.grouped_allreduce([torch.ones(3) * rank, torch.ones(2, 2, dtype=torch.int64) * rank], op=hvd.Sum)
assert torch.equal(outs[0], torch.ones(3) * sum(range(size)))
assert torch.equal(outs[1], torch.ones(2, 2, dtype=torch.int64) * sum(range(size)))

# allgather with first dimensions that differ per rank; grouped.
g = hvd.allgather(torch.full((rank + 1, 3), rank, dtype=torch.int32))
assert torch.equal(g, torch.cat([torch.full((r + 1, 3), r, dtype=torch.int32) for r in range(size)]))
gs = hvd.grouped_allgather([torch.ones(rank + 1), torch.zeros(2, 1)])
assert gs[0].shape == (sum(range(1, size + 1)),) and gs[1].shape == (2 * size, 1)

# broadcast from every root, in place and not.
for root in range(size):
    t = torch.full((4,), float(rank))
    assert torch.equal(hvd.broadcast(t, root), torch.full((4,), float(root))) and t[0] == rank
    hvd.broadcast_(t, root)
    assert torch.equal(t, torch.full((4,), float(root)))

# alltoall with splits: rank r sends j + 1 rows to rank j.
rows = torch.cat([torch.full((j + 1, 2), 10 * rank + j) for j in range(size)])
out, received = hvd.alltoall(rows, splits=[j + 1 for j in range(size)])
assert received.tolist() == [rank + 1] * size
assert torch.equal(out, torch.cat([torch.full((rank + 1, 2), 10 * r + rank) for r in range(size)]))

# reducescatter of a first dimension that does not divide: the first ranks get one row more.
n = 2 * size + 1
mine = hvd.reducescatter(torch.arange(n * 2, dtype=torch.float32).reshape(n, 2), op=hvd.Sum)
start = sum(n // size + (1 if r < n % size else 0) for r in range(rank))
count = n // size + (1 if rank < n % size else 0)
assert torch.equal(mine, size * torch.arange(n * 2, dtype=torch.float32).reshape(n, 2)[start:start + count])

# Ops matched by name, issued in a different order on every rank (Horovod's negotiation).
names = [f"t{i}" for i in range(4)]
order = names[rank % 4:] + names[:rank % 4]
handles = {name: hvd.allreduce_async(torch.full((3,), float(i)), name=name, op=hvd.Sum)
           for name in order for i in [names.index(name)]}
for i, name in enumerate(names):
    assert torch.equal(hvd.synchronize(handles[name]), torch.full((3,), float(i * size)))

# Gradients through allreduce and allgather.
w = torch.ones(3, requires_grad=True)
hvd.allreduce(w * (rank + 1), op=hvd.Sum).sum().backward()
assert torch.equal(w.grad, torch.full((3,), float(size * (rank + 1))))

# Horovod's timeline: rank 0 writes every op's negotiation and run as a Chrome trace.
if not os.environ.get("HOROVOD_TIMELINE"):  # else the whole job writes one (test_horovod.py checks it)
    path = os.path.join(tempfile.mkdtemp(), "timeline.json") if rank == 0 else "unused"
    hvd.start_timeline(path, mark_cycles=True)
    for _ in range(3):
        hvd.allreduce(torch.ones(4), name="timed")
    hvd.synchronize(hvd.allgather_async(torch.ones(rank + 1), name="gathered"))
    hvd.stop_timeline()
    if rank == 0:
        with open(path) as f:
            events = json.load(f)
        rows = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name" and e["pid"]}
        assert sorted(rows.values()) == ["allgather.gathered", "allreduce.timed"], rows
        for pid, name in rows.items():
            phases = [(e["ph"], e.get("name")) for e in events if e["pid"] == pid and e["ph"] in "BEX"]
            kind = name.split(".")[0].upper()
            begun = [label for ph, label in phases if ph == "B"]
            assert begun == [f"NEGOTIATE_{kind}", kind] * (3 if kind == "ALLREDUCE" else 1), (name, phases)
            assert sum(ph == "E" for ph, _ in phases) == len(begun), (name, phases)
        assert any(e.get("name") == "CYCLE_START" for e in events)

# Objects.
assert hvd.broadcast_object({"from": rank}, root_rank=size - 1) == {"from": size - 1}
assert hvd.allgather_object(("r", rank)) == [("r", r) for r in range(size)]
hvd.barrier()
hvd.shutdown()
assert not hvd.is_initialized()
