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
