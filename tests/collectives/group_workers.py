"""Rank bodies of test_group.py."""
import numpy as np

import rcoll


def odd_and_even_groups(rank, world):
    """Each rank joins the group of its parity; returns (group rank, group size, its allreduce, refusals)."""
    comm = rcoll.init(timeout=60)
    members = [r for r in range(world) if r % 2 == rank % 2]
    others = [r for r in range(world) if r % 2 != rank % 2]
    group = comm.group(members, name=f"parity{rank % 2}")
    assert comm.group(others, name="other") is None if others else True  # not a member: None, no waiting
    x = np.full(3, rank, np.int64)
    group.allreduce(x)
    refusals = []
    for bad in ([world], [0, 0], []):
        try:
            comm.group(bad, name="bad")
        except rcoll.InvalidArgumentError as e:
            refusals.append(str(e))
    comm.allreduce(np.ones(1))  # the parent still works beside its groups
    result = (group.rank, group.size, int(x[0]), refusals)
    group.shutdown()
    comm.shutdown()
    return result
