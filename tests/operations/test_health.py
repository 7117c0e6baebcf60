"""Which rank is slow and which link is bad, while the job runs
(python/rcoll/_health.py, csrc/edge_meter.h): rank 0's watch names a rank
slowed by CPU hogs beside it as the straggler, and the edges through an
emulated host's link shaped to a tenth of the others as slow, in one WARN
each, in rcoll.stats() and in `python -m rcoll status`; both jobs run under
torchrun and every rank's exit and stderr are checked. The judgement itself
is checked first on made-up statuses."""
from __future__ import annotations

import json
import os
import random
import re
import threading
import time
from pathlib import Path

import pytest
from support import launch
from support.emulated_hosts import Hosts, needs_netns, shape, torchrun_on_hosts

from rcoll import _health

RCOLL_WARN = r"^\[rcoll \d+ rank 0\] WARN: "
TRIALS = int(os.environ.get("RCOLL_TEST_HEALTH_TRIALS", "1"))  # more to measure the detection times
HOSTNAME_WARNING = r"\[c10d\] The hostname of the client socket cannot be retrieved"


def _status(arrivals=None, edges=None, host="h"):
    return {"host": host, "arrivals": arrivals or {}, "edges": edges or []}


def _apart(statuses):
    """Each rank on a host of its own."""
    for rank, status in statuses.items():
        status["host"] = f"host{rank}"
    return statuses


def _arrivals(waits_and_outside):
    return {"0": [[seq, w, o] for seq, (w, o) in enumerate(waits_and_outside, 1)]}


def test_a_rank_that_works_longer_between_collectives_is_the_straggler():
    rng = random.Random(1)
    statuses = {}
    for rank in range(4):
        rows = []
        for _ in range(40):
            jitter = rng.uniform(0, 5)
            # Rank 2 works 80 ms longer between collectives: the others wait for it.
            rows.append((jitter, 100 + jitter + 80) if rank == 2 else (80 + jitter, 100 + jitter))
        statuses[rank] = _status(_arrivals(rows), host=f"host{rank}")
    found = _health.judge(statuses, margin_ms=50, ratio=4)
    assert [(s["rank"], s["host"]) for s in found["stragglers"]] == [(2, "host2")], found
    assert found["lateness_ms"]["0"]["2"] > 70 and all(abs(found["lateness_ms"]["0"][r]) < 10 for r in "013")
    assert "rank 2 (host host2) is a straggler" in _health.describe_straggler(found["stragglers"][0])


def test_jitter_a_late_end_and_too_few_collectives_name_no_straggler():
    rng = random.Random(2)
    noisy = {r: _status(_arrivals([(rng.uniform(0, 80), rng.uniform(0, 80)) for _ in range(64)])) for r in range(4)}
    assert _health.judge(noisy, 50, 4)["stragglers"] == []
    # Rank 3 comes 100 ms late, but only because each collective ends later for it (a slow link into it).
    behind_a_link = {r: _status(_arrivals([(0 if r == 3 else 100, 10)] * 64)) for r in range(4)}
    assert _health.judge(behind_a_link, 50, 4)["stragglers"] == []
    few = {r: _status(_arrivals([(0 if r == 1 else 200, 210 if r == 1 else 10)] * 7)) for r in range(2)}
    assert _health.judge(few, 50, 4)["stragglers"] == []
    assert _health.judge({r: _status(_arrivals([(0 if r == 1 else 200, 210 if r == 1 else 10)] * 8))
                          for r in range(2)}, 50, 4)["stragglers"][0]["rank"] == 1


def test_an_edge_far_below_the_others_of_its_transport_is_slow():
    mib = 1 << 20

    def edge(peer, rate_mib, direction="in", transport="tcp", total=64 * mib):  # a status on a host of its own
        return {"peer": peer, "direction": direction, "transport": transport, "bytes": total,
                "seconds": total / (rate_mib * mib)}

    # A ring 0 -> 1 -> 2 -> 3 -> 0, host 3's link at a tenth: 2 -> 3 and 3 -> 0 are slow.
    statuses = {0: _status(edges=[edge(3, 11)], host="a"), 1: _status(edges=[edge(0, 110)], host="b"),
                2: _status(edges=[edge(1, 120)], host="c"), 3: _status(edges=[edge(2, 12)], host="d")}
    found = _health.judge(statuses, 50, 4)
    assert sorted((e["src"], e["dst"]) for e in found["slow_edges"]) == [(2, 3), (3, 0)], found
    assert "the link from rank 3" in _health.describe_slow_edge(
        next(e for e in found["slow_edges"] if e["src"] == 3))
    # Within the ratio, too few bytes, or nothing of the same transport to compare with: none.
    even = _apart({0: _status(edges=[edge(3, 40)]), 1: _status(edges=[edge(0, 110)]), 2: _status(edges=[edge(1, 120)])})
    assert _health.judge(even, 50, 4)["slow_edges"] == []
    small = _apart({0: _status(edges=[edge(3, 1, total=mib)]), 1: _status(edges=[edge(0, 110)]),
             2: _status(edges=[edge(1, 120)])})
    assert _health.judge(small, 50, 4)["slow_edges"] == []
    mixed = _apart({0: _status(edges=[edge(1, 1, "out", "ib")]), 1: _status(edges=[edge(2, 110)]),
             2: _status(edges=[edge(0, 120)])})
    assert _health.judge(mixed, 50, 4)["slow_edges"] == []


