"""A selection of torch's own distributed test suite (tests/torch_suite.py: Gloo's
import-time skips, run with rcoll), in CI. The full suite, for the counts
against Gloo: `python -m pytest tests/torch_suite.py -q` (see its docstring)."""
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # torch's own DistributedTest selection

pytest.importorskip("torch")
pytest.importorskip("expecttest")  # torch's test utilities need it (the `test` extra installs it)

HERE = os.path.dirname(os.path.abspath(__file__))

# Every one must pass: the collectives users call most, DDP, object collectives,
# point-to-point with tags and batches, complex tensors, sparse allreduce and the
# timeout wording torch's tests check.
MUST_PASS = [
    "test_all_reduce_sum", "test_all_reduce_sum_async", "test_all_reduce_sum_complex",
    "test_sparse_all_reduce_sum", "test_barrier_timeout_full_group",
    "test_DistributedDataParallelCPU", "test_DistributedDataParallelCPU_grad_is_view",
    "test_all_gather_object_default_pg", "test_irecv", "test_send_recv_with_tag",
    "test_batch_isend_irecv_gloo", "test_batch_isend_irecv_gloo_tags", "test_send_recv_any_source",
]


@pytest.mark.timeout(900)
def test_selection_of_torchs_own_suite_passes():
    ids = [f"{os.path.join(HERE, 'torch_suite.py')}::TestDistBackendWithSpawn::{name}" for name in MUST_PASS]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RCOLL_")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", "-rA", *ids],
                          capture_output=True, text=True, timeout=840, env=env, cwd=HERE)
    passed = [name for name in MUST_PASS if f"PASSED torch_suite.py::TestDistBackendWithSpawn::{name}" in proc.stdout
              or f"::{name} PASSED" in proc.stdout]
    assert proc.returncode == 0 and len(passed) == len(MUST_PASS), (
        f"passed {len(passed)} of {len(MUST_PASS)}; not passed: {sorted(set(MUST_PASS) - set(passed))}\n"
        f"{proc.stdout[-6000:]}\n{proc.stderr[-2000:]}")
