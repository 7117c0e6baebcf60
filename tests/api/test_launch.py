"""The helpers that run jobs the way users do (tests/support/launch.py)."""
import os
import subprocess
import sys
import time

import pytest
from support import launch

pytestmark = pytest.mark.skipif(launch._runnable_tasks() is None, reason="no /proc/loadavg: every spinner runs")


def _spinner_states():
    """The state letter (R running, T stopped...) of each busy_cpus spinner of this process."""
    out = subprocess.run(["ps", "-o", "stat=,args=", "--ppid", str(os.getpid())],
                         capture_output=True, text=True, timeout=10).stdout
    return sorted(line.split()[0][0] for line in out.splitlines() if "while True: pass" in line)


@pytest.mark.timeout(60)
def test_busy_cpus_stops_its_spinners_while_other_work_keeps_the_cpus_busy():
    count = 2
    with launch.busy_cpus(ranks=1, count=count):
        # Enough runnable work beside the job that none of the spinners is needed
        # ("while 1", so that _spinner_states() does not count these).
        others = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(count + 2)]
        try:
            deadline = time.monotonic() + 20
            while _spinner_states() != ["T"] * count and time.monotonic() < deadline:
                time.sleep(0.1)
            assert _spinner_states() == ["T"] * count
        finally:
            for p in others:
                p.kill()
                p.wait()
    assert _spinner_states() == [], "the spinners outlived busy_cpus"
