"""The multi-process suites against a core built with AddressSanitizer and
UndefinedBehaviorSanitizer: every rank process runs the instrumented module, so
memory errors and UB anywhere in the C++ (transport, executor, kernels, p2p)
under real multi-process traffic, failures included, fail this test. The
device-buffer suite runs too, on the emulated device runtime (tests/device/emulated_device/)."""
import glob
import os
import shutil
import subprocess
import sys

import pytest
from support import cpu_ledger
from support.paths import ROOT, TESTS

from native import cpp_build

pytestmark = pytest.mark.slow  # rebuilds the core under ASan/UBSan, reruns three suites (~10 min)



@pytest.mark.skipif(shutil.which("g++") is None, reason="no g++ to build the sanitized module")
@pytest.mark.timeout(2400)  # an ASan build plus the matrices over shm and TCP on 2 cores
def test_multiprocess_suites_under_asan_and_ubsan(tmp_path):
    build = cpp_build.build("asan+ubsan", ["_core"])  # the core the ASan C++ tests use too

    package = tmp_path / "pkg" / "rcoll"
    shutil.copytree(os.path.join(ROOT, "python", "rcoll"), package,
                    ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    for so in glob.glob(os.path.join(build, "_core*.so")):
        shutil.copy(so, package)
    def runtime(name):
        return subprocess.run(["g++", f"-print-file-name={name}"], capture_output=True, text=True).stdout.strip()
    # libasan first; libstdc++ right after it, or ASan's __cxa_throw interceptor
    # finds no real __cxa_throw (python is not linked against libstdc++).
    preload = f"{runtime('libasan.so')} {runtime('libstdc++.so')}"
    env = dict(os.environ,
               PYTHONPATH=f"{tmp_path / 'pkg'}{os.pathsep}{TESTS}",
               LD_PRELOAD=preload,
               # Python itself is not leak-clean; the C++ leak check is the TSan/ASan unit tests' job.
               ASAN_OPTIONS="detect_leaks=0:abort_on_error=1",
               UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1",
               # Every op, size and world, over every transport, failures included; one dtype per
               # element size and the reduce ops that take their own paths (tests/support/reference.py).
               TEST_MATRIX="paths")
    env.pop(cpu_ledger.LOG_VARIABLE, None)  # this test's row counts its CPU; rows of its own would count it twice
    # test_device_collectives.py: the GPU staging executor on the emulated device runtime.
    suites = [os.path.join(TESTS, f) for f in ("collectives/test_collectives.py", "failures/test_errors.py",
                                               "device/test_device_collectives.py")]
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-n", "2", *suites,
                          "-k", "not large_buffers and not [8]"],
                         capture_output=True, text=True, timeout=1800, env=env, cwd=str(tmp_path))
    tail = run.stdout[-3000:] + run.stderr[-5000:]
    assert run.returncode == 0, tail
    assert "AddressSanitizer" not in run.stderr and "runtime error" not in run.stderr, tail
    print(run.stdout.strip().splitlines()[-1])
