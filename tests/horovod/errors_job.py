"""What goes wrong, as Horovod reports it: the op fails on every rank with
HorovodInternalError (a RuntimeError) naming the rank and the op, and the job
goes on; local misuse is a ValueError at once."""
import torch

import rcoll.horovod.torch as hvd

hvd.init()
rank, size = hvd.rank(), hvd.size()


def fails(call, kind, words):
    try:
        call()
    except kind as e:
        text = str(e)
        assert all(w in text for w in words), text
        return
    raise AssertionError(f"rank {rank}: expected {kind.__name__}")


# Shapes that differ (same element count too), dtypes, ops, roots: every rank raises, then goes on.
fails(lambda: hvd.allreduce(torch.ones(17 + rank)), hvd.HorovodInternalError, ["Mismatched", "shapes"])
fails(lambda: hvd.allreduce(torch.ones((2, 3) if rank == 0 else (3, 2))), RuntimeError, ["shapes", "rank 0"])
fails(lambda: hvd.allreduce(torch.ones(4, dtype=torch.float32 if rank == 0 else torch.float64)),
      hvd.HorovodInternalError, ["data types"])
fails(lambda: hvd.allreduce(torch.ones(4), op=hvd.Sum if rank == 0 else hvd.Max), hvd.HorovodInternalError,
      ["reduce ops"])
fails(lambda: hvd.broadcast(torch.ones(4), rank), hvd.HorovodInternalError, ["root ranks"])
fails(lambda: hvd.allgather(torch.ones(2, 3 + rank)), hvd.HorovodInternalError, ["shapes"])
assert torch.equal(hvd.allreduce(torch.ones(4), op=hvd.Sum), torch.full((4,), float(size)))  # the job goes on

# Local misuse: ValueError at the call, naming the rank.
fails(lambda: hvd.allreduce(torch.ones(4, 4).t()), ValueError, [f"rank {rank}", "contiguous"])
fails(lambda: hvd.alltoall(torch.ones(size + 1), splits=[1] * size), ValueError, [f"rank {rank}", "splits"])
fails(lambda: hvd.broadcast(torch.ones(2), size), ValueError, ["root_rank"])
h = hvd.allreduce_async(torch.ones(3), name="same")
fails(lambda: hvd.allreduce_async(torch.ones(3), name="same"), ValueError, ["same", "in flight"])
hvd.synchronize(h)
fails(lambda: hvd.allreduce(torch.ones(3), op=hvd.Sum, average=True), ValueError, ["supersedes"])
fails(lambda: hvd.reducescatter(torch.ones(size * 2), op=hvd.Adasum), RuntimeError, ["Adasum"])

# join: ranks that joined take part in allreduces with zeros; other ops fail meanwhile.
for first in range(size):
    if rank == first:
        last = hvd.join()
    else:
        got = hvd.allreduce(torch.full((5,), float(rank + 1)), op=hvd.Sum, name=f"after-join-{first}")
        expected = sum(r + 1 for r in range(size) if r != first)
        assert torch.equal(got, torch.full((5,), float(expected))), got
        fails(lambda f=first: hvd.allgather(torch.ones(1), name=f"gather-{f}"), hvd.HorovodInternalError, ["joined"])
        last = hvd.join()
    assert last != first or size == 1
    assert hvd.allgather_object(last, name=f"last-{first}") == [last] * size

# Process sets: even and odd ranks, each with its own communicator.
evens = hvd.add_process_set([r for r in range(size) if r % 2 == 0])
odds = hvd.add_process_set([r for r in range(size) if r % 2 == 1]) if size > 1 else None
mine = evens if rank % 2 == 0 else odds
members = mine.ranks
assert mine.size() == len(members) and mine.rank() == members.index(rank) and mine.included()
got = hvd.allreduce(torch.full((2,), float(rank)), op=hvd.Sum, process_set=mine)
assert torch.equal(got, torch.full((2,), float(sum(members))))
assert torch.equal(hvd.broadcast(torch.full((2,), float(rank)), members[-1], process_set=mine),
                   torch.full((2,), float(members[-1])))
other = odds if mine is evens else evens
if other is not None:
    fails(lambda: hvd.allreduce(torch.ones(1), process_set=other), ValueError, ["not in process set"])
fails(lambda: hvd.add_process_set(evens.ranks), ValueError, ["duplicate"])
assert hvd.remove_process_set(evens) and evens.process_set_id is None
if odds is not None:
    assert hvd.remove_process_set(odds)
hvd.shutdown()
