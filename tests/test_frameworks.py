"""The frameworks users train with, on rcoll (docs/frameworks.md): PyTorch
Lightning, Hugging Face Accelerate and DeepSpeed ZeRO stages 1 to 3, each job
(tests/journeys/) run under torchrun as its users run it, once with
backend="rcoll" and once with "gloo". Every rank must exit 0, write nothing
unexpected on stderr, and print the same losses and parameters as on Gloo, bit
for bit (at world 2 every sum has one order); rcoll's timeline must show the
collectives the framework sent it, so the result is not Gloo's by another road."""
import collections
import json
import re
from pathlib import Path

import launch
import pytest

pytestmark = pytest.mark.slow  # whole training jobs under torchrun, two per test
torch = pytest.importorskip("torch")

JOURNEYS = Path(__file__).parent / "journeys"

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


def run_on_rcoll_and_gloo(script: Path, tmp_path: Path, args=(), allow=(), timeout: float = 300):
    """Runs the job on both backends; asserts equal results on every rank and
    returns what rcoll's rank 0 ran, by op kind."""
    trace = tmp_path / "trace"
    results = {}
    for backend in ("rcoll", "gloo"):
        env = {"RCOLL_TIMELINE": str(trace)} if backend == "rcoll" else {}
        try:
            outputs = launch.torchrun(script, 2, tmp_path, args=[*args, "--backend", backend], env=env,
                                      allow=allow, timeout=timeout)
        except AssertionError as e:
            raise AssertionError(f"the job on {backend}: {e}") from None
        results[backend] = _results(outputs)
        assert len(results[backend]) == 2, outputs
    for rank, (ours, theirs) in enumerate(zip(results["rcoll"], results["gloo"])):
        assert ours == theirs, f"rank {rank}: rcoll's job differs from Gloo's:\n{ours}\n{theirs}"
    assert _ops_rcoll_ran(trace, 1) == _ops_rcoll_ran(trace, 0)
    return _ops_rcoll_ran(trace, 0)


def test_lightning_ddp_strategy(tmp_path):
    ops = run_on_rcoll_and_gloo(JOURNEYS / "lightning_ddp.py", tmp_path, allow=LIGHTNING_NOTES + TORCH_DEPRECATIONS)
    # DDP's parameter broadcast, then per step the gradients' allreduce and the logged loss's.
    assert ops["broadcast"] >= 1 and ops["allreduce"] >= 2 * 16, ops


def test_accelerate_with_a_group_initialized_first(tmp_path):
    ops = run_on_rcoll_and_gloo(JOURNEYS / "accelerate_ddp.py", tmp_path, allow=TORCH_DEPRECATIONS)
    # DDP's broadcast; per step the gradients and accelerator.reduce(); gather_for_metrics.
    assert ops["broadcast"] >= 1 and ops["allreduce"] >= 2 * 16 and ops["allgather"] >= 1, ops


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_zero(stage, tmp_path):
    ops = run_on_rcoll_and_gloo(JOURNEYS / "deepspeed_zero.py", tmp_path, args=["--stage", str(stage)],
                                allow=TORCH_DEPRECATIONS + (launch.CUDA_BUILD_WITHOUT_DRIVER,))
    # Every step: stages 1 and 2 reduce the gradient buckets (allreduce, as
    # DeepSpeed does on the CPU) and gather the updated partitions; stage 3
    # reduce-scatters the gradients and gathers each layer's parameters to use them.
    assert ops["allgather"] >= 6, ops
    assert ops["reduce_scatter" if stage == 3 else "allreduce"] >= 6, ops
