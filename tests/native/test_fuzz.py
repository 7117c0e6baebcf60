"""Builds the libFuzzer targets in tests/native/fuzz with ASan + UBSan and fuzzes each for a bounded time.

RCOLL_FUZZ_SECONDS sets the time per target (default 30: a smoke run in the suite;
fuzz longer by hand); RCOLL_FUZZ_SECONDS=0 skips these tests. Without a clang that
builds libFuzzer targets they skip with the install command, unless
RCOLL_REQUIRE_FUZZ=1 (set by .ci/run: CI always fuzzes).
RCOLL_FUZZ_CXX picks the compiler (default: clang++, else the newest clang++-NN on PATH).
Fuzzing starts from the seed corpus in tests/native/fuzz/corpus/<target> (copied: the
checked-in corpus is not modified); a crash fails the test with libFuzzer's report,
which includes the input in hex and Base64, and leaves the input in the test's tmp dir.
To fuzz one target longer by hand, see docs/development.md (Fuzzing).
"""
import os
import re
import shutil
import subprocess

import pytest
from support import optional

from native import cpp_build

FUZZ = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fuzz")
SECONDS = int(os.environ.get("RCOLL_FUZZ_SECONDS", "30"))

# The targets, as CMakeLists.txt builds them (RCOLL_BUILD_TESTS with clang and
# RCOLL_SANITIZE=fuzzer-no-link,address,undefined; tests/native/cpp_build.py).
TARGETS = ["fuzz_handshake", "fuzz_receive_path", "fuzz_wire_header"]
# extra libFuzzer options per target
OPTIONS = {
    "fuzz_wire_header": ["-max_len=129"],  # mode byte + two headers: longer inputs add nothing
}
# What the probe compiles with: a clang that builds this can build the targets.
FLAGS = ["-std=c++17", "-g", "-O1", "-fsanitize=fuzzer,address,undefined", "-fno-sanitize-recover=undefined"]
INSTALL_HINT = ("the fuzz tests need clang with its sanitizer and libFuzzer runtimes: on Debian/Ubuntu "
                "`sudo apt-get install clang libclang-rt-14-dev` (Debian 12; or the libclang-rt-NN-dev matching "
                "your clang), or set RCOLL_FUZZ_CXX to a clang++")

pytestmark = [pytest.mark.slow,  # each target runs RCOLL_FUZZ_SECONDS
              pytest.mark.skipif(SECONDS <= 0, reason="RCOLL_FUZZ_SECONDS=0: fuzzing disabled")]


def fuzzing_compiler():
    """clang++ if it builds a libFuzzer target with ASan/UBSan here, else None."""
    cxx = find_clang()
    if cxx is None:
        return None
    probe = 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }'
    r = subprocess.run([cxx, "-x", "c++", *FLAGS, "-o", os.devnull, "-"], input=probe, capture_output=True,
                       text=True, timeout=300)
    return cxx if r.returncode == 0 else None


def find_clang():
    explicit = os.environ.get("RCOLL_FUZZ_CXX")
    if explicit:
        return shutil.which(explicit)
    if shutil.which("clang++"):
        return shutil.which("clang++")
    for version in range(30, 10, -1):
        found = shutil.which(f"clang++-{version}")
        if found:
            return found
    return None


@pytest.fixture(scope="module")
def fuzz_build():
    """(build directory, compiler): the targets built once, or (None, None)
    without a clang that builds libFuzzer targets."""
    cxx = fuzzing_compiler()
    if cxx is None:
        return None, None  # each test skips (or fails where required) with INSTALL_HINT
    try:
        return cpp_build.build("fuzz", TARGETS, cxx=cxx), cxx
    except AssertionError as e:
        pytest.fail(f"{e}\n{INSTALL_HINT}", pytrace=False)


def final_stats(log):
    """(executions, exec/s, cov, ft, corpus units) from libFuzzer's output."""
    def last(pattern):
        found = re.findall(pattern, log, re.M)
        return int(found[-1]) if found else None
    execs = last(r"^stat::number_of_executed_units:\s*(\d+)") or last(r"^#(\d+)\s+DONE")
    rate = last(r"^stat::average_exec_per_sec:\s*(\d+)")
    cov = last(r"^#\d+\s+\w+\s+cov: (\d+)")
    ft = last(r"^#\d+\s+\w+\s+cov: \d+ ft: (\d+)")
    corp = last(r"^#\d+\s+\w+\s+cov: \d+ ft: \d+ corp: (\d+)")
    return execs, rate, cov, ft, corp


@pytest.mark.timeout(SECONDS + 900)
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_fuzz(target, fuzz_build, tmp_path, capsys):
    build_dir, cxx = fuzz_build
    if cxx is None:
        which = os.environ.get("RCOLL_FUZZ_CXX") or "clang++"
        optional.missing("fuzz", f"no {which} that builds a libFuzzer target with ASan/UBSan: {INSTALL_HINT}")
    exe = os.path.join(build_dir, target)
    corpus = tmp_path / "corpus"
    shutil.copytree(os.path.join(FUZZ, "corpus", target), corpus)
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir()
    env = dict(os.environ, RCOLL_DEBUG="NONE", UBSAN_OPTIONS="print_stacktrace=1")
    log_path = tmp_path / (target + ".log")
    with open(log_path, "w") as log_file:
        r = subprocess.run([exe, f"-max_total_time={SECONDS}", "-timeout=5", "-rss_limit_mb=2048",
                            "-print_final_stats=1", f"-artifact_prefix={artifacts}/", *OPTIONS.get(target, []),
                            str(corpus)],
                           stdout=log_file, stderr=subprocess.STDOUT, env=env, timeout=SECONDS + 600)
    log = log_path.read_text(errors="replace")
    execs, rate, cov, ft, corp = final_stats(log)
    with capsys.disabled():
        print(f"\n{target}: {execs} inputs in {SECONDS} s ({rate}/s), cov {cov}, ft {ft}, corpus {corp} "
              f"(exit {r.returncode})")
    crashes = sorted(p.name for p in artifacts.iterdir())
    assert r.returncode == 0, (f"{target} found a bug (exit {r.returncode}); inputs kept in {artifacts}: {crashes}\n"
                               f"{log[-6000:]}")
    assert execs and execs > 0, f"{target} ran no inputs:\n{log[-3000:]}"
