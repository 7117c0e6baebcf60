"""Running rcoll the way users do: a script under torchrun (or with a launcher's
environment), every rank's exit code and stderr checked.

A job that computes the right answer and then aborts at exit is a failed job,
so a result read back through a queue is not enough: these helpers judge a job
by how every one of its processes ended.
"""
from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence

from support import ports

# What must never appear on a rank's stderr. Anything else a rank prints on
# stderr fails the job too, unless a test allows it by pattern.
FATAL = re.compile(r"terminate called|Traceback|Segmentation fault|Aborted|core dumped|exception not rethrown")

# torchrun's agents meet at exit in a barrier on the store the first node's
# agent serves. That agent may leave, closing the store, while another agent's
# wait for the barrier's last key is still unanswered; the other agent then logs
# "Error waiting on exit barrier" with the store's connection error and exits 0
# all the same. A race of torch's (pytorch/pytorch#69520), after every worker
# has exited: check_launcher_output leaves out that one record and nothing else.
_EXIT_BARRIER_ERROR = "Error waiting on exit barrier"
_STORE_GONE = re.compile(r"DistNetworkError: .*(Connection was likely closed|Broken pipe|Connection reset)")
_LOG_PREFIX = re.compile(r"^[EWI]\d{4} [\d:.]+ \d+ \S+:\d+\] ")

# What a CUDA build of torch (PyPI's, which scripts/torch_matrix.py installs)
# prints on a machine without a GPU driver when torch.utils.cpp_extension looks
# for the CUDA toolkit (inductor does, DeepSpeed does at import).
CUDA_BUILD_WITHOUT_DRIVER = r"No CUDA runtime is found, using CUDA_HOME="

# The marker a job script prints as its last line on every rank.
DONE = "RCOLL-JOB-DONE"


def _clean_env(extra: Optional[Dict[str, str]]) -> Dict[str, str]:
    env = dict(os.environ)
    # The parent test process may run with settings of its own; the job starts clean.
    for key in list(env):
        if key.startswith(("RCOLL_", "TORCHELASTIC_")) or key in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                                  "MASTER_ADDR", "MASTER_PORT"):
            del env[key]
    env.setdefault("OMP_NUM_THREADS", "1")  # torchrun sets it and warns when it does: set it first
    # A rank that aborts (SIGABRT at exit, a crash) prints every thread's Python
    # stack to its stderr, which the failure message shows: the exit-time abort
    # seen 1 job in ~20 with busy CPUs says nothing else about where it came from.
    env.setdefault("PYTHONFAULTHANDLER", "1")
    env.update(extra or {})
    return env


