"""GPU tensors between hosts, on a real GPU: ranks claim host identities
(RCOLL_HOSTID), so one machine with one GPU builds a multi-host layout. Inside
a "host" the ranks share memory, between hosts they talk over TCP. The
allreduce takes the hierarchical algorithm where the hosts have the same
number of ranks (AABB, and interleaved ABAB): each host sums through its
device windows (CUDA IPC) and each local index's slice is staged through
pinned host memory between the hosts (allgather and reduce_scatter likewise);
with RCOLL_CUDA_IPC=0 every edge is staged. Where the hosts differ (AAAB) it takes the ring in host order, staged.
Each rank's timeline names the algorithm and the communicator the device
path, which the test checks.

The same orchestration without a GPU (the emulated device runtime) is
tests/collectives/test_mixed.py::test_device_collectives_across_hosts; this runs the real
kernels, copies and streams under it with torch CUDA tensors.
"""
import json

import pytest
from support.common import every_rank_passed, skip_without_torch_gpu

from rcoll import spawn


@pytest.fixture(autouse=True)
def gpu(monkeypatch):
    skip_without_torch_gpu()
    monkeypatch.delenv("RCOLL_TRANSPORT", raising=False)  # shm inside a host, tcp between


IPC_HIERARCHICAL = "hierarchical (cuda ipc windows in each host)"


@pytest.mark.parametrize("layout,ipc,algorithm,path", [
    ("AABB", "1", IPC_HIERARCHICAL, "cuda-ipc+staging"), ("ABAB", "1", IPC_HIERARCHICAL, "cuda-ipc+staging"),
    ("AABB", "0", "hierarchical", "staging"), ("AAAB", "1", "ring", "staging")])
@pytest.mark.parametrize("worker", ["all_reduce_matrix", "other_collectives"])
def test_collectives_across_emulated_hosts(tmp_path, layout, ipc, algorithm, path, worker):
    from device import cuda_workers as w

    # other_collectives checks the path after its reduce_scatters, which go
    # the way the allreduce goes (allgather and broadcast too). Its broadcasts
    # fill the tensor on the caller's stream just before the op: the op must
    # wait for that on every rank (found here, on an H200, 2026-11-27).
    # RCOLL_CUDA_IPC_HOSTS_MIN_BYTES=0: the windows at the small sizes too (by default those stage).
    env = {"RCOLL_HOSTID": list(layout), "RCOLL_TIMELINE": str(tmp_path / "trace"), "RCOLL_CUDA_IPC": ipc,
           "EXPECT_DEVICE_PATH": path, "RCOLL_CUDA_IPC_HOSTS_MIN_BYTES": "0"}
    every_rank_passed(spawn.run(getattr(w, worker), len(layout), timeout=300, env=env))
    if worker != "all_reduce_matrix":
        return
    for rank in range(len(layout)):
        # One file per communicator of the rank: trace.rank<r>.json, trace.rank<r>.comm<k>.json.
        events = [e for f in tmp_path.glob(f"trace.rank{rank}.*json") for e in json.loads(f.read_text())]
        algorithms = {e["args"].get("algorithm") for e in events
                      if e.get("cat") == "op" and e["args"].get("op", "").startswith("allreduce(")}
        assert algorithm in algorithms, (rank, algorithms)
