"""torch's own distributed test suite (DistributedTest) against rcoll.

    python -m pytest tests/torch_backend/torch_suite.py -q              # rcoll, world 2
    RCOLL_SUITE_BACKEND=gloo python -m pytest tests/torch_backend/torch_suite.py -q   # the reference
    python -m pytest tests/torch_backend/torch_suite.py -q -k all_reduce               # a selection

torch decides at import time which of its tests a backend may run (many are
marked "only gloo supports ..."). This module imports the suite with
BACKEND=gloo, so that rcoll faces exactly the tests Gloo faces, then sets the
backend (the module's global and the environment, which the tests read at run
time) to RCOLL_SUITE_BACKEND (default rcoll). Without a GPU the ranks are
forked from the process that imported this module; with one, or with
RCOLL_SUITE_START=spawn, they are fresh interpreters that import it again, as
torch's CI starts them; either way they get the same treatment. WORLD_SIZE
(default 2) sets the world. tests/torch_backend/test_torch_suite.py runs it in CI, less the 7
tests that check BACKEND == "gloo" when they run.
"""
import os
import sys
import tempfile

BACKEND = os.environ.get("RCOLL_SUITE_BACKEND", "rcoll")
os.environ.setdefault("WORLD_SIZE", "2")
if "TEMP_DIR" not in os.environ:  # shared by the ranks (inherited by them, forked or spawned)
    os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="rcoll-torch-suite-")
os.environ["BACKEND"] = "gloo"  # while the suite is imported: Gloo's import-time skips

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing  # noqa: E402
from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed import distributed_test  # noqa: E402

distributed_test.BACKEND = BACKEND
os.environ["BACKEND"] = BACKEND
if BACKEND == "rcoll":
    import rcoll.torch_backend  # noqa: E402,F401  (registered by the entry point too; explicit here)

assert dist.is_available()


# How the ranks start: forked from this process, which has imported torch and
# the suite already (each rank would take ~3 s of CPU to import them again), or
# spawned as fresh interpreters, as torch's own CI runs the suite
# (RCOLL_SUITE_START=spawn). Forking is safe without a GPU: this process runs
# no torch op of its own, and the one thread it has before the first fork,
# numpy's OpenBLAS pool, is stopped by OpenBLAS's own fork handler (none is
# left after it). With a GPU the ranks are spawned: a child forked after CUDA
# was initialised cannot use it, and asking whether there is a GPU initialises it.
START = os.environ.get("RCOLL_SUITE_START") or ("spawn" if torch.cuda.is_available() else "fork")
if START not in ("fork", "spawn"):
    raise ValueError(f"RCOLL_SUITE_START={START!r}: expected fork or spawn")


class TestDistBackendRanks(distributed_test.TestDistBackend, distributed_test.DistributedTest._DistTestBase):
    def runTest(self):  # noqa: N802 - pytest makes one instance by this name; torch 2.4's __init__ looks it up
        pass

    def setUp(self):
        super().setUp()
        if START == "spawn":
            self._spawn_processes()
        else:
            self._start_processes(torch.multiprocessing.get_context("fork").Process)


if __name__ == "__main__":
    sys.exit(run_tests())
