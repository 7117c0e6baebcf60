"""Communicator.group(): the communicator of part of a job (rcoll.horovod's process sets use it)."""
import pytest

from collectives import group_workers as w
from rcoll import spawn


@pytest.mark.parametrize("world", [2, 3, 4])
def test_groups_of_odd_and_even_ranks(world):
    results = spawn.run(w.odd_and_even_groups, world, timeout=90)
    for rank, (group_rank, group_size, total, refusals) in enumerate(results):
        members = [r for r in range(world) if r % 2 == rank % 2]
        assert (group_rank, group_size, total) == (members.index(rank), len(members), sum(members))
        assert len(refusals) == 3 and all(f"rank {rank}: group:" in m for m in refusals), refusals
        assert "not a rank of this communicator" in refusals[0] and "twice" in refusals[1] and "no ranks" in refusals[2]
