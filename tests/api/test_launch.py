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


_AGENT = "E1129 05:05:13.966000 28233 torch/distributed/elastic/agent/server/api.py:1008] "
_STORE_CLOSED = "Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown or crash?"
# What a torchrun agent wrote when the store's agent left first (tests/hosts/test_multinode.py in CI).
_EXIT_BARRIER_RACE = "".join([
    "W1129 05:04:52.735950163 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved\n",
    _AGENT + "Error waiting on exit barrier. Elapsed: 0.5 seconds\n",
    _AGENT + "Traceback (most recent call last):\n",
    _AGENT + '  File "store.py", line 201, in barrier\n',
    _AGENT + "    store.wait([last_member_key])\n",
    _AGENT + "torch.distributed.DistNetworkError: " + _STORE_CLOSED + "\n",
    "W1129 05:05:18.547000 28233 dynamic_rendezvous.py:1346] The node 'n' has failed to send a keep-alive heartbeat\n",
])


def test_launcher_output_leaves_out_torchs_exit_barrier_race_and_nothing_else():
    launch.check_launcher_output("agent", _EXIT_BARRIER_RACE)
    # The same record with another cause (the barrier timed out: an agent never came) fails.
    timed_out = _EXIT_BARRIER_RACE.replace("DistNetworkError: " + _STORE_CLOSED, "DistStoreError: wait timeout")
    with pytest.raises(AssertionError, match="Traceback"):
        launch.check_launcher_output("agent", timed_out)
    # Anything fatal beside the race fails.
    with pytest.raises(AssertionError, match="Segmentation fault"):
        launch.check_launcher_output("agent", _EXIT_BARRIER_RACE + "Segmentation fault (core dumped)\n")
    with pytest.raises(AssertionError, match="Traceback"):
        launch.check_launcher_output("agent", "Traceback (most recent call last):\n  ValueError\n" + _EXIT_BARRIER_RACE)
