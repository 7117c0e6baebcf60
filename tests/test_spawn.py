"""The local spawner that the tests, demo and benchmarks rely on: results, bounds, failures."""
import time

import pytest
import spawn_workers as w

from rcoll import spawn


def test_returns_every_ranks_result():
    assert spawn.run(w.echo, 3, "x", timeout=60) == [(0, 3, "x"), (1, 3, "x"), (2, 3, "x")]


def test_one_failing_rank_ends_the_run_after_the_grace_period():
    t0 = time.monotonic()
    with pytest.raises(spawn.RankFailed, match="rank 0 broke") as info:
        spawn.run(w.fail_fast, 2, timeout=120, grace=1.0)
    assert time.monotonic() - t0 < 15
    assert "killed 1.0 s after another rank failed" in str(info.value)


def test_deadline_kills_hung_ranks():
    t0 = time.monotonic()
    with pytest.raises(spawn.RankFailed, match="did not finish within 2"):
        spawn.run(w.hang, 2, timeout=2)
    assert time.monotonic() - t0 < 15


# tests/rank_threads.py: the same contract with ranks as threads of this process.
def _rank_body(rank, world, kind):
    import numpy as np

    import rcoll
    comm = rcoll.init(rank, world)
    if kind == "silent" and rank == 1:
        return comm  # alive, but never joins the allreduce: rank 0's op times out
    if kind == "raise" and rank == 1:
        raise ValueError("rank 1 broke")
    total = comm.allreduce(np.ones(3, np.int64))
    return rank, int(total[0]), comm.transports


def test_rank_threads_return_every_ranks_result_and_pass_per_rank_settings():
    import rank_threads
    results = rank_threads.run(_rank_body, 3, "ok", timeout=60, env={"RCOLL_HOSTID": ["a", "a", "b"]})
    assert results == [(0, 3, ["self", "shm", "tcp"]), (1, 3, ["shm", "self", "tcp"]),
                       (2, 3, ["tcp", "tcp", "self"])], results


def test_rank_threads_report_a_failing_rank():
    import rank_threads
    with pytest.raises(spawn.RankFailed, match="rank 1 broke"):
        rank_threads.run(_rank_body, 2, "raise", timeout=30)


def test_rank_threads_end_a_hung_collective_by_the_deadline():
    import rank_threads
    t0 = time.monotonic()
    with pytest.raises(spawn.RankFailed, match="rcoll.TimeoutError") as info:
        rank_threads.run(_rank_body, 2, "silent", timeout=2)
    assert "--- rank 0" in str(info.value) and time.monotonic() - t0 < 15


def test_rank_threads_refuse_per_rank_values_of_other_variables():
    import rank_threads
    with pytest.raises(ValueError, match="OTHER: per-rank values"):
        rank_threads.run(_rank_body, 2, "ok", env={"OTHER": ["1", "2"]})
