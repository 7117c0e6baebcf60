"""The flight recorder (csrc/flight_recorder.h), as an operator uses it: a job
under torchrun goes wrong, every rank's dump lands in RCOLL_TRACE_DIR, and
torch's own analyzer (torchfrtrace) reads the dumps and names the rank and
the collective that went wrong."""
from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.launch import DONE, free_port, torchrun, write_script

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(300)

# rcoll's WARN lines (the failure, where the dump went) are expected on stderr.
RCOLL_WARN = r"^\[rcoll \d+ rank \d+\] WARN: "
TRIALS = int(os.environ.get("RCOLL_TEST_TRACE_TRIALS", "2"))

# Steps of a training loop, each an allreduce of another size (as a model's
# buckets are); one rank leaves one out, so from then on it is a step ahead.
SKIP_JOB = """
import os, sys
from datetime import timedelta
import torch, torch.distributed as dist

dist.init_process_group("rcoll", timeout=timedelta(seconds=60))
rank = dist.get_rank()
skip_rank, skip_step = int(sys.argv[1]), int(sys.argv[2])
outcome = "finished"
try:
    for step in range(6):
        if rank == skip_rank and step == skip_step:
            continue  # the bug: this rank leaves one allreduce out
        t = torch.full((1000 + step,), float(rank))
        dist.all_reduce(t)
except Exception as e:  # the mismatch, on every rank
    outcome = f"failed: {type(e).__name__}: {e}"
dump = os.path.join(os.environ["RCOLL_TRACE_DIR"], f"rcoll_trace_rank_{rank}")
print("OUTCOME", outcome, flush=True)
print("DUMPED", os.path.exists(dump), flush=True)
"""

# Two ranks call two collectives in the other order.
ORDER_JOB = """
import os, sys
from datetime import timedelta
import torch, torch.distributed as dist

dist.init_process_group("rcoll", timeout=timedelta(seconds=60))
rank = dist.get_rank()
swapped = {int(r) for r in sys.argv[1].split(",")}
outcome = "finished"
try:
    for step in range(3):
        dist.all_reduce(torch.ones(64))
    a, b = torch.ones(256), torch.ones(128)
    calls = [lambda: dist.all_reduce(a), lambda: dist.broadcast(b, src=0)]
    for call in (reversed(calls) if rank in swapped else calls):
        call()
except Exception as e:
    outcome = f"failed: {type(e).__name__}: {e}"
print("OUTCOME", outcome, flush=True)
print("DUMPED", os.path.exists(os.path.join(os.environ["RCOLL_TRACE_DIR"], f"rcoll_trace_rank_{rank}")), flush=True)
"""


def analyze(trace_dir: Path) -> str:
    """torch's analyzer on the dumps, as an operator runs it."""
    torchfrtrace = Path(sys.executable).parent / "torchfrtrace"
    cmd = [str(torchfrtrace)] if torchfrtrace.exists() else [sys.executable, "-m",
                                                             "torch.distributed.flight_recorder.fr_trace"]
    proc = subprocess.run([*cmd, str(trace_dir)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def culprits(report: str) -> set:
    """The ranks the analyzer calls culprits. It compares every rank with the
    first dump it reads (directory order): when that is the odd rank out, it
    names all the others, so the odd one is what remains."""
    named = set()
    for line in report.splitlines():
        if line.startswith("error msg:"):
            for part in line.split("Culprit rank ")[1:]:
                named.add(int(part.split(";")[0]))
    return named


def odd_one_out(report: str, world: int) -> set:
    named = culprits(report)
    return named if len(named) <= world // 2 else set(range(world)) - named


def run_job(tmp_path: Path, body: str, args, world: int = 4):
    trace_dir = tmp_path / f"traces-{os.urandom(3).hex()}"
    trace_dir.mkdir()
    outs = torchrun(write_script(tmp_path, body), world, tmp_path, args=[str(a) for a in args],
                    env={"RCOLL_TRACE_DIR": str(trace_dir)}, allow=[RCOLL_WARN], timeout=240)
    for out in outs:
        assert "OUTCOME failed:" in out and ("MismatchError" in out or "PeerError" in out), out
        assert "DUMPED True" in out, out
    dumps = sorted(p.name for p in trace_dir.iterdir())
    assert dumps == [f"rcoll_trace_rank_{r}" for r in range(world)], dumps
    return trace_dir


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(TRIALS))
def test_a_rank_that_skips_an_allreduce_is_named_by_torchs_analyzer(tmp_path, trial):
    skip_rank, skip_step = (2, 3) if trial % 2 == 0 else (1, 1)
    trace_dir = run_job(tmp_path, SKIP_JOB, [skip_rank, skip_step])
    with open(trace_dir / f"rcoll_trace_rank_{skip_rank}", "rb") as f:
        dump = pickle.load(f)
    last = dump["entries"][-1]
    assert last["profiling_name"] == "gloo:all_reduce" and last["rcoll_state"] == "failed", last
    assert last["input_sizes"] == [[1000 + skip_step + 1]], last  # its next step's tensor, at the skipped one's place
    report = analyze(trace_dir)
    print(report)
    assert odd_one_out(report, 4) == {skip_rank}, report
    seq = last["collective_seq_id"]
    assert f"Collective sequence number: {seq} has errors" in report, report
    assert f"[[{1000 + skip_step}]]" in report and f"[[{1000 + skip_step + 1}]]" in report, report


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(TRIALS))
def test_ranks_that_call_collectives_in_another_order_are_named(tmp_path, trial):
    swapped = 1 if trial % 2 == 0 else 3
    trace_dir = run_job(tmp_path, ORDER_JOB, [str(swapped)])
    report = analyze(trace_dir)
    assert odd_one_out(report, 4) == {swapped}, report
    assert "collective type" in report and "broadcast" in report and "all_reduce" in report, report


