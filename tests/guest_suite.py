"""The verbs suite in the Soft-RoCE guest, started when the session starts.

The guest emulates its CPUs (TCG) and keeps about 1.25 of this machine's 2
cores busy for ~20 min, while most of the other tests wait on sockets, timers
and process start-ups: run side by side, the session ends ~10 min sooner
than with the guest in its turn. So when tests/test_verbs_guest.py is
selected, tests/conftest.py starts the guest as soon as collection ends
(start()), and that test waits for it (result()), with the same time limit it
would have had. RCOLL_GUEST_IN_BACKGROUND=0 runs it in its turn instead.

The guest sees this checkout through 9p: the emulated device runtime is built
here before it starts, so that the guest and the host never build it into
build/testing/ at once.
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

from softroce import PREPARE_ALLOWANCE_S, guest_available, guest_command, in_guest, run_in_guest

TEST_NAME = "test_verbs_suite_in_the_softroce_guest"
# TCG emulation: the suite takes 20-30 min on a busy 2-core machine.
GUEST_TIMEOUT_S = 3600
SUITE = [sys.executable, "-m", "pytest", "-q", "-ra", "-p", "no:cacheprovider", "--durations=10",
         "tests/test_verbs.py"]


class _Run:
    def __init__(self):
        self.stdout = tempfile.TemporaryFile(mode="w+")
        self.stderr = tempfile.TemporaryFile(mode="w+")
        self.started = time.monotonic()
        self.proc = subprocess.Popen(guest_command(SUITE, GUEST_TIMEOUT_S), stdin=subprocess.DEVNULL,
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


def start(selected_names: List[str]) -> None:
    """Starts the guest suite if its test is selected and the guest can run here."""
    global _run
    if _run is not None or TEST_NAME not in selected_names or in_guest():
        return
    if os.environ.get("RCOLL_GUEST_IN_BACKGROUND", "1") == "0" or not guest_available()[0]:
        return  # the test runs the guest in its turn (or says why it cannot)
    from emulated_device.build import build
    build()
    _run = _Run()


def result() -> subprocess.CompletedProcess:
    """The guest suite's outcome: the run start() began, or a run now."""
    global _run
    if _run is None:
        return run_in_guest(SUITE, GUEST_TIMEOUT_S)
    run, _run = _run, None
    return run.wait()


def stop() -> None:
    """At the session's end: a guest nobody waited for (the test deselected by -x, -k...) is stopped."""
    global _run
    if _run is not None:
        _run.stop()
        _run = None
