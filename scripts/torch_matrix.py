"""rcoll against torch releases: the torch backend's tests, the user journeys and
torch's own DistributedTest selection, run in one virtual environment per torch
release, each with the oldest numpy that release and this Python allow.

    python scripts/torch_matrix.py                      # every minor release, 2.4 to the newest
    python scripts/torch_matrix.py --releases 2.4.1,2.14.1
    python scripts/torch_matrix.py --releases 2.4.1 --numpy newest -- -k ddp

Each release gets a venv under $XDG_CACHE_HOME/rcoll/torch-matrix/ (kept and
reused: a CUDA build of torch with its libraries is ~5 GB, and installs in about
a minute from a warm pip cache; --fresh rebuilds it, --drop removes it after its
run). rcoll goes in as a wheel built once from this checkout. pytest runs
COMPAT_TESTS (below) in tests/ with that venv's Python; the table (release,
numpy, passed / failed / skipped per file, the failures by name) is printed and,
with --json, written. Exit status 1 if any release had a failure or could not
be installed.

PyPI's torch wheels for Linux x86_64 are CUDA builds; `import torch` loads their
CUDA libraries (the nvidia-* wheels), so they are installed with torch: without
them torch 2.4 fails to import. No GPU is needed to run them.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"

# The newest patch of every minor release from the oldest supported on
# (pyproject's `torch` extra); this machine's pip is capped at 2.14.1.
RELEASES = ["2.4.1", "2.5.1", "2.6.0", "2.7.1", "2.8.0", "2.9.1", "2.10.0", "2.11.0", "2.12.1", "2.13.0", "2.14.1"]

# The oldest numpy with a wheel for each Python that rcoll (numpy>=1.22) and its
# bfloat16 extra (ml_dtypes>=0.3: numpy>=1.23.3 on Python 3.11) allow.
OLDEST_NUMPY = {(3, 9): "1.22.0", (3, 10): "1.22.0", (3, 11): "1.23.3", (3, 12): "1.26.0", (3, 13): "2.1.0"}

# What runs against each release: the backend's own tests, the user journeys
# under torchrun and launcher environments (DDP with hooks and no_sync, FSDP2,
# compiled functional collectives, sub-groups, send/recv, object collectives,
# exit codes), clean exits, restarts under torchrun, torch's DistributedTest
# selection; jobs across emulated hosts; the numpy API's collectives (with the
# oldest numpy).
# Paths under tests/; each file's name (its stem) keys its column of the table.
COMPAT_TESTS = ["torch_backend/test_torch.py", "torch_backend/test_user_journeys.py",
                "torch_backend/test_frameworks.py", "failures/test_clean_exit.py", "failures/test_restart.py",
                "hosts/test_multinode.py", "torch_backend/test_torch_suite.py", "collectives/test_collectives.py"]

# pyproject's frameworks extra (tests/torch_backend/test_frameworks.py)
FRAMEWORKS = ["lightning", "accelerate", "deepspeed"]
TEST_DEPS = ["pytest>=7", "pytest-timeout>=2.1", "pytest-xdist>=3.5", "ml_dtypes>=0.3", "expecttest",
             "lightning>=2.2", "accelerate>=0.30", "deepspeed>=0.14"]


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "rcoll" / "torch-matrix"


def run(cmd, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], text=True, **kwargs)


def pip_error(proc: subprocess.CompletedProcess) -> str:
    """pip's own error lines, without its warnings about index locations."""
    lines = [line for line in proc.stderr.splitlines() if line.strip() and not line.startswith("WARNING:")]
    return "\n".join(lines[-12:])


