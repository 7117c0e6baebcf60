"""torchrun restarts (issue #21 item 2): a DDP job with backend="rcoll"
(tests/torch_backend/journeys/restart_ddp.py) whose worker is SIGKILLed in the middle of
training, after a checkpoint, in the first attempt, or before it joined the
group at all (the others waiting for it in init_process_group). torchrun
(--max-restarts 2) tears the group down and starts it again on the same store,
which holds the keys of the attempt before (torch gives no fresh prefix); the
new workers meet on fresh keys all the same (csrc/mesh.cc freshPrefix), resume
from the checkpoint's step (step 0 without one) and finish. Proved, on one host
(4 ranks) and on two emulated hosts (2 x 2, one torchrun each, a worker of the
second host killed):
- every torchrun exits 0 and its stderr holds no traceback, abort or core dump;
- the kill happened in attempt 0 and the survivors ended at once: with rcoll's
  PeerError naming a dead rank, or by torchrun's SIGTERM, nothing worse;
- every rank of the last attempt resumed from the checkpoint (not step 0), holds
  the parameters every other rank holds, equal bit for bit to an uninterrupted
  run's, printed the job's last line and nothing on stderr;
- no job process outlives torchrun and /dev/shm holds nothing new.
RCOLL_TEST_TRIALS=N repeats each job N times (default 1)."""
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import launch
from support.common import dev_shm_names
from support.emulated_hosts import TwoHosts, needs_netns, torchrun_on_hosts
from support.paths import JOURNEYS

pytestmark = pytest.mark.slow  # whole torchrun jobs, started twice each

torch = pytest.importorskip("torch")

TRIALS = int(os.environ.get("RCOLL_TEST_TRIALS", "1"))
JOB = JOURNEYS / "restart_ddp.py"
WORLD, CHECKPOINT_STEP, KILLED_AFTER = 4, 4, 6  # restart_ddp.py's CKPT_EVERY and KILL_AFTER
TIMEOUT = 120  # per torchrun job
PROMPT = 20.0  # s from the kill to the restarted workers' start: nobody waited for the SIGKILL at 30 s
# An interrupted attempt's survivor may end by torchrun's SIGTERM (nothing on
# stderr) or by the PeerError rcoll raised in its allreduce (a traceback); never so.
FATAL = re.compile(r"terminate called|Segmentation fault|Aborted|core dumped|exception not rethrown")
PEER_ERROR = re.compile(r"PeerError: rank \d+: .*(rank \d+ closed its connection|connection to rank \d+)")
TORCH_WARNINGS = (r"\[c10d\] The hostname of the client socket cannot be retrieved",)  # test_multinode.py


def _job_processes(marker):
    """Pids of the processes whose command line names `marker` (the trial's directory)."""
    pids = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read() and int(entry) != os.getpid():
                    pids.append(int(entry))
        except (OSError, ValueError):
            pass
    return pids


