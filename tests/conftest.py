import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

import ports  # noqa: E402
from cpu_ledger import pytest_runtest_protocol  # noqa: E402,F401 -- RCOLL_TEST_CPU_LOG: each test's CPU time

import rcoll.spawn  # noqa: E402

# spawn.run's rendezvous ports, and every test's: from this process's own
# range (tests/ports.py), not the kernel's pick, which parallel tests can share.
rcoll.spawn.free_port = ports.free_port
# Ranks fork from a server that has imported torch too (where it is installed):
# every torch test's ranks would otherwise import it, ~1.6 s of CPU each.
rcoll.spawn.PRELOAD = (*rcoll.spawn.PRELOAD, "torch")

# Small segments make every size up to a few thousand elements cross many
# pipeline segments, so the segment bookkeeping is exercised cheaply.
# Device ops across hosts take the CUDA IPC windows at every size (not only from 128K).
SMALL_CHUNKS = {"RCOLL_CHUNK_BYTES": "256", "RCOLL_MIN_CHUNK_BYTES": "64", "RCOLL_SHM_COLL_SLOT_BYTES": "4K",
                "RCOLL_CUDA_IPC_SLOT_BYTES": "4K", "RCOLL_CUDA_IPC_HOSTS_MIN_BYTES": "0"}

# Ranks that set this run GPU-buffer collectives on the host-memory emulation of
# the device runtime (tests/emulated_device/), which the fixture below builds.
EMULATED_DEVICE = {"RCOLL_DEVICE_RUNTIME": "rcoll_emulated_device"}


@pytest.fixture(scope="session")
def emulated_device_runtime():
    """Builds rcoll_emulated_device (once per source state, cached under
    build/testing/) and puts it on the PYTHONPATH every rank this session
    starts inherits; returns the environment that selects it."""
    from emulated_device.build import build

    directory = build()
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if directory not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([directory] + [p for p in paths if p])
    if directory not in sys.path:
        sys.path.insert(0, directory)
    return EMULATED_DEVICE


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


def _xdist_controller(config) -> bool:
    """Whether this process hands the tests to pytest-xdist workers."""
    return config.pluginmanager.has_plugin("dsession")


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_auto_num_workers(config):
    # Most tests wait (on their ranks' start-up, sockets and timers) more than
    # they compute: one worker more than the cores keeps them busy; more only
    # adds ranks competing for them.
    return min(6, (os.cpu_count() or 1) + 1)


def pytest_collection_modifyitems(config, items):
    if not hasattr(config, "workerinput"):
        return
    # An xdist worker (each collects the same list; the controller hands them
    # out in this order): the long tests first, so that none of them starts
    # last and holds the session's end alone; the guest suite's test last,
    # since it only waits for the guest that runs from the start.
    import guest_suite

    def turn(item):
        if item.originalname == guest_suite.TEST_NAME:
            return 2
        return 0 if item.get_closest_marker("slow") else 1

    items.sort(key=turn)


def pytest_sessionstart(session):
    if _xdist_controller(session.config):
        import guest_suite
        guest_suite.share_with_workers()


def pytest_collection_finish(session):
    # The Soft-RoCE guest's suite runs beside the other tests (tests/guest_suite.py).
    if not session.config.option.collectonly:
        import guest_suite
        guest_suite.start([item.name for item in session.items])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    # Under xdist, the controller starts it, once: workers share its outcome.
    import guest_suite
    guest_suite.start_for_workers([nodeid.split("::")[-1].split("[")[0] for nodeid in ids])


def pytest_sessionfinish(session):
    import guest_suite
    guest_suite.stop(shared_folder_owner=_xdist_controller(session.config))
