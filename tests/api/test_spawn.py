"""The local spawner that the tests, demo and benchmarks rely on: results, bounds, failures."""
import time

import pytest

from api import spawn_workers as w
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


def test_ranks_take_the_callers_environment_directory_and_streams_as_of_the_call(monkeypatch, tmp_path, capfd):
    # Ranks fork from a server started by an earlier run(): what the caller
    # changed since must reach them all the same.
    spawn.run(w.echo, 1, None, timeout=60)
    monkeypatch.setenv("RCOLL_SPAWN_TEST_MARK", "set after the server started")
    monkeypatch.chdir(tmp_path)
    capfd.readouterr()
    results = spawn.run(w.surroundings, 2, "RCOLL_SPAWN_TEST_MARK", timeout=60)
    assert results == [("set after the server started", str(tmp_path))] * 2
    out, err = capfd.readouterr()
    assert sorted(out.splitlines()) == ["stdout of rank 0", "stdout of rank 1"], out
    assert sorted(err.splitlines()) == ["stderr of rank 0", "stderr of rank 1"], err


# tests/support/rank_threads.py: the same contract with ranks as threads of this process.
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
    from support import rank_threads
    results = rank_threads.run(_rank_body, 3, "ok", timeout=60, env={"RCOLL_HOSTID": ["a", "a", "b"]})
    assert results == [(0, 3, ["self", "shm", "tcp"]), (1, 3, ["shm", "self", "tcp"]),
                       (2, 3, ["tcp", "tcp", "self"])], results


def test_rank_threads_report_a_failing_rank():
    from support import rank_threads
    with pytest.raises(spawn.RankFailed, match="rank 1 broke"):
        rank_threads.run(_rank_body, 2, "raise", timeout=30)


def test_rank_threads_end_a_hung_collective_by_the_deadline():
    from support import rank_threads
    t0 = time.monotonic()
    with pytest.raises(spawn.RankFailed, match="rcoll.TimeoutError") as info:
        rank_threads.run(_rank_body, 2, "silent", timeout=2)
    assert "--- rank 0" in str(info.value) and time.monotonic() - t0 < 15


def test_rank_threads_refuse_per_rank_values_of_other_variables():
    from support import rank_threads
    with pytest.raises(ValueError, match="OTHER: per-rank values"):
        rank_threads.run(_rank_body, 2, "ok", env={"OTHER": ["1", "2"]})
