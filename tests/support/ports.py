"""Ports for the rendezvous of the ranks a test starts (MASTER_PORT).

A port the kernel picks (bind to port 0, then close) is free only for a
moment: with tests in parallel (pytest-xdist), two tests asking at once can be
handed the same one, and the ranks of one job then meet the other job's
store. So each test process takes its ports in turn from a range of its own,
below Linux's ephemeral range (where the kernel picks nothing), skipping any
port in use: the xdist workers of one session split the range, and a pytest
session started by a test (the sanitized suite, torch's suite) splits the
range of the worker that started it.
"""
from __future__ import annotations

import os
import random
import socket
import threading
from typing import Tuple


def _outside_the_ephemeral_range():
    """About 20,000 ports the kernel hands out to no connect() or bind(0):
    below Linux's ephemeral range (32768-60999 by default) or above it."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            first, last = (int(x) for x in f.read().split())
    except (OSError, ValueError):
        first, last = 32768, 60999
    if first >= 12000:
        return max(1024, first - 22000), first - 1
    if last <= 63000:
        return last + 1, 65535
    return 10000, 32000  # no room outside it: the pick at least rarely meets another test's


LOW, HIGH = _outside_the_ephemeral_range()
MAX_WORKERS = 8
ENV = "RCOLL_TEST_PORT_RANGE"  # "low:high:testrunuid", for the pytest sessions a worker starts


def _range() -> Tuple[int, int]:
    low, high, made_by = LOW, HIGH, None
    if os.environ.get(ENV):
        low_text, high_text, made_by = os.environ[ENV].split(":", 2)
        low, high = int(low_text), int(high_text)
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    # A worker of a session that has not split this range yet (a session's
    # controller inherits its starter's variables and uses them as they are).
    if worker.startswith("gw") and run != made_by:
        width = (high - low) // MAX_WORKERS
        n = int(worker[2:]) % MAX_WORKERS
        low, high = low + n * width, low + (n + 1) * width
        os.environ[ENV] = f"{low}:{high}:{run}"
    return low, high


_LOW, _HIGH = _range()
_lock = threading.Lock()
_next = random.randrange(_LOW, _HIGH)


def free_port() -> int:
    """A port of this process's range that nothing holds now, the next in turn."""
    global _next
    with _lock:
        for _ in range(_HIGH - _LOW):
            port = _next
            _next = _LOW + (_next + 1 - _LOW) % (_HIGH - _LOW)
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                try:
                    s.bind(("127.0.0.1", port))  # no SO_REUSEADDR: a port in TIME_WAIT is skipped too
                except OSError:
                    continue
                return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:  # the whole range busy: the kernel's pick
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
