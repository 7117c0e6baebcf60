"""Builds and runs the standalone C++ tests (tests/cpp) under ASan + UBSan, and
the threaded ones under TSan as well (the progress and point-to-point threads)."""
import os
import shutil
import subprocess

import optional
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")
CXX = os.environ.get("CXX", "g++")



def _core_sources():
    """rcoll_core's sources as CMakeLists.txt lists them (one list: a new file
    there is linked here too). The verbs transport is among them: libibverbs is
    loaded at run time (dlopen), hence -ldl below."""
    import re
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        block = re.search(r"add_library\(rcoll_core STATIC(.*?)\)", f.read(), re.S).group(1)
    return [path[len("csrc/"):] for path in block.split() if path.startswith("csrc/")]


CORE = _core_sources()
UNITS = {
    "test_mr_cache": ["rdma/mr_cache.cc"],
    "test_reduce_kernels": ["reduce_kernels.cc", "dtype.cc", "error.cc"],
    "test_tcp_store": ["tcp_store.cc", "error.cc"],
    "test_communicator": CORE,
    "test_setup_parts": ["topology.cc", "agreed_settings.cc", "op_table.cc", "algorithms.cc", "dtype.cc", "error.cc",
                         "log.cc", "socket_util.cc", "wire.cc", "reduce_kernels.cc", "config.cc"],
}
SANITIZERS = {
    "asan+ubsan": ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"],
    "tsan": ["-fsanitize=thread"],
}
CASES = [(name, "asan+ubsan") for name in sorted(UNITS)] + [
    ("test_tcp_store", "tsan"), ("test_communicator", "tsan"), ("test_mr_cache", "tsan")]


@pytest.mark.slow  # each unit built and run under ASan/UBSan and TSan
@pytest.mark.skipif(shutil.which(CXX) is None, reason=f"no C++ compiler ({CXX}) on PATH")
@pytest.mark.parametrize("name,sanitizer", CASES)
def test_cpp_unit(name, sanitizer, tmp_path):
    exe = tmp_path / name
    sources = [os.path.join(ROOT, "tests", "cpp", name + ".cc")] + [os.path.join(CSRC, s) for s in UNITS[name]]
    build = subprocess.run(
        [CXX, "-std=c++17", "-O1", "-g", "-Wall", "-Wextra", "-Werror", *SANITIZERS[sanitizer], "-pthread",
         "-I" + CSRC, *sources, "-o", str(exe), "-ldl"],
        capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stderr[-4000:]
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=1", UBSAN_OPTIONS="print_stacktrace=1")
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600, env=env)
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
def test_verbs_abi_matches_rdma_core(tmp_path):
    """csrc/rdma/verbs_abi.h (rcoll's own declarations, so that no build needs
    rdma-core) has rdma-core's sizes, offsets and constants: a mismatch fails
    the compilation with the name of what differs."""
    include = _verbs_reference_include()
    if include is None:
        optional.missing("verbs_headers", "rdma-core's <infiniband/verbs.h> is not installed, nothing to check "
                         "csrc/rdma/verbs_abi.h against (install libibverbs-dev, or point "
                         "RCOLL_VERBS_REFERENCE_INCLUDE at an include directory that has infiniband/verbs.h)")
    exe = tmp_path / "test_verbs_abi"
    # rdma-core's directory goes last (-idirafter), so that nothing of rcoll's resolves there.
    build = subprocess.run(
        [CXX, "-std=c++17", "-Wall", "-Wextra", "-Wpedantic", "-Werror", "-I" + CSRC, "-idirafter", include,
         os.path.join(ROOT, "tests", "cpp", "test_verbs_abi.cc"), "-o", str(exe)],
        capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-6000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and "matches" in run.stdout, (run.stdout, run.stderr)
