"""CMake builds of rcoll's C++ tests, fuzzers and sanitized module, for pytest.

CMakeLists.txt describes every C++ test and fuzzer (RCOLL_BUILD_TESTS); this
configures one build directory per flavour under build/pytest-cmake/ and builds
the targets a test asks for. A directory is reused and rebuilt incrementally,
so each sanitizer compiles the core once for every test that needs it (the C++
units, the shared-memory transport test and, for ASan, the sanitized Python
suite), and a second run compiles only what changed. By hand:

    cmake -S . -B build/t -DRCOLL_BUILD_TESTS=ON -DRCOLL_BUILD_PYTHON=OFF \\
          -DRCOLL_SANITIZE=address,undefined && cmake --build build/t && ctest --test-dir build/t
"""
import fcntl
import os
import shutil
import subprocess
import sys

from support.paths import ROOT

# flavour -> RCOLL_SANITIZE
SANITIZE = {
    "asan+ubsan": "address,undefined",
    "tsan": "thread",
    "fuzz": "fuzzer-no-link,address,undefined",  # clang only: the core instrumented for libFuzzer
}
# The ASan flavour also builds rcoll._core (the sanitized Python suite).
WITH_PYTHON = {"asan+ubsan"}


def tool(name):
    """A program on PATH or beside this interpreter (the test extra installs cmake and ninja)."""
    return shutil.which(name) or shutil.which(name, path=os.path.dirname(sys.executable))


def build(flavour, targets, *, cxx=None, options=(), timeout=1800):
    """Configures build/pytest-cmake/<flavour> and builds `targets`; returns the
    build directory (executables at its top). Raises AssertionError with the
    compiler's output when either step fails."""
    cmake = tool("cmake")
    assert cmake, "cmake is needed (pip install cmake, part of the test extra)"
    build_dir = os.path.join(ROOT, "build", "pytest-cmake", flavour)
    # Tests run in parallel (pytest-xdist) may ask for one flavour at once: one
    # CMake at a time per directory, the second then finds the targets built.
    os.makedirs(os.path.dirname(build_dir), exist_ok=True)
    with open(f"{build_dir}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        return _build_locked(cmake, build_dir, flavour, targets, cxx, options, timeout)


def _build_locked(cmake, build_dir, flavour, targets, cxx, options, timeout):
    python = flavour in WITH_PYTHON
    # -O1 -g1, as the sanitizers' own documentation suggests: reports keep their
    # file and line, and the build takes half the CPU time of -O2 -g (an ASan
    # core and module: 84 s instead of 159 s of CPU). reduce_kernels.cc keeps
    # its own -O3 (CMakeLists.txt).
    configure = [cmake, "-S", ROOT, "-B", build_dir, "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
                 "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG", "-DRCOLL_BUILD_TESTS=ON",
                 "-DRCOLL_WERROR=ON", "-DRCOLL_BUILD_CUDA=OFF", f"-DRCOLL_BUILD_PYTHON={'ON' if python else 'OFF'}",
                 f"-DRCOLL_SANITIZE={SANITIZE[flavour]}", *options]
    if python:
        import pybind11
        configure += [f"-Dpybind11_DIR={pybind11.get_cmake_dir()}", f"-DPython_EXECUTABLE={sys.executable}"]
    if cxx:
        configure.append(f"-DCMAKE_CXX_COMPILER={cxx}")
    if tool("ninja") and not os.path.exists(os.path.join(build_dir, "CMakeCache.txt")):
        configure += ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={tool('ninja')}"]
    out = subprocess.run(configure, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"configuring {build_dir} failed:\n{out.stdout[-3000:]}{out.stderr[-3000:]}"
    out = subprocess.run([cmake, "--build", build_dir, "-j", str(os.cpu_count() or 2), "--target", *targets],
                         capture_output=True, text=True, timeout=timeout)
    assert out.returncode == 0, f"building {targets} failed:\n{out.stdout[-6000:]}{out.stderr[-3000:]}"
    return build_dir