def _check(job_dir, log_dir, outcomes, shm_before, killed_after=KILLED_AFTER):
    """Everything the module docstring promises, for one trial."""
    for node, (code, err) in enumerate(outcomes):
        assert code == 0, f"node {node}'s torchrun exited {code}\n{err[-4000:]}"
        launch.check_launcher_output(f"node {node}'s torchrun", err)
    assert any("exitcode: -9" in err for _, err in outcomes), "no agent reported the SIGKILLed worker"
    killed = json.loads((job_dir / "killed.json").read_text())
    assert killed["restart"] == 0 and killed["after"] == killed_after, killed
    for rank in range(WORLD):
        result = json.loads((job_dir / f"result-{rank}.json").read_text())
        # Started after the kill: a restarted worker (a host whose own workers did not
        # fail restarts them as a membership change, without counting a restart).
        assert 0 < result["started"] - killed["at"] < PROMPT, (rank, result["started"] - killed["at"])
        assert result["resumed_from"] == (CHECKPOINT_STEP if killed_after else 0), result
        assert result["replicas_equal"] and result["matches_reference"], result
    # A host's log directory -> attempt -> its ranks' log directories. A membership-change
    # restart keeps the attempt number: that host's last attempt may be attempt_0 again.
    attempts = {}
    for d in sorted(log_dir.glob("**/attempt_*/*")):
        attempts.setdefault(d.parent.parent, {}).setdefault(int(d.parent.name.split("_")[1]), []).append(d)
        err = (d / "stderr.log").read_text()
        assert not FATAL.search(err), f"{d}:\n{err[-3000:]}"
        assert "Traceback" not in err or PEER_ERROR.search(err), f"{d}:\n{err[-3000:]}"
    last = [d for node in attempts.values() for d in node[max(node)]]
    assert len(last) == WORLD and any(max(node) >= 1 for node in attempts.values()), attempts
    for d in last:
        launch.check_rank_output(str(d.relative_to(log_dir)), (d / "stdout.log").read_text(),
                                 (d / "stderr.log").read_text(), allow=TORCH_WARNINGS)
    assert _job_processes(str(job_dir)) == [], "job processes outlived torchrun"
    new = dev_shm_names() - shm_before
    if new:
        time.sleep(1)  # what another test made and removes at once is not ours
        new &= dev_shm_names()
    assert not new, f"left in /dev/shm: {sorted(new)}"


def _trials(tmp_path, run, killed_after=KILLED_AFTER):
    """Runs `run(job_dir, log_dir)` (returns the agents' (exit code, stderr)) TRIALS times."""
    walls = []
    for trial in range(TRIALS):
        job_dir, log_dir = tmp_path / f"job{trial}", tmp_path / f"logs{trial}"
        job_dir.mkdir()
        shm_before = dev_shm_names()
        start = time.monotonic()
        try:
            outcomes = run(job_dir, log_dir)
            walls.append(time.monotonic() - start)
            _check(job_dir, log_dir, outcomes, shm_before, killed_after)
        except AssertionError as e:
            raise AssertionError(f"trial {trial} of {TRIALS}: {e}") from e
        finally:
            for pid in _job_processes(str(job_dir)):  # whatever a failure left behind
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
    print(f"\n{TRIALS} trial(s) passed, wall s: {' '.join(f'{w:.1f}' for w in walls)}")


@pytest.mark.timeout(30 + (TIMEOUT + 10) * TRIALS)
@pytest.mark.parametrize("when", ["mid_training", "before_init"])
def test_a_killed_worker_is_restarted_and_training_resumes_from_the_checkpoint(tmp_path, when):
    def run(job_dir, log_dir):
        cmd = [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc-per-node", str(WORLD),
               "--max-restarts", "2", "--log-dir", str(log_dir), "--redirects", "3", str(JOB), str(job_dir),
               "--kill-local-rank", "2", *(["--before-init"] if when == "before_init" else [])]
        try:
            proc = subprocess.run(cmd, env=launch._clean_env({}), capture_output=True, text=True, timeout=TIMEOUT)
        except subprocess.TimeoutExpired as e:
            raise AssertionError(f"torchrun did not end within {TIMEOUT} s\n{e.stderr}") from None
        return [(proc.returncode, proc.stderr)]

    _trials(tmp_path, run, KILLED_AFTER if when == "mid_training" else 0)


@needs_netns()
@pytest.mark.timeout(30 + (TIMEOUT + 10) * TRIALS)
def test_a_killed_worker_on_the_second_host_restarts_both_hosts(tmp_path):
    def run(job_dir, log_dir):
        with TwoHosts(addrs=("198.18.11.1", "198.18.11.2"), tag="restart") as hosts:
            return torchrun_on_hosts(hosts, JOB, log_dir, nproc=2, launcher_args=["--max-restarts", "2"],
                                     host_args=[[str(job_dir)], [str(job_dir), "--kill-local-rank", "1"]],
                                     timeout=TIMEOUT)

    _trials(tmp_path, run)
