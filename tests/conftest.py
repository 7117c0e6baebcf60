"""Fixtures and pytest hooks only; what tests share otherwise is in support/
(tests/support/__init__.py says what is where)."""
import os
import sys

import pytest

# tests/ on sys.path, once, for this process and (inherited) every rank it
# starts: `from support import ...`, and each area's modules as
# `from <area> import ...` (tests/<area>/ are packages).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from support import ports  # noqa: E402
from support.common import EMULATED_DEVICE  # noqa: E402
from support.cpu_ledger import pytest_runtest_protocol  # noqa: E402,F401 -- RCOLL_TEST_CPU_LOG: each test's CPU time

import rcoll.spawn  # noqa: E402

# spawn.run's rendezvous ports, and every test's: from this process's own
# range (tests/support/ports.py), not the kernel's pick, which parallel tests can share.
rcoll.spawn.free_port = ports.free_port
# Ranks fork from a server that has imported torch too (where it is installed):
# every torch test's ranks would otherwise import it, ~1.6 s of CPU each.
rcoll.spawn.PRELOAD = (*rcoll.spawn.PRELOAD, "torch")


@pytest.fixture(scope="session")
def emulated_device_runtime():
    """Builds rcoll_emulated_device (once per source state, cached under
    build/testing/) and puts it on the PYTHONPATH every rank this session
    starts inherits; returns the environment that selects it."""
    from device.emulated_device.build import build

    directory = build()
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if directory not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([directory] + [p for p in paths if p])
    if directory not in sys.path:
        sys.path.insert(0, directory)
    return EMULATED_DEVICE


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
    from support import guest_suite

    def turn(item):
        if item.originalname == guest_suite.TEST_NAME:
            return 2
        return 0 if item.get_closest_marker("slow") else 1

    items.sort(key=turn)


def pytest_sessionstart(session):
    if _xdist_controller(session.config):
        from support import guest_suite
        guest_suite.share_with_workers()


def pytest_collection_finish(session):
    # The Soft-RoCE guest's suite runs beside the other tests (tests/support/guest_suite.py).
    if not session.config.option.collectonly:
        from support import guest_suite
        guest_suite.start([item.name for item in session.items])


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    # Under xdist, the controller starts it, once: workers share its outcome.
    from support import guest_suite
    guest_suite.start_for_workers([nodeid.split("::")[-1].split("[")[0] for nodeid in ids])


def pytest_sessionfinish(session):
    from support import guest_suite
    guest_suite.stop(shared_folder_owner=_xdist_controller(session.config))
