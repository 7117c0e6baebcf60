"""Builds and runs the standalone C++ tests (tests/native/cpp) under ASan + UBSan, and
the threaded ones under TSan as well (the progress and point-to-point threads).
CMakeLists.txt builds them (RCOLL_BUILD_TESTS; tests/native/cpp_build.py)."""
import os
import shutil
import subprocess

import pytest
from support import optional

from native import cpp_build

CXX = os.environ.get("CXX", "g++")

UNITS = ["test_ack_watch", "test_communicator", "test_job_health", "test_mr_cache", "test_on_demand_connector",
         "test_reduce_kernels", "test_response_slots", "test_schedules", "test_setup_parts", "test_tcp_store"]
CASES = [(name, "asan+ubsan") for name in UNITS] + [
    ("test_tcp_store", "tsan"), ("test_communicator", "tsan"), ("test_mr_cache", "tsan"),
    ("test_on_demand_connector", "tsan"), ("test_job_health", "tsan")]


@pytest.mark.slow  # each unit built and run under ASan/UBSan and TSan
@pytest.mark.skipif(shutil.which(CXX) is None, reason=f"no C++ compiler ({CXX}) on PATH")
@pytest.mark.parametrize("name,sanitizer", CASES)
def test_cpp_unit(name, sanitizer):
    build_dir = cpp_build.build(sanitizer, [name])
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=1", UBSAN_OPTIONS="print_stacktrace=1")
    run = subprocess.run([os.path.join(build_dir, name)], capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, (run.stdout[-4000:], run.stderr[-6000:])


def _verbs_reference_include():
    """Where rdma-core's <infiniband/verbs.h> is, to check rcoll's declarations
    against: RCOLL_VERBS_REFERENCE_INCLUDE (CI extracts the package there, since
    it builds rcoll with no rdma-core headers installed), else the system's."""
    for directory in (os.environ.get("RCOLL_VERBS_REFERENCE_INCLUDE"), "/usr/include"):
        if directory and os.path.exists(os.path.join(directory, "infiniband", "verbs.h")):
            return directory
    return None


@pytest.mark.skipif(shutil.which(CXX) is None, reason=f"no C++ compiler ({CXX}) on PATH")
def test_verbs_abi_matches_rdma_core():
    """csrc/rdma/verbs_abi.h (rcoll's own declarations, so that no build needs
    rdma-core) has rdma-core's sizes, offsets and constants: a mismatch fails
    the compilation with the name of what differs."""
    include = _verbs_reference_include()
    if include is None:
        optional.missing("verbs_headers", "rdma-core's <infiniband/verbs.h> is not installed, nothing to check "
                         "csrc/rdma/verbs_abi.h against (install libibverbs-dev, or point "
                         "RCOLL_VERBS_REFERENCE_INCLUDE at an include directory that has infiniband/verbs.h)")
    build_dir = cpp_build.build("asan+ubsan", ["test_verbs_abi"],
                                options=[f"-DRCOLL_VERBS_REFERENCE_INCLUDE={include}"])
    exe = os.path.join(build_dir, "test_verbs_abi")
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "matches" in run.stdout, (run.stdout, run.stderr)
