"""Process sets: collectives over part of the job, as Horovod defines them.

A ProcessSet names global ranks; once the job knows it (hvd.init(process_sets=)
or add_process_set, called on every rank in the same order), it has an id and
its members hold an rcoll communicator of their own (python/rcoll/horovod/common/basics.py).
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Union


class ProcessSet:
    """A set of global ranks that run collectives together. Pass it to
    hvd.init(process_sets=[...]) or hvd.add_process_set(), then as
    `process_set=` to any op. Built from a list of ranks (an mpi4py
    communicator needs Horovod built with MPI, which rcoll is not)."""

    process_set_id: Optional[int] = None
    ranks: Optional[List[int]] = None
    mpi_comm = None

    def __init__(self, ranks_or_comm: Union[Sequence[int], object]):
        try:
            ranks = sorted(ranks_or_comm)
        except TypeError:
            raise ValueError(
                "ProcessSet takes a list of process ranks (an mpi4py communicator needs Horovod built with MPI: "
                "rcoll.horovod is not)") from None
        if any(not isinstance(r, int) or isinstance(r, bool) for r in ranks):
            raise ValueError("ProcessSet should be initialized with a list of process ranks (integers), "
                             f"got {list(ranks_or_comm)!r}")
        self.ranks = ranks

    def _invalidate(self):
        self.process_set_id = None

    def size(self) -> Optional[int]:
        """The number of ranks in the set, or None before the job knows it."""
        if self.process_set_id is None:
            return None
        return len(_job().process_set_ranks(self.process_set_id))

    def rank(self) -> Optional[int]:
        """This rank's position in the set (ops still take global ranks, as
        broadcast's root_rank), or None before the job knows the set. Raises
        ValueError on a rank outside it, as Horovod does."""
        if self.process_set_id is None:
            return None
        ranks = _job().process_set_ranks(self.process_set_id)
        me = _job().rank
        if me not in ranks:
            raise ValueError(f"rank {me} is not in process set {self.process_set_id} (ranks {ranks})")
        return ranks.index(me)

    def included(self) -> Optional[bool]:
        """Whether this rank is in the set (None when its ranks are unknown)."""
        if self.ranks is None:
            return None
        return _job().rank in self.ranks

    def __str__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, mpi_comm={self.mpi_comm})"

    __repr__ = __str__


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def _job():
    from .basics import job
    return job()


def add_process_set(process_set: Union[ProcessSet, Sequence[int]]) -> ProcessSet:
    """Adds a process set after hvd.init() and returns it, initialized. Every
    rank of the job calls it, in the same order; the set's members connect.
    A set with the ranks of an existing one is a ValueError."""
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    process_set.process_set_id = _job().add_process_set(process_set.ranks)
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Removes a process set (every rank calls it) and invalidates the object;
    False for the global set or a set the job does not know."""
    process_set_id = process_set.process_set_id
    if process_set_id is None or process_set_id == 0:
        return False
    process_set._invalidate()
    return _job().remove_process_set(process_set_id)
