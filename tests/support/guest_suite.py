"""The verbs suite in the Soft-RoCE guest, started when the session starts.

The guest emulates its CPUs (TCG) and keeps about 1.25 of this machine's 2
cores busy for ~20 min, while most of the other tests wait on sockets, timers
and process start-ups: run side by side, the session ends ~10 min sooner
than with the guest in its turn. So when tests/rdma/test_verbs_guest.py is
selected, tests/conftest.py starts the guest as soon as collection ends
(start()), and that test waits for it (result()), with the same time limit it
would have had. RCOLL_GUEST_IN_BACKGROUND=0 runs it in its turn instead.

Under pytest-xdist the test runs in some worker, but the guest must start
once, when collection ends: the controller starts it (start_for_workers(),
when the first worker reports its collection) with its output in a folder
named by RCOLL_GUEST_SUITE_DIR, which the workers inherit; the test's worker
reads the outcome there when the controller has written its exit status.

The guest sees this checkout through 9p: the emulated device runtime is built
here before it starts, so that the guest and the host never build it into
build/testing/ at once.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import List, Optional

from support.softroce import PREPARE_ALLOWANCE_S, guest_available, guest_command, in_guest, run_in_guest

TEST_NAME = "test_verbs_suite_in_the_softroce_guest"
# TCG emulation: the suite takes 20-30 min on a busy 2-core machine.
GUEST_TIMEOUT_S = 3600
# -n 0: one process in the guest (its two emulated CPUs are busy enough).
SUITE = [sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", "-n", "0", "--durations=10",
         "tests/rdma/test_verbs.py"]
# The verbs transport moves bytes: its matrices take one dtype per element size
# and the reduce ops with paths of their own (tests/support/reference.py); every pair
# runs on the other transports in the main suite.
SUITE_ENV = {"TEST_MATRIX": "paths"}
SHARED_DIR_ENV = "RCOLL_GUEST_SUITE_DIR"


class _Run:
    def __init__(self, directory: Optional[str] = None):
        # In `directory` (files another process reads), else anonymous files.
        def output(name):
            if directory is None:
                return tempfile.TemporaryFile(mode="w+")
            return open(os.path.join(directory, name), "w+")

        self.stdout = output("stdout")
        self.stderr = output("stderr")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(guest_command(SUITE, GUEST_TIMEOUT_S, SUITE_ENV), stdin=subprocess.DEVNULL,
                                     stdout=self.stdout, stderr=self.stderr, text=True)

    def wait(self) -> subprocess.CompletedProcess:
        left = GUEST_TIMEOUT_S + PREPARE_ALLOWANCE_S - (time.monotonic() - self.started)
        try:
            returncode = self.proc.wait(timeout=max(left, 1))
        except subprocess.TimeoutExpired:
            self.stop()
            raise
        return subprocess.CompletedProcess(self.proc.args, returncode, self._read(self.stdout),
                                           self._read(self.stderr))

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()  # guest.py kills QEMU on SIGTERM
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    @staticmethod
    def _read(f) -> str:
        f.seek(0)
        return f.read()


_run: Optional[_Run] = None


def _worth_starting(selected_names: List[str]) -> bool:
    """Whether the guest's test is selected and the guest can run here; if
    not, the test runs the guest in its turn (or says why it cannot)."""
    if TEST_NAME not in selected_names or in_guest():
        return False
    return os.environ.get("RCOLL_GUEST_IN_BACKGROUND", "1") != "0" and guest_available()[0]


def _launch(directory: Optional[str] = None) -> _Run:
    from device.emulated_device.build import build
    build()
    return _Run(directory)


def start(selected_names: List[str]) -> None:
    """Starts the guest suite if its test is selected and the guest can run here."""
    global _run
    if _run is not None or os.environ.get(SHARED_DIR_ENV):
        return  # started, or an xdist worker: the controller starts it (start_for_workers)
    if _worth_starting(selected_names):
        _run = _launch()


def share_with_workers() -> None:
    """pytest-xdist's controller, before the workers start: the folder where
    the guest's outcome will be (start_for_workers), named in their environment."""
    os.environ[SHARED_DIR_ENV] = tempfile.mkdtemp(prefix="rcoll-guest-suite-")


_decided = False  # the controller's: the first worker's collection decides (they all collect the same)


def start_for_workers(selected_names: List[str]) -> None:
    """pytest-xdist's controller, once a worker has collected: start() with the
    output in the shared folder, and a thread that writes the exit status there."""
    global _run, _decided
    directory = os.environ.get(SHARED_DIR_ENV)
    if directory is None or _decided:
        return
    _decided = True
    if not _worth_starting(selected_names):
        return
    _run = run = _launch(directory)
    open(os.path.join(directory, "started"), "w").close()

    def write_status():
        returncode = run.proc.wait()
        partial = os.path.join(directory, "returncode.partial")
        with open(partial, "w") as f:
            f.write(str(returncode))
        os.replace(partial, os.path.join(directory, "returncode"))  # whole or absent for the reader

    threading.Thread(target=write_status, daemon=True).start()


def _shared_result(directory: str) -> subprocess.CompletedProcess:
    """A worker's wait for the run the controller started (start_for_workers)."""
    deadline = time.monotonic() + GUEST_TIMEOUT_S + PREPARE_ALLOWANCE_S
    status = os.path.join(directory, "returncode")
    while not os.path.exists(status):
        if time.monotonic() > deadline:
            raise TimeoutError(f"the Soft-RoCE guest's suite started by pytest's controller did not end "
                               f"within {GUEST_TIMEOUT_S + PREPARE_ALLOWANCE_S} s (its output: {directory})")
        time.sleep(1)

    def read(name):
        with open(os.path.join(directory, name)) as f:
            return f.read()

    with open(status) as f:
        returncode = int(f.read())
    return subprocess.CompletedProcess(SUITE, returncode, read("stdout"), read("stderr"))


def result() -> subprocess.CompletedProcess:
    """The guest suite's outcome: the run start() or the xdist controller
    began, or a run now."""
    global _run
    directory = os.environ.get(SHARED_DIR_ENV)
    if _run is None and directory is not None and os.path.exists(os.path.join(directory, "started")):
        return _shared_result(directory)
    if _run is None:
        return run_in_guest(SUITE, GUEST_TIMEOUT_S, SUITE_ENV)
    run, _run = _run, None
    return run.wait()


def stop(shared_folder_owner: bool = False) -> None:
    """At the session's end: a guest nobody waited for (the test deselected by
    -x, -k...) is stopped; the xdist controller removes the shared folder."""
    global _run
    if _run is not None:
        _run.stop()
        _run = None
    directory = os.environ.get(SHARED_DIR_ENV)
    if directory is not None and shared_folder_owner:
        shutil.rmtree(directory, ignore_errors=True)
