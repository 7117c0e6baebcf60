"""Builds and runs the standalone C++ unit tests (tests/cpp) under ASan + UBSan."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CSRC = os.path.join(ROOT, "csrc")
CXX = os.environ.get("CXX", "g++")

UNITS = {
    "test_reduce_kernels": ["reduce_kernels.cc", "dtype.cc", "error.cc"],
    "test_tcp_store": ["tcp_store.cc", "error.cc"],
}


@pytest.mark.skipif(shutil.which(CXX) is None, reason=f"no C++ compiler ({CXX}) on PATH")
@pytest.mark.parametrize("name", sorted(UNITS))
def test_cpp_unit(name, tmp_path):
    exe = tmp_path / name
    sources = [os.path.join(ROOT, "tests", "cpp", name + ".cc")] + [os.path.join(CSRC, s) for s in UNITS[name]]
    build = subprocess.run(
        [CXX, "-std=c++17", "-O1", "-g", "-Wall", "-Wextra", "-Werror", "-fsanitize=address,undefined",
         "-fno-sanitize-recover=undefined", "-pthread", "-I" + CSRC, *sources, "-o", str(exe)],
        capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, (run.stdout[-4000:], run.stderr[-4000:])
