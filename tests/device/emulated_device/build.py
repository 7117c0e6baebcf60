"""Builds rcoll_emulated_device, the host-memory device runtime the tests use
in place of CUDA (emulated_device_api.h), and returns the directory that holds
it: put it on PYTHONPATH and set RCOLL_DEVICE_RUNTIME=rcoll_emulated_device.

Built once per source state and Python: the directory is named by a hash of the
sources, the compiler and the flags, under build/testing/ in the checkout
(shared with the Soft-RoCE guest, which so finds the host's build). Standard
library only; needs a C++17 compiler and pybind11 (both in the test extras).
"""
from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import sysconfig
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))  # tests/device/emulated_device/
CSRC = os.path.join(ROOT, "csrc")
MODULE = "rcoll_emulated_device"
# The emulated runtime reduces with the core's CPU kernels, compiled in here.
SOURCES = [os.path.join(HERE, "module.cc"), os.path.join(HERE, "emulated_device_api.cc")] + [
    os.path.join(CSRC, name) for name in ("reduce_kernels.cc", "dtype.cc", "error.cc")]
FLAGS = ["-std=c++17", "-O2", "-fPIC", "-pthread", "-Wall", "-Wextra", "-Werror", "-fvisibility=hidden"]


def _includes():
    import pybind11
    return ["-I" + HERE, "-I" + CSRC, "-I" + pybind11.get_include(), "-I" + sysconfig.get_paths()["include"]]


def build(out_root: str | None = None) -> str:
    """The directory holding the built module (built now if it is not there)."""
    cxx = os.environ.get("CXX", "g++")
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    digest = hashlib.sha256()
    for part in [cxx, sys.version, *FLAGS]:
        digest.update(part.encode() + b"\0")
    for path in SOURCES + [os.path.join(HERE, "emulated_device_api.h")]:
        with open(path, "rb") as f:
            digest.update(f.read())
    for header in sorted(os.listdir(CSRC)):
        if header.endswith(".h"):
            with open(os.path.join(CSRC, header), "rb") as f:
                digest.update(f.read())
    out_dir = os.path.join(out_root or os.path.join(ROOT, "build", "testing"), digest.hexdigest()[:16])
    target = os.path.join(out_dir, MODULE + suffix)
    if os.path.exists(target):
        return out_dir
    os.makedirs(out_dir, exist_ok=True)
    # Parallel test workers ask at once: one compiles (~15 s of CPU), the others
    # wait for it and find the module, instead of each compiling its own.
    with open(os.path.join(out_dir, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not os.path.exists(target):
            _compile(cxx, target, out_dir)
    return out_dir


def _compile(cxx: str, target: str, out_dir: str) -> None:
    with tempfile.TemporaryDirectory(dir=out_dir) as work:
        objects, compiles = [], []
        for source in SOURCES:  # one compiler per file, in parallel
            obj = os.path.join(work, os.path.basename(source) + ".o")
            objects.append(obj)
            compiles.append(subprocess.Popen([cxx, *FLAGS, *_includes(), "-c", source, "-o", obj],
                                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        for proc, source in zip(compiles, SOURCES):
            output = proc.communicate(timeout=600)[0]
            if proc.returncode != 0:
                raise RuntimeError(f"compiling {source} for {MODULE} failed:\n{output[-4000:]}")
        partial = os.path.join(work, os.path.basename(target))
        link = subprocess.run([cxx, "-shared", "-pthread", *objects, "-o", partial],
                              capture_output=True, text=True, timeout=300)
        if link.returncode != 0:
            raise RuntimeError(f"linking {MODULE} failed:\n{link.stderr[-4000:]}")
        os.replace(partial, target)  # atomic: a reader finds a whole module or none


if __name__ == "__main__":
    print(build())
