"""Communicator.join() and grow(): ranks started after a job join it through
the rendezvous store (python/rcoll/grow.py). The job's ranks keep their
numbers, newcomers follow in the order they asked, results at the new size
are exact; a growth after a shrink, a newcomer nobody takes in, and a ticket
admitted twice. Ranks run as threads (support/rank_threads.py); hvd.elastic's
use of it, with processes, is in tests/horovod."""
import threading
import time

import numpy as np
import pytest
from support import rank_threads

import rcoll

FIRST = 2  # ranks the job starts with; the other threads are newcomers


def _sum_of_ranks(comm):
    """allreduce of rank + 1 over the communicator: its size's triangle number on every rank."""
    return comm.allreduce(np.full(1001, comm.rank + 1, np.int64))


def _wait_for_tickets(comm, tickets):
    """Rank 0 looks at the store until `tickets` newcomers asked; everyone learns the last ticket by a broadcast."""
    deadline = time.monotonic() + 30
    while True:
        seen = comm.joiners_waiting() if comm.rank == 0 else 0
        last = int(comm.broadcast(np.array([seen], np.int64), root=0)[0])
        if last >= tickets:
            return last
        assert time.monotonic() < deadline, "the newcomers never asked"
        time.sleep(0.01)


def _two_growths(rank, world, first_grown):
    if rank < FIRST:
        comm = rcoll.init(rank, FIRST)
        assert _sum_of_ranks(comm)[0] == 3
        comm = comm.grow(_wait_for_tickets(comm, 1))  # the first newcomer (rank 2)
        first_grown.set()
        assert (comm.rank, comm.size) == (rank, 3)
        assert _sum_of_ranks(comm)[0] == 6
        comm = comm.grow(_wait_for_tickets(comm, 2))  # the second
    elif rank == FIRST:
        comm = rcoll.Communicator.join("default", timeout=30)
        assert (comm.rank, comm.size) == (2, 3)
        assert _sum_of_ranks(comm)[0] == 6
        comm = comm.grow(_wait_for_tickets(comm, 2))  # grown ranks take the next ones in too
    else:
        first_grown.wait(30)
        comm = rcoll.Communicator.join("default", timeout=30)
    result = (comm.rank, comm.size, int(_sum_of_ranks(comm)[0]))
    comm.barrier()
    comm.shutdown()
    return result


@pytest.mark.timeout(60)
def test_newcomers_join_one_growth_after_another():
    results = rank_threads.run(_two_growths, FIRST + 2, threading.Event(), timeout=45)
    assert results == [(r, 4, 10) for r in range(4)]


def _shrink_then_grow(rank, world):
    if rank < 3:
        comm = rcoll.init(rank, 3)
        comm.barrier()
        if rank == 1:
            comm.shutdown()  # leaves the job
            return None
        comm = comm.shrink(exclude=[1])
        comm = comm.grow(_wait_for_tickets(comm, 1))
    else:
        comm = rcoll.Communicator.join("default", timeout=30)
    result = (comm.rank, comm.size, int(_sum_of_ranks(comm)[0]))
    comm.shutdown()
    return result


@pytest.mark.timeout(60)
def test_a_shrunk_job_takes_newcomers_under_its_first_name():
    """Old ranks 0 and 2 (now 0 and 1) and the newcomer (2): the survivors of a shrink find the tickets."""
    results = rank_threads.run(_shrink_then_grow, 4, timeout=45)
    assert results == [(0, 3, 6), None, (1, 3, 6), (2, 3, 6)]


def _nobody_admits(rank, world):
    comm = rcoll.init(rank, world)  # hosts the store the newcomer asks
    with pytest.raises(rcoll.TimeoutError, match=r"joining job 'job7' at 127\.0\.0\.1:\d+ \(ticket 1\): not "
                                                 r"admitted within 0\.5 s"):
        rcoll.Communicator.join("job7", timeout=0.5)
    with pytest.raises(rcoll.InvalidArgumentError, match=r"rank 0: grow: ticket 0 was admitted already"):
        comm.grow(0)
    assert _sum_of_ranks(comm)[0] == 1  # nothing lost
    comm.shutdown()


@pytest.mark.timeout(30)
def test_a_newcomer_nobody_takes_in_times_out_naming_the_job():
    rank_threads.run(_nobody_admits, 1, timeout=20)