def build_wheel(out: Path) -> Path:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    proc = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", out, ROOT],
               capture_output=True)
    if proc.returncode != 0:
        sys.exit(f"building rcoll's wheel failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return next(out.glob("rcoll-*.whl"))


def numpy_pin(which: str) -> str:
    if which == "newest":
        return "numpy"
    return f"numpy=={OLDEST_NUMPY[sys.version_info[:2]]}"


def prepare_venv(release: str, numpy: str, wheel: Path, fresh: bool) -> tuple[Path, str]:
    """The venv of one release, with torch, numpy and the test deps, and rcoll
    from `wheel`; returns its python and what failed ("" if nothing)."""
    venv = cache_dir() / f"py{sys.version_info[0]}{sys.version_info[1]}-torch{release}"
    python = venv / "bin" / "python"
    marker = venv / "rcoll-matrix.json"
    want = {"torch": release, "numpy": numpy, "deps": TEST_DEPS}
    if fresh or not marker.exists() or json.loads(marker.read_text()) != want:
        shutil.rmtree(venv, ignore_errors=True)
        run([sys.executable, "-m", "venv", venv], check=True)
        # numpy pinned with torch, so that pip picks test deps that accept it.
        proc = run([python, "-m", "pip", "install", "-q", f"torch=={release}", numpy_pin(numpy), *TEST_DEPS],
                   capture_output=True)
        if proc.returncode != 0:
            return python, f"pip install torch=={release} failed: {pip_error(proc)}"
        marker.write_text(json.dumps(want))
    proc = run([python, "-m", "pip", "install", "-q", "--force-reinstall", "--no-deps", wheel], capture_output=True)
    if proc.returncode != 0:
        return python, f"installing {wheel.name} failed: {pip_error(proc)}"
    return python, ""


def versions(python: Path) -> dict:
    proc = run([python, "-c", "import json, importlib.metadata as m; print(json.dumps({name: m.version(name) for name "
                              f"in {['torch', 'numpy', *FRAMEWORKS]!r}}}))"], capture_output=True)
    return json.loads(proc.stdout) if proc.returncode == 0 else {"error": proc.stderr.strip()[-500:]}


def pytest_env(python: Path) -> dict:
    """The environment pytest runs in: this one, less rcoll's settings and an
    outer venv, with the release's venv first on PATH (its torchrun)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RCOLL_", "PYTEST_"))}
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = f"{python.parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def run_tests(python: Path, extra: list, log: Path) -> dict:
    """pytest over COMPAT_TESTS with `python`; per-file counts and failures."""
    junit_xml = log.with_suffix(".xml")
    junit_xml.unlink(missing_ok=True)
    cmd = [python, "-m", "pytest", "-q", "-rfEs", "--durations", "12", "-p", "no:cacheprovider",
           f"--junitxml={junit_xml}", *COMPAT_TESTS, *extra]
    suite_summary = log.with_suffix(".torch-suite.txt")  # torch's own suite's counts (test_torch_suite.py)
    suite_summary.unlink(missing_ok=True)
    env = pytest_env(python)
    env["RCOLL_TORCH_SUITE_SUMMARY"] = str(suite_summary)
    started = time.monotonic()
    proc = run(cmd, cwd=TESTS, env=env, capture_output=True)
    log.write_text(proc.stdout + "\n" + proc.stderr)
    summary = {"seconds": round(time.monotonic() - started), "exit": proc.returncode, "files": {},
               "failed": sorted(set(re.findall(r"^(?:FAILED|ERROR) (\S+)", proc.stdout, re.MULTILINE))),
               "skipped": re.findall(r"^SKIPPED \[\d+\] (.+)$", proc.stdout, re.MULTILINE)}
    last = proc.stdout.strip().splitlines()[-1:] or [""]
    summary["result"] = last[0].strip("= ")
    summary["files"] = file_counts(junit_xml)
    if suite_summary.exists():
        summary["torch_suite"] = re.sub(r" in [\d.]+s.*$", "", suite_summary.read_text().strip().strip("= "))
    return summary


def file_counts(junit_xml: Path) -> dict:
    """passed/failed/skipped per test file, from pytest's JUnit XML: each
    result belongs to its test, wherever the skip was raised (a helper
    module's skip names the helper in pytest's -rs summary). A case's
    classname is its module's dotted name (e.g. torch_backend.test_torch, with
    the class after it): the part that is a file's stem names the file."""
    stems = {Path(name).stem: name for name in COMPAT_TESTS}
    counts = {name: {"passed": 0, "failed": 0, "skipped": 0} for name in COMPAT_TESTS}
    if not junit_xml.exists():
        return counts
    for case in ElementTree.parse(junit_xml).iter("testcase"):
        module = next((stems[part] for part in case.get("classname", "").split(".") if part in stems), None)
        if module is None:
            continue
        if case.find("failure") is not None or case.find("error") is not None:
            counts[module]["failed"] += 1
        elif case.find("skipped") is not None:
            counts[module]["skipped"] += 1
        else:
            counts[module]["passed"] += 1
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--releases", default=",".join(RELEASES),
                        help="comma-separated torch releases (default: the newest patch of every minor release)")
    parser.add_argument("--numpy", choices=["oldest", "newest"], default="oldest",
                        help="numpy to pair with each release (default: the oldest this Python allows)")
    parser.add_argument("--fresh", action="store_true", help="rebuild each release's venv")
    parser.add_argument("--drop", action="store_true", help="remove each release's venv after its run")
    parser.add_argument("--json", type=Path, help="write the results here")
    parser.add_argument("pytest_args", nargs="*", help="after --: passed to pytest (e.g. -k ddp)")
    args = parser.parse_args()

    work = cache_dir()
    work.mkdir(parents=True, exist_ok=True)
    wheel = build_wheel(work / "wheel")
    results = []
    for release in [r.strip() for r in args.releases.split(",") if r.strip()]:
        print(f"== torch {release} (numpy {args.numpy})", flush=True)
        python, failure = prepare_venv(release, args.numpy, wheel, args.fresh)
        entry = {"release": release, "numpy_choice": args.numpy, "python": sys.version.split()[0]}
        if failure:
            entry["install_error"] = failure
            print(f"   {failure}", flush=True)
        else:
            entry.update(versions(python))
            entry.update(run_tests(python, args.pytest_args, work / f"torch{release}.log"))
            stack = ", ".join(f"{name} {entry.get(name)}" for name in ["torch", "numpy", *FRAMEWORKS])
            print(f"   {stack}: {entry['result']} "
                  f"({entry['seconds']} s; log {work / f'torch{release}.log'})", flush=True)
            if entry.get("torch_suite"):
                print(f"   torch's own suite: {entry['torch_suite']}", flush=True)
            for name in entry["failed"]:
                print(f"   FAILED {name}", flush=True)
        results.append(entry)
        if args.drop:
            shutil.rmtree(python.parent.parent, ignore_errors=True)
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "results": results}, indent=1) + "\n")
    return 0 if all(not r.get("install_error") and r.get("exit") == 0 for r in results) else 1


def table(results: list) -> str:
    files = COMPAT_TESTS
    head = "| torch | numpy | " + " | ".join(Path(f).stem for f in files) + " | torch's own tests | failed |"
    lines = [head, "|" + " --- |" * (len(files) + 4)]
    for r in results:
        if r.get("install_error"):
            blank = " | ".join("" for _ in files)
            lines.append(f"| {r['release']} | | {blank} | | install: {r['install_error'][:80]} |")
            continue
        cells = [f"{c['passed']}/{c['failed']}/{c['skipped']}" for c in (r["files"][f] for f in files)]
        lines.append(f"| {r.get('torch', r['release'])} | {r.get('numpy', '')} | " + " | ".join(cells)
                     + f" | {r.get('torch_suite', '')} | {', '.join(n.split('::')[-1] for n in r['failed']) or '-'} |")
    return "\n".join(lines) + "\n(cells: passed/failed/skipped)"


if __name__ == "__main__":
    sys.exit(main())
