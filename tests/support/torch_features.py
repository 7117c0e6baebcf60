"""What the installed torch can do, asked of torch itself (never of its version
string): the tests of the torch backend adapt to the release they run on, as
the backend does (docs/torch.md, "Releases")."""
import functools
import re
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed as dist

from support import ports
from support.paths import TESTS

# torch 2.5 and later load the `torch.backends` entry points (rcoll's
# registers the backend) at `import torch`; 2.4 does not, and its users add
# `import rcoll`.
LOADS_ENTRY_POINTS = hasattr(torch, "_import_device_backends")

# The line a job script needs so that init_process_group(backend="rcoll") works
# on this release: none where torch loads the entry point.
IMPORT_LINE = "" if LOADS_ENTRY_POINTS else "import rcoll"

# Whether torch tells a backend that a call is synchronous (opts.asyncOp):
# rcoll then runs the op on the caller's thread and returns a finished Work.
TELLS_SYNC_CALLS = hasattr(dist.AllreduceOptions(), "asyncOp")


def fully_shard():
    """FSDP2's fully_shard, where this release keeps it."""
    try:
        from torch.distributed.fsdp import fully_shard as f
    except ImportError:  # earlier releases keep it in torch.distributed._composable
        from torch.distributed._composable.fsdp import fully_shard as f
    return f


def skip_unless_fsdp2_trains_on_cpu() -> None:
    """Skips the calling test, saying why, where FSDP2 cannot train on the CPU."""
    why = _why_fsdp2_cannot_train_on_cpu()
    if why:
        pytest.skip(why)


@functools.lru_cache(maxsize=None)
def _why_fsdp2_cannot_train_on_cpu() -> str:
    """Why FSDP2 cannot train on the CPU with Gloo on this release ("" if it can;
    before 2.7 it needs CUDA streams whatever the device): one rank, one step,
    in a fresh interpreter."""
    code = textwrap.dedent("""
        import os, torch, torch.distributed as dist
        from support.torch_features import fully_shard
        dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d", rank=0, world_size=1)
        model = fully_shard()(torch.nn.Linear(4, 4))
        model(torch.ones(2, 4)).sum().backward()
        dist.destroy_process_group()
    """ % ports.free_port())
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=TESTS)
    if out.returncode == 0:
        return ""
    errors = [line for line in out.stderr.splitlines() if re.search(r"\w+Error: ", line)] or out.stderr.splitlines()
    return f"FSDP2 does not train on the CPU with Gloo either on torch {torch.__version__}: {errors[-1].strip()}"


def let_gloo_threads_finish(group, rounds: int = 3) -> None:
    """Call before destroying a Gloo group whose futures had Python callbacks
    (DDP comm hooks). On torch 2.4 a Gloo worker thread drops such a callback
    after completing its future, which takes the GIL; destroying the group
    joins that thread with the GIL held, and the job hangs in
    ~ProcessGroupGloo. Barriers on the group, each waited with the GIL
    released, let the threads drop what they hold first."""
    for _ in range(rounds):
        dist.barrier(group=group)
        time.sleep(0.02)
