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
from pathlib import Path

import pytest
from support import launch
from support.emulated_hosts import Hosts, needs_netns, shape, torchrun_on_hosts

from rcoll import _health

RCOLL_WARN = r"^\[rcoll \d+ rank 0\] WARN: "
HOSTNAME_WARNING = r"\[c10d\] The hostname of the client socket cannot be retrieved"


def _status(arrivals=None, edges=None, host="h"):
    return {"host": host, "arrivals": arrivals or {}, "edges": edges or []}


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
    assert found["lateness_ms"]["0"][2] > 70 and all(abs(found["lateness_ms"]["0"][r]) < 10 for r in (0, 1, 3))
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

    def edge(peer, rate_mib, direction="in", transport="tcp", total=64 * mib):
        return {"peer": peer, "direction": direction, "transport": transport, "bytes": total,
                "seconds": total / (rate_mib * mib)}

    # A ring 0 -> 1 -> 2 -> 3 -> 0, host 3's link at a tenth: 2 -> 3 and 3 -> 0 are slow.
    statuses = {0: _status(edges=[edge(3, 11)]), 1: _status(edges=[edge(0, 110)]),
                2: _status(edges=[edge(1, 120)]), 3: _status(edges=[edge(2, 12)])}
    found = _health.judge(statuses, 50, 4)
    assert sorted((e["src"], e["dst"]) for e in found["slow_edges"]) == [(2, 3), (3, 0)], found
    assert "the link from rank 3" in _health.describe_slow_edge(
        next(e for e in found["slow_edges"] if e["src"] == 3))
    # Within the ratio, too few bytes, or nothing of the same transport to compare with: none.
    even = {0: _status(edges=[edge(3, 40)]), 1: _status(edges=[edge(0, 110)]), 2: _status(edges=[edge(1, 120)])}
    assert _health.judge(even, 50, 4)["slow_edges"] == []
    small = {0: _status(edges=[edge(3, 1, total=mib)]), 1: _status(edges=[edge(0, 110)]),
             2: _status(edges=[edge(1, 120)])}
    assert _health.judge(small, 50, 4)["slow_edges"] == []
    mixed = {0: _status(edges=[edge(1, 1, "out", "ib")]), 1: _status(edges=[edge(2, 110)]),
             2: _status(edges=[edge(0, 120)])}
    assert _health.judge(mixed, 50, 4)["slow_edges"] == []


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
hogs = []
if rank == slow:
    hog = "import os\\nparent = os.getppid()\\nwhile os.getppid() == parent: pass"
    hogs = [subprocess.Popen([sys.executable, "-c", hog], preexec_fn=lambda: os.sched_setaffinity(0, {hog_cpu}))
            for _ in range(3)]
os.sched_setaffinity(0, {hog_cpu if rank == slow else work_cpu})
grads = torch.ones(1000)
start, health = time.monotonic(), {}
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
        done = torch.tensor([int(rank == 0 and (bool(health.get("stragglers")) or time.monotonic() - start > 90))])
        dist.broadcast(done, 0)
        if done.item():
            break
finally:
    for h in hogs:
        h.kill()
        h.wait()
if rank == 0:
    print("AFTER", round(time.monotonic() - start, 1), flush=True)
    print("HEALTH", json.dumps(health), flush=True)
    store = f"torch://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    status = subprocess.run([sys.executable, "-m", "rcoll", "status", "--store", store], capture_output=True,
                            text=True, timeout=60)
    print("STATUS", status.returncode, status.stderr[-2000:], flush=True)
    print(status.stdout, flush=True)