def test_a_finding_counts_from_its_second_round_and_is_said_once():
    rows = [(0, 190) if r == 1 else (100, 90) for r in range(2) for _ in range(16)]
    statuses = {r: _status(_arrivals(rows[r * 16:(r + 1) * 16]), host=f"h{r}") for r in range(2)}
    judge = _health.Judge(50, 4)
    first, said = judge.round(statuses, now=0.0)
    assert first["stragglers"] == [] and said == [] and first["lateness_ms"]["0"]["1"] == 100
    second, said = judge.round(statuses, now=5.0)
    assert [s["rank"] for s in second["stragglers"]] == [1] and len(said) == 1 and "rank 1 (host h1)" in said[0]
    assert judge.round(statuses, now=10.0)[1] == []  # said again only after Judge.WARN_AGAIN_S
    assert len(judge.round(statuses, now=10.0 + judge.WARN_AGAIN_S)[1]) == 1
    healthy = {r: _status(_arrivals([(100, 90)] * 16)) for r in range(2)}
    assert judge.round(healthy, now=400.0)[0]["stragglers"] == []
    assert judge.round(statuses, now=405.0)[0]["stragglers"] == []  # a new streak starts over


def test_the_edge_window_spans_the_last_rounds_that_carried_enough():
    mib = 1 << 20
    window = _health.EdgeWindow(now=0.0)
    key = (1, "in", "tcp")
    assert window.update({key: [mib, 1.0]}, now=5.0) == [
        {"peer": 1, "direction": "in", "transport": "tcp", "bytes": mib, "seconds": 1.0}]
    # 5 MiB a round: the span goes back three rounds (at least 16 MiB).
    for t in range(10, 45, 5):
        window.update({key: [mib * (t - 4), t / 5]}, now=float(t))
    (edge,) = window.update({key: [mib * 46, 10.0]}, now=45.0)
    assert (edge["bytes"], edge["seconds"]) == (mib * (46 - 26), 10.0 - 6.0), edge  # from the sample of t=30
    # A quiet edge gathers its bytes over the whole window (30 s at most).
    quiet = _health.EdgeWindow(now=0.0)
    for t in range(5, 65, 5):
        last = quiet.update({key: [mib * t // 5, t / 50]}, now=float(t))
    assert last[0]["bytes"] == mib * 6, last  # back to the sample of t=30
    assert quiet.update({key: [mib * 12, 1.2]}, now=100.0) == []  # nothing moved in the window


def test_edges_inside_one_host_are_not_judged():
    mib = 1 << 20
    edge = {"direction": "in", "transport": "tcp", "bytes": 64 * mib}
    statuses = {0: _status(edges=[{**edge, "peer": 1, "seconds": 64.0}], host="a"),
                1: _status(edges=[{**edge, "peer": 2, "seconds": 0.5}], host="a"),
                2: _status(edges=[{**edge, "peer": 0, "seconds": 0.5}], host="b"),
                3: _status(edges=[{**edge, "peer": 2, "seconds": 0.5}], host="c")}
    assert _health.judge(statuses, 50, 4)["slow_edges"] == []  # 1 -> 0 is loopback on host a
    statuses[0]["host"] = "d"
    assert [(e["src"], e["dst"]) for e in _health.judge(statuses, 50, 4)["slow_edges"]] == [(1, 0)]


# How both jobs end: rank 0 prints when and what its watch found, and what
# `python -m rcoll status` shows of the job, run as an operator runs it.
# Rank 0 asks `python -m rcoll status` what it sees. A job that defines
# keep_going() goes on with it until the status has answered: a link is slow
# only while it carries something, and the watch rounds go on meanwhile.
JOB_END = """
status = None
if rank == 0:
    print("AFTER", round(time.monotonic() - start, 1), flush=True)
    print("HEALTH", json.dumps(health), flush=True)
    store = f"torch://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    status = subprocess.Popen([sys.executable, "-m", "rcoll", "status", "--store", store],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
while keep_going is not None:
    keep_going()
    answered = torch.tensor([int(rank == 0 and status.poll() is not None)])
    dist.broadcast(answered, 0)
    if answered.item():
        break
if rank == 0:
    out, err = status.communicate(timeout=60)
    print("STATUS", status.returncode, err[-2000:], flush=True)
    print(out, flush=True)
dist.barrier()
dist.destroy_process_group()
print("DONE", flush=True)
"""

# Steps of training: a fixed amount of CPU work, then an allreduce of the
# gradients; the slow rank shares its CPU with three busy processes.
STRAGGLER_JOB = """
import json, os, subprocess, sys, time
import torch, torch.distributed as dist
import rcoll

slow = int(sys.argv[1])
dist.init_process_group("rcoll")
rank = dist.get_rank()
cpus = sorted(os.sched_getaffinity(0))
hog_cpu, work_cpu = cpus[-1], cpus[0]
hogs, grads = [], torch.ones(1000)
phase, rounds, start, health = 0, set(), time.monotonic(), {}
try:
    while True:
        t = time.thread_time()
        while time.thread_time() - t < 0.04:  # the step's own work: 40 ms of CPU
            pass
        grads.fill_(rank)
        dist.all_reduce(grads)
        assert grads[0].item() == sum(range(dist.get_world_size()))
        if rank == 0:
            health = rcoll.stats()["health"]
            if health.get("lateness_ms"):
                rounds.add(health["time"])
        # Rank 0 says when the healthy part is over (three judged rounds) and when the job is.
        state = torch.tensor([phase, 0])
        if rank == 0:
            if phase == 0 and (len(rounds) >= 3 or time.monotonic() - start > 60):
                print("HEALTHY", json.dumps(health), flush=True)
                state[0], start = 1, time.monotonic()
            state[1] = int(phase == 1 and (bool(health.get("stragglers")) or time.monotonic() - start > 90))
        dist.broadcast(state, 0)
        if state[0].item() == 1 and phase == 0:
            phase = 1  # from here one rank shares its CPU with three busy processes
            os.sched_setaffinity(0, {hog_cpu if rank == slow else work_cpu})
            if rank == slow:
                hog = "import os\\nparent = os.getppid()\\nwhile os.getppid() == parent: pass"
                hogs = [subprocess.Popen([sys.executable, "-c", hog],
                                         preexec_fn=lambda: os.sched_setaffinity(0, {hog_cpu})) for _ in range(3)]
        if state[1].item():
            break
finally:
    for h in hogs:
        h.kill()
        h.wait()
keep_going = None  # what the status shows was judged on the ops so far
""" + JOB_END


def _rank0_stderr(log_root: Path) -> str:
    """Rank 0's stderr, from a torchrun --log-dir under `log_root`."""
    for rank_dir in log_root.glob("**/attempt_*/0"):
        return (rank_dir / "stderr.log").read_text()
    raise AssertionError(f"no rank 0 log under {log_root}")


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs: one for the hogs, one for the others")
@pytest.mark.parametrize("trial", range(TRIALS))
def test_a_rank_slowed_by_cpu_hogs_beside_it_is_named_the_straggler(tmp_path, trial):
    slow = 1
    outs = launch.torchrun(launch.write_script(tmp_path, STRAGGLER_JOB), 3, tmp_path, args=[str(slow)],
                           env={"RCOLL_WATCH_INTERVAL": "1", "OMP_NUM_THREADS": "1"}, allow=[RCOLL_WARN],
                           timeout=200)
    out = outs[0]
    print(out)
    healthy = json.loads(out.split("HEALTHY ", 1)[1].splitlines()[0])
    assert healthy["lateness_ms"] and healthy["stragglers"] == [], healthy  # no one named while all were even
    health = json.loads(out.split("\nHEALTH ", 1)[1].splitlines()[0])
    assert [s["rank"] for s in health["stragglers"]] == [slow], health
    assert health["stragglers"][0]["late_ms"] >= 50, health
    # Named before the job gave up (90 s); how soon is measured, not judged here: it takes 64
    # shared samples, so it follows the op rate, which a loaded machine lowers.
    print(f"named after {float(out.split('AFTER ', 1)[1].split()[0]):.1f} s")
    assert "STATUS 0" in out and f"STRAGGLER: rank {slow} " in out, out
    warned = [line for line in _rank0_stderr(tmp_path).splitlines() if "straggler" in line]
    print("\n".join(warned))
    assert len(warned) == 1 and f"rank {slow} " in warned[0], warned


SLOW_LINK_JOB = """
import json, os, subprocess, sys, time
import torch, torch.distributed as dist
import rcoll

shaped_flag = sys.argv[2]
dist.init_process_group("rcoll")
rank, world = dist.get_rank(), dist.get_world_size()
print("NODE", sys.argv[1], "RANK", rank, flush=True)
x = torch.empty(1 << 20)  # 4 MiB
phase, rounds, start, health = 0, set(), time.monotonic(), {}
while True:
    x.fill_(rank + 1)
    dist.all_reduce(x)
    assert bool((x == world * (world + 1) // 2).all())
    done = torch.tensor([0])
    if rank == 0:
        health = rcoll.stats()["health"]
        if health.get("edges", 0) >= world:
            rounds.add(health["time"])
        if phase == 0 and (len(rounds) >= 3 or time.monotonic() - start > 60):
            print("HEALTHY", json.dumps(health), flush=True)  # the test shapes one host's link now
            phase = 1
        elif phase == 1 and os.path.exists(shaped_flag):
            phase, start = 2, time.monotonic()
        done[0] = int(phase == 2 and (bool(health.get("slow_edges")) or time.monotonic() - start > 90))
        done[0] |= int(time.monotonic() - start > 180)
    dist.broadcast(done, 0)
    if done.item():
        break


def keep_going():
    x.fill_(rank + 1)
    dist.all_reduce(x)
""" + JOB_END


@needs_netns()
@pytest.mark.slow
@pytest.mark.timeout(420)
@pytest.mark.parametrize("trial", range(TRIALS))
def test_the_edges_through_a_link_slowed_mid_job_are_named(tmp_path, trial):
    """Four hosts at 1 Gbit/s: a few rounds name nothing; then host 3's link
    is shaped to a tenth while the job runs, and the edges through it are
    named within 30 s."""
    script = launch.write_script(tmp_path, SLOW_LINK_JOB)
    shaped = tmp_path / "shaped"
    with Hosts(4, rate="1gbit", tag="health", subnet="198.18.43") as hosts:
        slow_host = 3
        job = {}
        runner = threading.Thread(target=lambda: job.update(outcomes=torchrun_on_hosts(
            hosts, script, tmp_path, nproc=1, host_args=[[str(n), str(shaped)] for n in range(4)],
            env={"RCOLL_WATCH_INTERVAL": "2", "OMP_NUM_THREADS": "1"}, timeout=360)), daemon=True)
        runner.start()
        deadline = time.monotonic() + 240
        while runner.is_alive() and time.monotonic() < deadline and not any(
                "HEALTHY" in p.read_text() for p in tmp_path.glob("node*/*/attempt_*/*/stdout.log")):
            time.sleep(0.5)
        shape(hosts.spaces[slow_host], "eth0", "100mbit")  # a tenth, both ways
        shape(*hosts.far_end(slow_host), "100mbit")
        shaped.touch()
        runner.join(timeout=400)
    assert "outcomes" in job, "the job did not end (see the test's log for torchrun's output)"
    rank_of_node, out0, err0 = {}, "", ""
    for node, (code, err) in enumerate(job["outcomes"]):
        assert code == 0, f"node {node}'s torchrun exited {code}\n{err[-3000:]}"
        (rank_dir,) = sorted((tmp_path / f"node{node}").glob("*/attempt_*/*"))
        out, rank_err = (rank_dir / "stdout.log").read_text(), (rank_dir / "stderr.log").read_text()
        launch.check_rank_output(f"node {node}", out, rank_err, allow=(RCOLL_WARN, HOSTNAME_WARNING))
        rank = int(re.search(r"^NODE \d+ RANK (\d+)", out, re.M).group(1))
        rank_of_node[node] = rank
        if rank == 0:
            out0, err0 = out, rank_err
    print(out0)
    slow = rank_of_node[slow_host]
    healthy = json.loads(out0.split("HEALTHY ", 1)[1].splitlines()[0])
    assert healthy["edges"] >= 4 and healthy["slow_edges"] == [], healthy  # nothing named at even rates
    health = json.loads(out0.split("\nHEALTH ", 1)[1].splitlines()[0])
    named = {(e["src"], e["dst"]) for e in health["slow_edges"]}
    assert named and all(slow in edge for edge in named), (slow, health)
    assert all(e["transport"] == "tcp" and e["rate"] * 4 < e["typical"] for e in health["slow_edges"]), health
    assert float(out0.split("AFTER ", 1)[1].split()[0]) <= 30, out0
    assert "STATUS 0" in out0 and "SLOW LINK: the link from rank" in out0, out0
    warned = [line for line in err0.splitlines() if "the link from rank" in line]
    print("\n".join(warned))
    assert warned and all(f"rank {slow} " in line for line in warned), err0
