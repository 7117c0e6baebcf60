"""Where the suite's CPU goes: with RCOLL_TEST_CPU_LOG=<file>, each test's CPU time.

The suite is CPU-bound on a 2-core machine (docs/development.md), so wall times
under xdist say little: a test that waits looks as long as one that computes.
This plugin appends one JSON line per test to the file: the CPU seconds (user
and system) of the worker process and of every child it waited for during the
test (spawned ranks, torchrun jobs, compilers: getrusage's RUSAGE_CHILDREN
counts descendants once they are reaped), the wall seconds, when it began and
on which worker.

    RCOLL_TEST_CPU_LOG=/tmp/cpu.jsonl python -m pytest tests -q
    python tests/support/cpu_ledger.py /tmp/cpu.jsonl      # the largest first, by file too

Each xdist worker runs one test at a time, so its deltas are that test's own.
Processes a test leaves running (the Soft-RoCE guest, started by the
controller) are not counted, nor are the ranks rcoll.spawn forks: they are its
fork server's children, reaped by it.
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time

import pytest

LOG_VARIABLE = "RCOLL_TEST_CPU_LOG"


def _cpu_seconds() -> float:
    total = 0.0
    for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN):
        usage = resource.getrusage(who)
        total += usage.ru_utime + usage.ru_stime
    return total


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    path = os.environ.get(LOG_VARIABLE)
    if not path:
        yield
        return
    cpu, wall, start = _cpu_seconds(), time.monotonic(), time.time()
    yield
    row = {"test": item.nodeid, "cpu_s": round(_cpu_seconds() - cpu, 2), "wall_s": round(time.monotonic() - wall, 2),
           "start": round(start, 2), "worker": os.environ.get("PYTEST_XDIST_WORKER", "main")}
    with open(path, "a") as log:  # one short line per write: appends from the workers do not interleave
        log.write(json.dumps(row) + "\n")


def summary(path: str, top: int = 40) -> str:
    rows = [json.loads(line) for line in open(path) if line.strip()]
    by_file: dict[str, list[float]] = {}
    for r in rows:
        totals = by_file.setdefault(r["test"].split("::")[0], [0.0, 0.0, 0])
        totals[0] += r["cpu_s"]
        totals[1] += r["wall_s"]
        totals[2] += 1
    lines = [f"{len(rows)} tests, {sum(r['cpu_s'] for r in rows) / 60:.1f} CPU-min, "
             f"{sum(r['wall_s'] for r in rows) / 60:.1f} test-min", "", "by file: CPU s, wall s, tests"]
    for name, (cpu, wall, n) in sorted(by_file.items(), key=lambda kv: -kv[1][0]):
        lines.append(f"{cpu:8.1f} {wall:8.1f} {n:5d}  {name}")
    # When each xdist worker ran out of tests: a worker that ends long before
    # the last one left a core idle at the session's end.
    timed = [r for r in rows if "start" in r]
    if timed:
        first = min(r["start"] for r in timed)
        ends: dict[str, float] = {}
        for r in timed:
            ends[r["worker"]] = max(ends.get(r["worker"], 0.0), r["start"] + r["wall_s"] - first)
        lines += ["", "each worker's last test ended (s after the first began): " +
                  ", ".join(f"{w} {end:.0f}" for w, end in sorted(ends.items(), key=lambda kv: kv[1]))]
    lines += ["", f"the {top} largest tests: CPU s, wall s"]
    for r in sorted(rows, key=lambda r: -r["cpu_s"])[:top]:
        lines.append(f"{r['cpu_s']:8.1f} {r['wall_s']:8.1f}  {r['test']}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 40))