def test_sigusr1_and_dump_trace_write_the_process_s_ops(tmp_path):
    """A live process: SIGUSR1 dumps its last ops (oldest first, with their
    states), as does rcoll.dump_trace(); the buffer keeps the newest
    RCOLL_TRACE_BUFFER_SIZE."""
    trace_dir = tmp_path / "traces"
    trace_dir.mkdir()
    script = write_script(tmp_path, """
        import os, signal, time, numpy as np, rcoll
        comm = rcoll.init(rank=0, world_size=1)
        for n in range(12):
            comm.allreduce(np.ones(n + 1, np.float32))
        os.kill(os.getpid(), signal.SIGUSR1)
        path = os.path.join(os.environ["RCOLL_TRACE_DIR"], "rcoll_trace_rank_0")
        for _ in range(200):
            if os.path.exists(path):
                break
            time.sleep(0.05)
        print("SIGNAL", os.path.exists(path), flush=True)
        print("EXPLICIT", rcoll.dump_trace(os.path.join(os.environ["RCOLL_TRACE_DIR"], "explicit")), flush=True)
        comm.shutdown()
    """)
    env = {**os.environ, "RCOLL_TRACE_DIR": str(trace_dir), "RCOLL_TRACE_BUFFER_SIZE": "5",
           "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0 and DONE in proc.stdout, proc.stderr[-3000:]
    assert "SIGNAL True" in proc.stdout, proc.stdout
    with open(trace_dir / "rcoll_trace_rank_0", "rb") as f:
        dump = pickle.load(f)
    assert dump["version"] == "2.10" and dump["rcoll_reason"] == "SIGUSR1"
    entries = dump["entries"]
    assert [e["input_sizes"] for e in entries] == [[[n]] for n in range(8, 13)], entries  # the newest five
    assert all(e["state"] == "completed" and e["rcoll_state"] == "finished" for e in entries)
    assert [e["record_id"] for e in entries] == sorted(e["record_id"] for e in entries)
    assert (trace_dir / "explicit").exists()


def test_torch_groups_are_named_with_their_global_ranks(tmp_path):
    """pg_config as torch's recorder has it: the default group and a sub-group
    with torch's names and descriptions and the members' global ranks; each
    entry names its group."""
    script = write_script(tmp_path, """
        import torch, torch.distributed as dist
        import rcoll
        dist.init_process_group("rcoll")
        rank = dist.get_rank()
        dist.all_reduce(torch.ones(3))
        odd = dist.new_group([1, 3], group_desc="odd ranks")
        if rank in (1, 3):
            dist.all_reduce(torch.ones(5), group=odd)
        dump = rcoll.trace()
        groups = {c["name"]: (c["desc"], c["ranks"]) for c in dump["pg_config"].values()}
        print("GROUPS", sorted(groups.values()), flush=True)
        print("ENTRIES", [(e["process_group"][1], e["input_sizes"]) for e in dump["entries"]], flush=True)
        print("RANK", dump["rank"], flush=True)
        dist.destroy_process_group()
    """)
    outs = torchrun(script, 4, tmp_path)
    for rank, out in enumerate(outs):
        groups = [("default_pg", "[0, 1, 2, 3]")] + ([("odd ranks", "[1, 3]")] if rank in (1, 3) else [])
        assert f"GROUPS {sorted(groups)}" in out, out
        entries = [("default_pg", [[3]])] + ([("odd ranks", [[5]])] if rank in (1, 3) else [])
        assert f"ENTRIES {entries}" in out, out
        assert f"RANK {rank}" in out, out


# The NCCL-style hang: rank 2 leaves the last allreduce out and goes on with
# something else (here it sleeps), so the others wait for it until they time
# out. They dump at the timeout; rank 2, in no rcoll op, dumps when its watch
# round sees their failure on the store.
HANG_JOB = """
import os, time
from datetime import timedelta
import torch, torch.distributed as dist

dist.init_process_group("rcoll", timeout=timedelta(seconds=4))
rank = dist.get_rank()
dump = os.path.join(os.environ["RCOLL_TRACE_DIR"], f"rcoll_trace_rank_{rank}")
outcome = "finished"
try:
    for step in range(5):
        if rank == 2 and step == 4:
            break  # the bug
        dist.all_reduce(torch.ones(100))
except Exception as e:
    outcome = f"failed: {type(e).__name__}"
if rank == 2:
    deadline = time.time() + 30
    while not os.path.exists(dump) and time.time() < deadline:
        time.sleep(0.1)
print("OUTCOME", outcome, flush=True)
print("DUMPED", os.path.exists(dump), flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("trial", range(TRIALS))
def test_a_rank_outside_rcoll_dumps_when_the_others_time_out(tmp_path, trial):
    trace_dir = tmp_path / "traces"
    trace_dir.mkdir()
    outs = torchrun(write_script(tmp_path, HANG_JOB), 4, tmp_path, allow=[RCOLL_WARN], timeout=240,
                    env={"RCOLL_TRACE_DIR": str(trace_dir), "RCOLL_WATCH_INTERVAL": "1"})
    for rank, out in enumerate(outs):
        assert ("OUTCOME finished" if rank == 2 else "OUTCOME failed: TimeoutError") in out \
            or (rank != 2 and "OUTCOME failed:" in out), out
        assert "DUMPED True" in out, out
    with open(trace_dir / "rcoll_trace_rank_2", "rb") as f:
        dump = pickle.load(f)
    assert "another rank" in dump["rcoll_reason"], dump["rcoll_reason"]
    report = analyze(trace_dir)
    assert "Not all ranks joining collective" in report and "missing ranks: {2}" in report, report


STOP_JOB = """
import os, sys
import torch, torch.distributed as dist

dist.init_process_group("rcoll")
rank = dist.get_rank()
for _ in range(3):
    dist.all_reduce(torch.ones(10))
print("READY", os.getpid(), flush=True)
if rank == 1:
    sys.stdin.readline()  # the test stops this process here, then lets it go
t = torch.ones(1000)
dist.all_reduce(t)
assert t[0].item() == dist.get_world_size()
dist.destroy_process_group()
print("RCOLL-JOB-DONE", flush=True)
"""


def test_status_names_a_stopped_rank_and_what_the_others_wait_in(tmp_path):
    """SIGSTOP one rank of a torch job: within 10 s `python -m rcoll status`
    names it (no status coming) with its last op, and the others in their
    allreduce, waiting for it; SIGCONT, and the job ends well."""
    script = tmp_path / "job.py"
    script.write_text(STOP_JOB)
    port = str(free_port())
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "WORLD_SIZE": "3",
           "RCOLL_WATCH_INTERVAL": "1", "OMP_NUM_THREADS": "1"}
    env.pop("RCOLL_TRACE_DIR", None)
    procs = [subprocess.Popen([sys.executable, str(script)], env={**env, "RANK": str(r)}, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in range(3)]
    try:
        pids = [int(p.stdout.readline().split()[1]) for p in procs]
        os.kill(pids[1], signal.SIGSTOP)
        stopped = time.time()
        report = ""
        while time.time() - stopped < 10:
            run = subprocess.run([sys.executable, "-m", "rcoll", "status", "--store", f"torch://127.0.0.1:{port}"],
                                 capture_output=True, text=True, timeout=30, env=env)
            assert run.returncode == 0, run.stderr[-3000:]
            report = run.stdout
            rows = {int(line.split()[0]): line for line in report.split("\n\n")[0].splitlines()[2:]}
            if "NO STATUS" in rows[1] and all("allreduce #4" in rows[r] and "ranks [1]" in rows[r] for r in (0, 2)):
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"status did not name the stopped rank within 10 s:\n{report}")
        print(report)
        # What it last reported (its watch round may have come before or inside its first allreduces).
        assert "last seen " in rows[1] and str(pids[1]) in rows[1], report
        os.kill(pids[1], signal.SIGCONT)
        procs[1].stdin.write("\n")
        procs[1].stdin.flush()
        for p in procs:
            out, err = p.communicate(timeout=60)
            assert p.returncode == 0 and DONE in out, err[-3000:]
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
                p.wait()
