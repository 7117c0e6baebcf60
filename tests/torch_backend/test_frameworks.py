"""The frameworks users train with, on rcoll (docs/frameworks.md): PyTorch
Lightning, Hugging Face Accelerate and DeepSpeed ZeRO stages 1 to 3, each job
(tests/torch_backend/journeys/) run under torchrun as its users run it, once with
backend="rcoll" and once with "gloo". Every rank must exit 0, write nothing
unexpected on stderr, and print the same losses and parameters as on Gloo, bit
for bit (at world 2 every sum has one order); rcoll's timeline must show the
collectives the framework sent it, so the result is not Gloo's by another road."""
import collections
import fcntl
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support import launch
from support.paths import JOURNEYS

pytestmark = pytest.mark.slow  # whole training jobs under torchrun, two per test
torch = pytest.importorskip("torch")


# torch's own deprecation notes for the calls the frameworks make (torch 2.13 on).
TORCH_DEPRECATIONS = (r"FutureWarning: `torch\.distributed\.\w+` is deprecated", r"return func\(\*args, \*\*kwargs\)")
# What Lightning tells every job on stderr.
LIGHTNING_NOTES = (r"^(GPU|TPU|HPU) available", r"Tip: ", r"^Initializing distributed: GLOBAL_RANK",
                   r"^-+$", r"^distributed_backend=", r"^All distributed processes registered",
                   r"`Trainer\.fit` stopped", r"LeafSpec")


def _results(outputs):
    return [json.loads(line.split(" ", 1)[1]) for out in outputs for line in out.splitlines()
            if line.startswith("RESULT ")]


def _ops_rcoll_ran(trace_base: Path, rank: int) -> collections.Counter:
    """The collectives in rank's timeline files (one per communicator), by kind."""
    ops = collections.Counter()
    for path in trace_base.parent.glob(f"{trace_base.name}.rank{rank}*.json"):
        events = json.loads(path.read_text())  # strict JSON: closed at exit even if a group never was
        ops.update(re.sub(r" #\d+$", "", e["name"]) for e in events if e.get("cat") == "op")
    return ops


@pytest.fixture(scope="session")
def deepspeed_env(tmp_path_factory):
    """A torch extensions directory of this session's own, where DeepSpeed's
    CPU shared-memory op is built once before any job starts.

    DeepSpeed builds that op (deepspeed_shm_comm, ~1 min of compiling) in every
    process at init_distributed through torch.utils.cpp_extension, whose build
    lock is a plain file: a process killed while it holds it (a rank torchrun
    tears down) leaves every later build in that directory waiting forever, as
    ~/.cache/torch_extensions did once here. A directory per session keeps such
    a leftover from outliving it, and the one build up front keeps the ranks of
    concurrent jobs from compiling it at once."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base  # shared by the xdist workers
    directory = root / "torch-extensions"
    with open(root / "torch-extensions.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the kernel releases it if this process dies
        if not (directory / "built").exists():
            build = "from deepspeed.comm.torch import build_shm_op; build_shm_op()"
            proc = subprocess.run([sys.executable, "-c", build],
                                  env={**os.environ, "TORCH_EXTENSIONS_DIR": str(directory)}, capture_output=True,
                                  text=True, timeout=900)
            assert proc.returncode == 0, f"building DeepSpeed's shm op failed:\n{proc.stderr[-4000:]}"
            (directory / "built").touch()
    return {"TORCH_EXTENSIONS_DIR": str(directory)}


def run_on_rcoll_and_gloo(script: Path, tmp_path: Path, args=(), allow=(), env=None, timeout: float = 300):
    """Runs the job on both backends; asserts equal results on every rank and
    returns what rcoll's rank 0 ran, by op kind. rcoll's job must also exit
    cleanly; Gloo's is the reference for the results only (launch.torchrun's
    exit_checked)."""
    trace = tmp_path / "trace"
    results = {}
    for backend in ("rcoll", "gloo"):
        job_env = {**(env or {}), **({"RCOLL_TIMELINE": str(trace)} if backend == "rcoll" else {})}
        try:
            outputs = launch.torchrun(script, 2, tmp_path, args=[*args, "--backend", backend], env=job_env,
                                      allow=allow, timeout=timeout, exit_checked=backend == "rcoll")
        except AssertionError as e:
            raise AssertionError(f"the job on {backend}: {e}") from None
        results[backend] = _results(outputs)
        assert len(results[backend]) == 2, outputs
    for rank, (ours, theirs) in enumerate(zip(results["rcoll"], results["gloo"])):
        assert ours == theirs, f"rank {rank}: rcoll's job differs from Gloo's:\n{ours}\n{theirs}"
    ops = _ops_rcoll_ran(trace, 0)
    assert _ops_rcoll_ran(trace, 1) == ops
    return ops


@pytest.mark.timeout(660)  # two jobs of at most 300 s
def test_lightning_ddp_strategy(tmp_path):
    ops = run_on_rcoll_and_gloo(JOURNEYS / "lightning_ddp.py", tmp_path, allow=LIGHTNING_NOTES + TORCH_DEPRECATIONS)
    # DDP's parameter broadcast, then per step the gradients' allreduce and the logged loss's.
    assert ops["broadcast"] >= 1 and ops["allreduce"] >= 2 * 16, ops


@pytest.mark.timeout(660)  # two jobs of at most 300 s
def test_accelerate_with_a_group_initialized_first(tmp_path):
    ops = run_on_rcoll_and_gloo(JOURNEYS / "accelerate_ddp.py", tmp_path, allow=TORCH_DEPRECATIONS)
    # DDP's broadcast; per step the gradients and accelerator.reduce(); gather_for_metrics.
    assert ops["broadcast"] >= 1 and ops["allreduce"] >= 2 * 16 and ops["allgather"] >= 1, ops


@pytest.mark.timeout(1500)  # the op build (once per session) and two jobs of at most 300 s
@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_zero(stage, deepspeed_env, tmp_path):
    ops = run_on_rcoll_and_gloo(JOURNEYS / "deepspeed_zero.py", tmp_path, args=["--stage", str(stage)],
                                env=deepspeed_env, allow=TORCH_DEPRECATIONS + (launch.CUDA_BUILD_WITHOUT_DRIVER,))
    # Every step: stages 1 and 2 reduce the gradient buckets (allreduce, as
    # DeepSpeed does on the CPU) and gather the updated partitions; stage 3
    # reduce-scatters the gradients and gathers each layer's parameters to use them.
    assert ops["allgather"] >= 6, ops
    assert ops["reduce_scatter" if stage == 3 else "allreduce"] >= 6, ops