dist.barrier()
dist.destroy_process_group()
print("DONE", flush=True)
"""


def _rank0_stderr(log_root: Path) -> str:
    """Rank 0's stderr, from a torchrun --log-dir under `log_root`."""
    for rank_dir in log_root.glob("**/attempt_*/0"):
        return (rank_dir / "stderr.log").read_text()
    raise AssertionError(f"no rank 0 log under {log_root}")


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs: one for the hogs, one for the others")
def test_a_rank_slowed_by_cpu_hogs_beside_it_is_named_the_straggler(tmp_path):
    slow = 1
    outs = launch.torchrun(launch.write_script(tmp_path, STRAGGLER_JOB), 3, tmp_path, args=[str(slow)],
                           env={"RCOLL_WATCH_INTERVAL": "1", "OMP_NUM_THREADS": "1"}, allow=[RCOLL_WARN],
                           timeout=200)
    out = outs[0]
    print(out)
    health = json.loads(out.split("HEALTH ", 1)[1].splitlines()[0])
    assert [s["rank"] for s in health["stragglers"]] == [slow], health
    assert health["stragglers"][0]["late_ms"] >= 50, health
    assert float(out.split("AFTER ", 1)[1].split()[0]) <= 30, out
    assert "STATUS 0" in out and f"STRAGGLER: rank {slow} " in out, out
    warned = [line for line in _rank0_stderr(tmp_path).splitlines() if "straggler" in line]
    assert len(warned) == 1 and f"rank {slow} " in warned[0], warned


SLOW_LINK_JOB = """
import json, os, subprocess, sys, time
import torch, torch.distributed as dist
import rcoll

dist.init_process_group("rcoll")
rank, world = dist.get_rank(), dist.get_world_size()
print("NODE", sys.argv[1], "RANK", rank, flush=True)
x = torch.empty(1 << 20)  # 4 MiB
start, health = time.monotonic(), {}
while True:
    x.fill_(rank + 1)
    dist.all_reduce(x)
    assert bool((x == world * (world + 1) // 2).all())
    if rank == 0:
        health = rcoll.stats()["health"]
    done = torch.tensor([int(rank == 0 and (bool(health.get("slow_edges")) or time.monotonic() - start > 90))])
    dist.broadcast(done, 0)
    if done.item():
        break
if rank == 0:
    print("AFTER", round(time.monotonic() - start, 1), flush=True)
    print("HEALTH", json.dumps(health), flush=True)
    store = f"torch://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
    status = subprocess.run([sys.executable, "-m", "rcoll", "status", "--store", store], capture_output=True,
                            text=True, timeout=60)
    print("STATUS", status.returncode, status.stderr[-2000:], flush=True)
    print(status.stdout, flush=True)
dist.barrier()
dist.destroy_process_group()
print("DONE", flush=True)
"""


@needs_netns()
@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_edges_through_a_slow_hosts_link_are_named_while_the_job_runs(tmp_path):
    script = launch.write_script(tmp_path, SLOW_LINK_JOB)
    with Hosts(4, rate="1gbit", tag="health", subnet="198.18.43") as hosts:
        slow_host = 3
        shape(hosts.spaces[slow_host], "eth0", "100mbit")  # a tenth, both ways
        shape(*hosts.far_end(slow_host), "100mbit")
        outcomes = torchrun_on_hosts(hosts, script, tmp_path, nproc=1, host_args=[[str(n)] for n in range(4)],
                                     env={"RCOLL_WATCH_INTERVAL": "2", "OMP_NUM_THREADS": "1"}, timeout=240)
    rank_of_node, out0, err0 = {}, "", ""
    for node, (code, err) in enumerate(outcomes):
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
    health = json.loads(out0.split("HEALTH ", 1)[1].splitlines()[0])
    named = {(e["src"], e["dst"]) for e in health["slow_edges"]}
    assert named and all(slow in edge for edge in named), (slow, health)
    assert all(e["transport"] == "tcp" and e["rate"] * 4 < e["typical"] for e in health["slow_edges"]), health
    assert float(out0.split("AFTER ", 1)[1].split()[0]) <= 30, out0
    assert "STATUS 0" in out0 and "SLOW LINK: the link from rank" in out0, out0
    warned = [line for line in err0.splitlines() if "the link from rank" in line]
    assert warned and all(f"rank {slow} " in line for line in warned), err0
