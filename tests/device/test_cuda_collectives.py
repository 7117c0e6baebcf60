"""Collectives on real GPU memory: torch CUDA tensors through backend "rcoll",
and the numpy-level API on torch CUDA tensors (__cuda_array_interface__).

Needs a GPU, a CUDA build of torch and rcoll._cuda; skips naming what is
missing otherwise. Two ranks may share one GPU. The same data path without a
GPU (its orchestration, on an emulated device) is tests/device/test_device_collectives.py.
"""
import pytest
from support.common import every_rank_passed, skip_without_torch_gpu

from rcoll import spawn


@pytest.fixture(autouse=True)
def gpu():
    skip_without_torch_gpu()


# "shm": device to device through CUDA IPC windows; "shm-steps": the same in
# 64K steps, slices above 64K; "shm-staging": RCOLL_CUDA_IPC=0, pinned host
# staging over the shm ring; "tcp": staging over sockets.
@pytest.fixture(autouse=True, params=["shm", "shm-steps", "shm-staging", "tcp"])
def transport(request, monkeypatch):
    monkeypatch.setenv("RCOLL_TRANSPORT", request.param.split("-")[0])
    monkeypatch.setenv("RCOLL_CUDA_IPC", "0" if request.param == "shm-staging" else "1")
    if request.param == "shm-steps":
        monkeypatch.setenv("RCOLL_CUDA_IPC_SLOT_BYTES", "64K")
        monkeypatch.setenv("RCOLL_CUDA_IPC_DIRECT_BYTES", "64K")
    return request.param


def test_all_reduce_every_dtype_and_op_against_torch():
    from device import cuda_workers as w
    every_rank_passed(spawn.run(w.all_reduce_matrix, 2, timeout=300))


def test_all_gather_broadcast_reduce_scatter():
    from device import cuda_workers as w
    every_rank_passed(spawn.run(w.other_collectives, 2, timeout=300))


def test_stream_semantics_without_device_synchronize():
    from device import cuda_workers as w
    every_rank_passed(spawn.run(w.stream_semantics, 2, timeout=300))


def test_numpy_level_api_on_torch_cuda_tensors():
    from device import cuda_workers as w
    every_rank_passed(spawn.run(w.numpy_api_with_torch_tensors, 2, timeout=300))
