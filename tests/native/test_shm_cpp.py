"""Builds and runs the shared-memory transport's C++ test (tests/native/cpp/test_shm_transport.cc)
under ASan + UBSan and under TSan, the way tests/native/test_cpp.py runs the other C++ tests.

The test forks children (a peer that exits or is SIGKILLed mid-transfer), runs each
rank of a pair on its own thread, and prints its timings (meaningless under a
sanitizer, shown for the log)."""
import os
import shutil
import subprocess
import sys

import pytest

from native import cpp_build

pytestmark = pytest.mark.slow  # builds the transport under ASan/UBSan and TSan

CXX = os.environ.get("CXX", "g++")
SANITIZERS = ["asan+ubsan", "tsan"]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memfd_create and abstract Unix sockets are Linux")
@pytest.mark.skipif(shutil.which(CXX) is None, reason=f"no C++ compiler ({CXX}) on PATH")
@pytest.mark.parametrize("sanitizer", SANITIZERS)
def test_shm_transport(sanitizer):
    exe = os.path.join(cpp_build.build(sanitizer, ["test_shm_transport"]), "test_shm_transport")
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=1", UBSAN_OPTIONS="print_stacktrace=1",
               ASAN_OPTIONS="detect_leaks=1")
    env.pop("RCOLL_SHM_RING_BYTES", None)  # the test sets its own
    run = subprocess.run([exe, "--sanitized"], capture_output=True, text=True, timeout=600, env=env)
    print(run.stdout)
    assert run.returncode == 0, (run.stdout[-4000:], run.stderr[-6000:])
