"""GPU tensors between hosts, on a real GPU: ranks claim host identities
(RCOLL_HOSTID), so one machine with one GPU builds a multi-host layout. Inside
a "host" the ranks share memory, between hosts they talk over TCP, and device
buffers are staged through pinned host memory on every edge. The allreduce
takes the hierarchical algorithm where the hosts have the same number of ranks
(AABB, and interleaved ABAB) and the ring in host order where they do not
(AAAB); each rank's timeline names the algorithm, which the test checks.

The same orchestration without a GPU (the emulated device runtime) is
tests/test_mixed.py::test_device_collectives_across_hosts; this runs the real
kernels, copies and streams under it with torch CUDA tensors.
"""
import json

import pytest
from conftest import every_rank_passed, skip_without_torch_gpu

from rcoll import spawn


@pytest.fixture(autouse=True)
def gpu(monkeypatch):
    skip_without_torch_gpu()
    monkeypatch.delenv("RCOLL_TRANSPORT", raising=False)  # shm inside a host, tcp between


@pytest.mark.parametrize("layout,algorithm", [("AABB", "hierarchical"), ("ABAB", "hierarchical"),
                                              ("AAAB", "ring")])
@pytest.mark.parametrize("worker", ["all_reduce_matrix", "other_collectives"])
def test_collectives_across_emulated_hosts(tmp_path, layout, algorithm, worker):
    import cuda_workers as w

    env = {"RCOLL_HOSTID": list(layout), "RCOLL_TIMELINE": str(tmp_path / "trace")}
    every_rank_passed(spawn.run(getattr(w, worker), len(layout), timeout=300, env=env))
    if worker != "all_reduce_matrix":
        return
    for rank in range(len(layout)):
        # One file per communicator of the rank: trace.rank<r>.json, trace.rank<r>.comm<k>.json.
        events = [e for path in tmp_path.glob(f"trace.rank{rank}.*json") for e in json.loads(path.read_text())]
        algorithms = {e["args"].get("algorithm") for e in events
                      if e.get("cat") == "op" and e["args"].get("op", "").startswith("allreduce(")}
        assert algorithm in algorithms, (rank, algorithms)
