"""Builds and runs the standalone C++ tests (tests/cpp) under ASan + UBSan, and
the threaded ones under TSan as well (the progress and point-to-point threads)."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")
CXX = os.environ.get("CXX", "g++")

# The verbs transport compiles where rdma-core's headers are (CI installs them);
# it is never linked against libibverbs (dlopen), hence -ldl.
HAVE_VERBS_HEADERS = os.path.exists("/usr/include/infiniband/verbs.h")
RDMA = (["rdma/ib_device.cc", "rdma/ibverbs_loader.cc", "rdma/mr_cache.cc", "rdma/verbs_transport.cc"]
        if HAVE_VERBS_HEADERS else ["rdma/verbs_unavailable.cc", "rdma/mr_cache.cc"])


def _core_sources():
    """rcoll_core's sources as CMakeLists.txt lists them (one list: a new file
    there is linked here too), plus the verbs files this machine can build."""
    import re
    with open(os.path.join(ROOT, "CMakeLists.txt")) as f:
        block = re.search(r"add_library\(rcoll_core STATIC(.*?)\)", f.read(), re.S).group(1)
    return [path[len("csrc/"):] for path in block.split() if path.startswith("csrc/")] + RDMA


CORE = _core_sources()
UNITS = {
    "test_mr_cache": ["rdma/mr_cache.cc"],
    "test_reduce_kernels": ["reduce_kernels.cc", "dtype.cc", "error.cc"],
    "test_tcp_store": ["tcp_store.cc", "error.cc"],
    "test_communicator": CORE,
}
SANITIZERS = {
    "asan+ubsan": ["-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"],
    "tsan": ["-fsanitize=thread"],
}
CASES = [(name, "asan+ubsan") for name in sorted(UNITS)] + [
    ("test_tcp_store", "tsan"), ("test_communicator", "tsan"), ("test_mr_cache", "tsan")]


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