def write_script(tmp_path: Path, body: str, name: str = "job.py") -> Path:
    """A job script whose every rank ends by printing DONE (to stdout)."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(body).strip() + f"\nprint({DONE!r}, flush=True)\n")
    return path


def check_rank_output(label: str, stdout: str, stderr: str, allow: Sequence[str] = ()) -> None:
    """Fails unless the rank printed DONE and nothing but allowed lines on stderr."""
    assert DONE in stdout, (f"{label} did not reach the end of its script\n"
                            f"stdout:\n{stdout[-3000:]}\nstderr:\n{stderr[-3000:]}")
    allowed = [re.compile(a) for a in allow]
    bad = [line for line in stderr.splitlines()
           if line.strip() and not any(a.search(line) for a in allowed)]
    assert not bad, f"{label} wrote to stderr:\n" + "\n".join(bad[:40])
    assert not FATAL.search(stderr), f"{label}: {stderr[-3000:]}"


def check_launcher_output(label: str, stderr: str) -> None:
    """Fails if a launcher (torchrun's agent) wrote anything fatal on stderr,
    leaving out torch's own exit-barrier race (see _EXIT_BARRIER_ERROR)."""
    lines = stderr.splitlines()
    keep = []
    i = 0
    while i < len(lines):
        prefix = _LOG_PREFIX.match(lines[i])
        if prefix and _EXIT_BARRIER_ERROR in lines[i]:
            # torch's logger writes every line of one record behind one prefix.
            end = i + 1
            while end < len(lines) and lines[end].startswith(prefix.group(0)):
                end += 1
            if _STORE_GONE.search("\n".join(lines[i:end])):
                i = end
                continue
        keep.append(lines[i])
        i += 1
    rest = "\n".join(keep)
    assert not FATAL.search(rest), f"{label}:\n{rest[-4000:]}"


def torchrun(script: Path, nproc: int, tmp_path: Path, *, args: Sequence[str] = (),
             launcher_args: Sequence[str] = ("--standalone",), module_form: bool = False,
             env: Optional[Dict[str, str]] = None, allow: Sequence[str] = (), timeout: float = 180,
             exit_checked: bool = True) -> List[str]:
    """Runs `script` under torchrun with `nproc` ranks on this host; asserts the job
    exited 0, every rank printed DONE and wrote nothing unexpected to stderr.
    Returns each rank's stdout.

    exit_checked=False is for a reference job on another backend, whose results
    a test compares with rcoll's and whose exit is not under test: it passes once
    every rank printed DONE, however it exits. Gloo aborts at exit ("terminate
    called without an active exception", 1 job in ~6 with busy CPUs, torch 2.14)
    when a job leaves its group undestroyed, as Lightning leaves any but NCCL's
    (pytorch/pytorch#190489)."""
    log_dir = Path(tmp_path) / f"logs-{os.urandom(4).hex()}"
    launcher = ([sys.executable, "-m", "torch.distributed.run"] if module_form
                else [str(Path(sys.executable).parent / "torchrun")])
    cmd = [*launcher, *launcher_args, "--nproc-per-node", str(nproc), "--log-dir", str(log_dir),
           "--redirects", "3", str(script), *args]
    proc = subprocess.Popen(cmd, env=_clean_env(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    launcher_err = None
    try:
        _, launcher_err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        pass
    finally:
        kill_tree(proc)  # also when the test itself is interrupted (pytest-timeout): no rank outlives it
    outputs = _rank_logs(log_dir)
    if launcher_err is None:
        ranks = "\n".join(f"--- rank {r} stderr:\n{e[-2000:]}" for r, _, e in outputs)
        raise AssertionError(f"torchrun job did not end within {timeout} s: {cmd}\n{ranks}")
    if not exit_checked and len(outputs) == nproc and all(DONE in out for _, out, _ in outputs):
        return [out for _, out, _ in outputs]
    if proc.returncode == 0:
        for rank, out, err in outputs:
            check_rank_output(f"rank {rank}", out, err, allow)
    assert proc.returncode == 0, (f"torchrun exited {proc.returncode}\n{launcher_err[-4000:]}\n" +
                                  "\n".join(f"--- rank {r} stderr:\n{e[-2000:]}" for r, _, e in outputs))
    assert len(outputs) == nproc, f"expected {nproc} ranks' logs, found {[r for r, _, _ in outputs]}"
    # torchrun's own stderr: its banner is silenced by OMP_NUM_THREADS; anything fatal fails.
    check_launcher_output("torchrun", launcher_err)
    return [out for _, out, _ in outputs]


def _rank_logs(log_dir: Path) -> List[tuple]:
    """(rank, stdout, stderr) of each rank of a torchrun job, from its --log-dir."""
    logs = []
    for d in sorted(log_dir.glob("*/attempt_*/*"), key=lambda p: (p.parent.name, int(p.name))):
        read = [(d / name).read_text() if (d / name).exists() else "" for name in ("stdout.log", "stderr.log")]
        logs.append((f"{d.name} ({d.parent.name})", *read))
    return logs


def _descendants(pid: int) -> List[int]:
    """Every process below `pid`, from /proc (torchrun's ranks may sit in sessions of their own)."""
    children: Dict[int, List[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill_tree(proc: subprocess.Popen) -> None:
    """Kills `proc` and every process below it, and reaps `proc`."""
    if proc.poll() is None:
        for pid in [*_descendants(proc.pid), proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    proc.wait()


def _runnable_tasks() -> Optional[int]:
    """The kernel's count of runnable tasks, this reader included (/proc/loadavg's 4th field)."""
    try:
        with open("/proc/loadavg") as f:
            return int(f.read().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return None


@contextlib.contextmanager
def busy_cpus(ranks: int = 1, count: Optional[int] = None) -> Iterator[None]:
    """Keeps the CPUs busy beside a job of `ranks` processes, as a training job's
    data-loader workers do: races at start-up and exit show up far more often then.

    Spinners make up what the rest of the machine does not. Every 50 ms as many
    of them run as keep `count` (the CPUs) runnable tasks beside the job (taken
    to keep one per rank runnable), and the others are stopped. Run alone, the
    job meets `count` spinners all along; under the parallel suite, whose other
    tests keep the CPUs busy already, they stop instead of taking CPU from those
    tests (spinning there took about 4 of the suite's 34 CPU-minutes). Where
    the kernel's runnable count cannot be read, every spinner runs."""
    count = count or os.cpu_count() or 2
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    done = threading.Event()
    running = count

    def pace():
        nonlocal running
        samples: List[int] = []
        while not done.wait(0.01):
            runnable = _runnable_tasks()
            if runnable is None:
                return
            samples.append(runnable - 1 - running)  # neither this reader nor the running spinners
            if len(samples) < 5:
                continue
            others = sorted(samples)[len(samples) // 2]
            samples.clear()
            wanted = max(0, min(count, count + ranks - others))
            for i, p in enumerate(spinners):
                if (i < wanted) != (i < running):
                    os.kill(p.pid, signal.SIGCONT if i < wanted else signal.SIGSTOP)
            running = wanted

    pacer = threading.Thread(target=pace, name="busy_cpus", daemon=True)
    pacer.start()
    try:
        yield
    finally:
        done.set()
        pacer.join()
        for p in spinners:
            p.kill()  # a stopped process dies of SIGKILL too
        for p in spinners:
            p.wait()


free_port = ports.free_port  # this test process's own range (tests/support/ports.py)


def run_ranks(script: Path, rank_envs: Sequence[Dict[str, str]], *, allow: Sequence[str] = (),
              timeout: float = 120) -> List[str]:
    """Starts one process of `script` per entry of rank_envs (the variables a
    launcher would set), as srun or mpirun would; asserts that every process
    exited 0, printed DONE and wrote nothing unexpected to stderr."""
    procs = [subprocess.Popen([sys.executable, str(script)], env=_clean_env(e), stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for e in rank_envs]
    outputs = []
    try:
        for i, p in enumerate(procs):
            try:
                out, err = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                raise AssertionError(f"process {i} of {script.name} did not end within {timeout} s") from None
            assert p.returncode == 0, f"process {i} exited {p.returncode}:\n{err[-4000:]}"
            check_rank_output(f"process {i}", out, err, allow)
            outputs.append(out)
    finally:
        kill_leftovers(procs)
    return outputs


def kill_leftovers(procs) -> None:
    """Kills (and reaps) whichever of `procs` still run: after a failure, nothing outlives the test."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
