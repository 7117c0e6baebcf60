"""Helpers for tests that need real ibverbs: a Soft-RoCE QEMU guest.

The machines this project runs on have no RDMA in their kernel; the guest started by
scripts/softroce/guest.py has six Soft-RoCE devices on three veth pairs (rxe0 on
192.0.2.1 and rxe1 on 192.0.2.2; rxe2 on 198.51.100.1 and rxe3 on 198.51.100.2, a
second port for each side, with 2001:db8:2::1 and ::2 too; RoCE v2 IPv4 GID at index 1; rxe4 on 2001:db8:5::1 and
rxe5 on 2001:db8:5::2, a network with IPv6 alone) and sees the project directory read-write at
the same path, so a test on the host can re-run pytest (or any command) inside it:

    ok, reason = guest_available()
    if not ok:
        pytest.skip(reason)
    proc = run_in_guest([sys.executable, "-m", "pytest", "-q", "tests/rdma/test_verbs.py"],
                        timeout=900, env={"PYTHONPATH": "python"})
    assert proc.returncode == 0, proc.stdout + proc.stderr

and a test meant for the guest checks in_guest() (RCOLL_SOFTROCE_GUEST=1).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

from support.paths import ROOT

REPO = Path(ROOT).resolve()
GUEST_SCRIPT = REPO / "scripts" / "softroce" / "guest.py"

# First use may download and unpack the kernel (~70 MB, ~10 s here) before the
# guest's own time limit starts; allow for it on top of `timeout`.
PREPARE_ALLOWANCE_S = 300


def in_guest() -> bool:
    """True when running inside the Soft-RoCE guest."""
    return os.environ.get("RCOLL_SOFTROCE_GUEST") == "1"


def _guest_module():
    # guest.py is a script, not a package module; load it by path for its checks.
    spec = importlib.util.spec_from_file_location("rcoll_softroce_guest", GUEST_SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


SOFTROCE_HINT = ("install: sudo apt-get install qemu-system-x86 busybox-static iproute2 kmod rdma-core "
                 "ibverbs-providers ibverbs-utils perftest python3-pyverbs, then "
                 "python3 scripts/softroce/guest.py prepare")

def guest_available(for_check: bool = False) -> Tuple[bool, str]:
    """(usable, reason) for running commands in the guest from this host.

    Changes nothing: a cache that is not prepared yet but can be (apt works) counts
    as available. for_check also requires what `run --check` uses on top
    (ibverbs-utils, python3-pyverbs)."""
    if in_guest():
        return False, "already inside the Soft-RoCE guest"
    if not GUEST_SCRIPT.is_file():
        return False, f"{GUEST_SCRIPT} is missing"
    if not os.path.exists("/dev/null") or not os.access("/dev/null", os.W_OK):
        return False, "/dev/null is not usable"
    try:
        return _guest_module().availability(for_check=for_check)
    except Exception as e:  # a broken harness must read as a reason, not a crash
        return False, f"cannot query {GUEST_SCRIPT.name}: {e!r}"


def _guest_argv(timeout: float, env: Optional[Dict[str, str]],
                project: Optional[Path]) -> List[str]:
    argv = [sys.executable, str(GUEST_SCRIPT), "run", "--timeout", str(timeout),
            "--project", str(project or REPO)]
    for k, v in (env or {}).items():
        argv += ["--env", f"{k}={v}"]
    return argv


def run_in_guest(command: Union[List[str], str], timeout: float,
                 env: Optional[Dict[str, str]] = None,
                 project: Optional[Path] = None) -> subprocess.CompletedProcess:
    """Run `command` in the project directory inside a fresh guest.

    A string goes through /bin/sh -c. `timeout` bounds the whole guest (boot, ~10-30 s
    under TCG, included). `env` is set on top of what is passed through from this
    process (PATH, PYTHONPATH, HOME, VIRTUAL_ENV, RCOLL_*, PYTHON*, ...). Returns the
    command's stdout and stderr (text) and exit code; 124 means the guest timed out,
    125 that the harness failed (see the "[softroce]" lines in stderr)."""
    return subprocess.run(guest_command(command, timeout, env, project), stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=timeout + PREPARE_ALLOWANCE_S)


def guest_command(command: Union[List[str], str], timeout: float,
                  env: Optional[Dict[str, str]] = None,
                  project: Optional[Path] = None) -> List[str]:
    """The argv that runs `command` in a fresh guest (what run_in_guest runs), for
    a caller that starts it itself (tests/support/guest_suite.py)."""
    if isinstance(command, str):
        command = ["/bin/sh", "-c", command]
    return _guest_argv(timeout, env, project) + ["--"] + list(command)


def run_guest_check(timeout: float = 600) -> subprocess.CompletedProcess:
    """`guest.py run --check`: the built-in Soft-RoCE self-test."""
    argv = _guest_argv(timeout, None, None) + ["--check"]
    return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=timeout + PREPARE_ALLOWANCE_S)
