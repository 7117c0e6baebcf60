"""Ranks on one host use the shared-memory transport (csrc/shm/); the collective
matrices run over it in test_collectives.py, DDP in test_torch.py."""

import pytest
from support.common import dev_shm_names

from collectives import shm_workers as w
from rcoll import spawn


@pytest.mark.parametrize("world", [2, 3, 4])
def test_local_ranks_choose_shared_memory(world, monkeypatch):
    monkeypatch.delenv("RCOLL_TRANSPORT", raising=False)
    assert spawn.run(w.transport_of, world, timeout=60) == ["shm"] * world


def test_shm_disable_and_transport_override(monkeypatch):
    monkeypatch.delenv("RCOLL_TRANSPORT", raising=False)
    assert spawn.run(w.transport_of, 2, timeout=60, env={"RCOLL_SHM_DISABLE": "1"}) == ["tcp", "tcp"]
    assert spawn.run(w.transport_of, 2, timeout=60, env={"RCOLL_TRANSPORT": "tcp"}) == ["tcp", "tcp"]


@pytest.mark.parametrize("world", [2, 4])
def test_kill_9_fails_survivors_and_leaves_nothing_behind(world, monkeypatch):
    monkeypatch.setenv("RCOLL_TRANSPORT", "shm")
    before = dev_shm_names()
    results = spawn.run(w.killed_mid_collective, world, timeout=60, allow_failures=True)
    dead = world - 1
    assert results[dead][0] == "error"
    for rank in range(dead):
        name, message, seconds = results[rank]
        assert name == "PeerError", (rank, message)
        assert f"rank {dead}" in message and "allreduce(float32, count=4194304, op=sum)" in message, message
        assert seconds < 10, seconds  # detected through the side channel, not the 60 s timeout
    # The segments are memfds, never named in /dev/shm: nothing can leak there.
    assert dev_shm_names() - before == set()
