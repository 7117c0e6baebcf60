"""Settings and checks that tests of many areas use."""
import os

import pytest

# Small segments make every size up to a few thousand elements cross many
# pipeline segments, so the segment bookkeeping is exercised cheaply.
# Device ops across hosts take the CUDA IPC windows at every size (not only from 128K).
SMALL_CHUNKS = {"RCOLL_CHUNK_BYTES": "256", "RCOLL_MIN_CHUNK_BYTES": "64", "RCOLL_SHM_COLL_SLOT_BYTES": "4K",
                "RCOLL_CUDA_IPC_SLOT_BYTES": "4K", "RCOLL_CUDA_IPC_HOSTS_MIN_BYTES": "0"}

# Ranks that set this run GPU-buffer collectives on the host-memory emulation of
# the device runtime (tests/device/emulated_device/), which the fixture
# emulated_device_runtime (tests/conftest.py) builds.
EMULATED_DEVICE = {"RCOLL_DEVICE_RUNTIME": "rcoll_emulated_device"}


def skip_without_torch_gpu(module_check=None):
    """Skips, naming what is missing, unless torch sees a GPU and rcoll's CUDA
    module can run on it (the real-GPU tests). `module_check` runs once the GPU
    is known to be there, before rcoll's CUDA module is asked (it may fail a
    build that should have made the module)."""
    try:
        import torch
    except ImportError:
        pytest.skip("torch is not installed")
    if not torch.cuda.is_available():
        build = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        pytest.skip(f"no GPU: torch {torch.__version__} ({build}) sees no CUDA device")
    if module_check is not None:
        module_check()
    import rcoll.cuda

    ok, reason = rcoll.cuda.available()
    if not ok:
        pytest.skip(f"rcoll's CUDA module cannot run here: {reason}")


def dev_shm_names() -> set:
    """What /dev/shm holds, less Python multiprocessing's semaphores (sem.mp-*,
    of any process on the machine: the tests running in parallel too). rcoll
    itself names nothing there: its segments are memfds."""
    names = os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []
    return {n for n in names if not n.startswith("sem.mp-")}


def every_rank_passed(results) -> int:
    """Checks the (cases, failures) every rank of a sweep returned: each rank
    ran cases and none failed. Returns the number of cases checked."""
    total = 0
    for rank, (cases, failures) in enumerate(results):
        assert cases > 0, f"rank {rank} checked nothing"
        assert failures == [], f"rank {rank}: {len(failures)} failures, first: {failures[:5]}"
        total += cases
    return total
