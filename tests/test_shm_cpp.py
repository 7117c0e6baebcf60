"""Builds and runs the shared-memory transport's C++ test (tests/cpp/test_shm_transport.cc)
under ASan + UBSan and under TSan, the way tests/test_cpp.py runs the other C++ tests.

The test forks children (a peer that exits or is SIGKILLed mid-transfer), runs each
rank of a pair on its own thread, and prints its timings (meaningless under a
sanitizer, shown for the log)."""
import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # builds the transport under ASan/UBSan and TSan

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")
CXX = os.environ.get("CXX", "g++")

SOURCES = ["shm/shm_transport.cc", "shm/shm_setup.cc", "side_channel.cc", "peer_listener.cc", "socket_util.cc",
           "wire.cc", "dtype.cc", "error.cc", "log.cc", "config.cc"]
SANITIZERS = {
    "asan+ubsan": ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"],
    "tsan": ["-fsanitize=thread"],
}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="memfd_create and abstract Unix sockets are Linux")
@pytest.mark.skipif(shutil.which(CXX) is None, reason=f"no C++ compiler ({CXX}) on PATH")
@pytest.mark.parametrize("sanitizer", sorted(SANITIZERS))
def test_shm_transport(sanitizer, tmp_path):
    exe = tmp_path / "test_shm_transport"
    sources = [os.path.join(ROOT, "tests", "cpp", "test_shm_transport.cc")] + [os.path.join(CSRC, s) for s in SOURCES]
    build = subprocess.run(
        [CXX, "-std=c++17", "-O1", "-g", "-Wall", "-Wextra", "-Werror", *SANITIZERS[sanitizer], "-pthread",
         "-I" + CSRC, *sources, "-o", str(exe)],
        capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stderr[-4000:]
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=1", UBSAN_OPTIONS="print_stacktrace=1",
               ASAN_OPTIONS="detect_leaks=1")
    env.pop("RCOLL_SHM_RING_BYTES", None)  # the test sets its own
    run = subprocess.run([str(exe), "--sanitized"], capture_output=True, text=True, timeout=600, env=env)
    print(run.stdout)
    assert run.returncode == 0, (run.stdout[-4000:], run.stderr[-6000:])
