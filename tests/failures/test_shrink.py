"""Communicator.shrink() (issue #21 item 3): after kill -9 of a rank in the
middle of 4 MiB allreduces, at world 4 and 8, over shared memory and over TCP
(each transport reports the dead rank's lost connection), every survivor raises PeerError,
shrinks, finds itself at its place among the survivors and computes exact
results at the new size; a second kill and a second shrink work the same. With
a store hosted outside the job, rank 0 may die too; with rcoll's own store
(hosted by rank 0) its death gives a PeerError saying what to do. shrink(exclude=)
leaves out ranks without a failure, as ncclCommShrink does. Every survivor exits
0 with nothing on stderr but rcoll's WARN lines; the victims die by SIGKILL.
RCOLL_TEST_TRIALS sets the trials of the kill cases (2)."""
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
from support import launch, rank_threads

import rcoll

HERE = os.path.dirname(os.path.abspath(__file__))
TRIALS = int(os.environ.get("RCOLL_TEST_TRIALS", "2"))
WARN = r"^\[rcoll \d+ rank \d+\] WARN: "


def _job(world, victims, store, tmp_path, connect_timeout=30, script="shrink_worker.py", env=None, args=()):
    """Runs `script` on `world` ranks; returns {rank: (returncode, stdout, stderr, report or None)}.
    The victims are waited for last, and killed once the others are done."""
    port = launch.free_port()
    out = tmp_path / f"report-{port}"
    env = launch._clean_env({"WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                             "RCOLL_CONNECT_TIMEOUT": str(connect_timeout), **(env or {})})
    cmd = [sys.executable, os.path.join(HERE, script), ",".join(map(str, victims)), *([store] if store else []),
           str(out), *args]
    procs = [subprocess.Popen(cmd, env=dict(env, RANK=str(r)), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r in range(world)]
    results = {}
    try:
        for r in sorted(range(world), key=lambda r: r in victims):
            p = procs[r]
            if r in victims:
                try:
                    p.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    p.kill()  # a stopped victim
            try:
                stdout, stderr = p.communicate(timeout=90)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"rank {r} did not end within 90 s") from None
            report = out.with_name(f"{out.name}.{r}")
            results[r] = (p.returncode, stdout, stderr, json.loads(report.read_text()) if report.exists() else None)
    finally:
        launch.kill_leftovers(procs)
    return results


@pytest.fixture
def outside_store():
    """A store hosted by the test, as torchrun's agent hosts one: it outlives every rank."""
    server = rcoll._core.TcpStoreServer("127.0.0.1", 0)
    yield f"127.0.0.1:{server.port}"
    del server


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("world,victims,store,transport", [
    (4, [2], "own", "shm"),
    (4, [2], "own", "tcp"),
    (4, [0], "outside", "shm"),
    (8, [5, 1], "own", "shm"),
    (8, [0, 7], "outside", "tcp"),
])
def test_survivors_shrink_after_kill9_and_compute_at_the_new_size(world, victims, store, transport, outside_store,
                                                                  tmp_path, capsys):
    shrink_times = []
    for trial in range(TRIALS):
        results = _job(world, victims, outside_store if store == "outside" else "own", tmp_path,
                       env={"RCOLL_TRANSPORT": transport})
        for victim in victims:
            assert results[victim][0] == -9, f"trial {trial}: victim {victim}: {results[victim]}"
        survivors = [r for r in range(world) if r not in victims]
        for r in survivors:
            code, stdout, stderr, report = results[r]
            where = f"trial {trial}, rank {r}"
            assert code == 0, f"{where} exited {code}:\n{stderr[-3000:]}"
            launch.check_rank_output(where, stdout, stderr, allow=[WARN])
            members = list(range(world))
            for victim, round_ in zip(victims, report):
                named = members.index(victim)  # errors name ranks of the communicator of the round
                assert re.search(rf"rank {named}\b", round_["error"]), f"{where}: does not name {named}: {round_}"
                members.remove(victim)
                assert (round_["rank"], round_["size"]) == (members.index(r), len(members)), (where, round_)
                shrink_times.append(round_["shrink_s"])
    with capsys.disabled():
        print(f"\nshrink, world {world}, victims {victims}, {store} store, {transport}: {TRIALS} trials, "
              f"{len(shrink_times)} shrinks: median {statistics.median(shrink_times) * 1e3:.1f} ms, "
              f"worst {max(shrink_times) * 1e3:.1f} ms")


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_a_rank_nobody_saw_die_is_waited_for_then_left_out(tmp_path):
    """Rank 2 of 4 is stopped (SIGSTOP: its kernel still answers, nobody sees it
    die); the others shrink with a 3 s timeout: the first to check in waits that
    long for it, then every survivor gets the same three members."""
    results = _job(4, [2], "own", tmp_path, args=["stop"])
    assert results[2][0] == -9, results[2]
    for r in (0, 1, 3):
        code, stdout, stderr, report = results[r]
        assert code == 0, f"rank {r} exited {code}:\n{stderr[-3000:]}"
        launch.check_rank_output(f"rank {r}", stdout, stderr, allow=[WARN])
        assert (report[0]["rank"], report[0]["size"]) == ([0, 1, 3].index(r), 3), report
        assert 2.5 < report[0]["shrink_s"] < 3.0 + 5.0 + 10, report  # the wait, the slack, the new rendezvous


@pytest.mark.timeout(120)
def test_rank0s_death_with_its_own_store_says_what_to_do(tmp_path):
    results = _job(4, [0], "own", tmp_path, connect_timeout=10)
    assert results[0][0] == -9
    for r in (1, 2, 3):
        _, _, stderr, _ = results[r]
        assert f"rank {r}: shrink: the rendezvous store failed: lost the connection to the rendezvous store" \
            in stderr, stderr[-2000:]
        assert "outlive the failed ranks" in stderr, stderr[-2000:]


def _leave_one_out(rank, world):
    comm = rcoll.init(rank, world)
    comm.allreduce(np.ones(4, np.int32))
    if rank == 3:
        comm.shutdown()
        return None
    with pytest.raises(rcoll.InvalidArgumentError, match=f"rank {rank}: shrink: this rank is in exclude"):
        comm.shrink(exclude=[rank])
    comm = comm.shrink(exclude=[3])
    assert (comm.rank, comm.size) == (rank, 3)
    total = comm.allreduce(np.full(1000, rank + 1, np.int64))
    comm.shutdown()
    return total.tolist()


@pytest.mark.timeout(60)
def test_shrink_with_exclude_leaves_out_the_given_ranks():
    results = rank_threads.run(_leave_one_out, 4, timeout=45)
    assert results[:3] == [[6] * 1000] * 3 and results[3] is None


_shrunk = {}


def _lost_elsewhere(rank, world, done):
    comm = rcoll.init(rank, world)
    comm.allreduce(np.ones(4, np.int32))
    if rank == 2:  # alive and silent: its connections stay up, only the others' word says it is gone
        done.wait(60)
        comm.shutdown()
        return None
    start = time.monotonic()
    comm = comm.shrink(lost=[2], timeout=60)
    _shrunk[rank] = time.monotonic() - start
    total = comm.allreduce(np.full(10, rank + 1, np.int64)).tolist()
    comm.barrier()
    done.set()
    comm.shutdown()
    return total


@pytest.mark.timeout(60)
def test_shrink_takes_ranks_lost_on_another_communicator():
    """shrink(lost=[2]): rank 2's death was seen on a sibling communicator, so
    nobody waits the 60 s timeout for it (hvd.elastic's reset relies on this)."""
    results = rank_threads.run(_lost_elsewhere, 3, threading.Event(), timeout=45)
    assert results == [[3] * 10, [3] * 10, None]
    assert max(_shrunk.values()) < 20, _shrunk


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_torch_survivors_shrink_the_default_group_and_train_on(tmp_path):
    """rcoll.torch_backend.shrink() after kill -9 of rank 2 of 4 (ranks started as
    srun would start them; torchrun would kill the survivors itself)."""
    pytest.importorskip("torch")
    results = _job(4, [2], None, tmp_path, script="shrink_torch_worker.py")
    assert results[2][0] == -9, results[2]
    for r in (0, 1, 3):
        code, stdout, stderr, report = results[r]
        assert code == 0, f"rank {r} exited {code}:\n{stderr[-3000:]}"
        launch.check_rank_output(f"rank {r}", stdout, stderr, allow=[WARN])
        assert report["error"].startswith("PeerError: ") and "rank 2 " in report["error"], report
        assert report["errored"].startswith("PeerError: "), report
        assert (report["rank"], report["size"]) == ([0, 1, 3].index(r), 3), report


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_torchft_style_configure_reforms_the_group_after_a_death(tmp_path):
    """RcollProcessGroup.configure() (torchft's reconfiguration) after kill -9 of
    rank 1 of 3: the survivors re-form the group at world 2 on a fresh prefix of
    a store that outlives every rank (torchft's lighthouse/manager hosts one)."""
    torch = pytest.importorskip("torch")
    store = torch.distributed.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    results = _job(3, [1], str(store.port), tmp_path, script="configure_torch_worker.py")
    assert results[1][0] == -9, results[1]
    for r in (0, 2):
        code, stdout, stderr, report = results[r]
        assert code == 0, f"rank {r} exited {code}:\n{stderr[-3000:]}"
        launch.check_rank_output(f"rank {r}", stdout, stderr, allow=[WARN])
        assert re.search(r"rank 1\b", report["error"]) and report["errored"].startswith("PeerError: "), report
        assert report["rank"] == [0, 2].index(r), report
