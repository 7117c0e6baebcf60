"""`python -m rcoll bench`, the sweep users run on their own fabric from an
installed package: run as users run it (a subprocess, outside the checkout),
every backend's results checked by the ranks (#wrong), the JSON complete, and
a wrong element is counted (the command then exits 1)."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from rcoll.bench.check import count_wrong, expected

SMALL = ["--ops", "allreduce,allgather,broadcast,reduce_scatter", "-b", "4", "-e", "64K", "-f", "16",
         "--iters", "3", "--warmup", "1", "--world", "3", "--timeout", "240"]


def run_bench(args, tmp_path):
    return subprocess.run([sys.executable, "-m", "rcoll", "bench", *args], cwd=tmp_path, capture_output=True,
                          text=True, timeout=400, env=dict(os.environ, PYTHONUNBUFFERED="1"))


@pytest.mark.slow  # a full bench sweep beside Gloo
@pytest.mark.timeout(450)
def test_bench_runs_every_backend_and_checks_every_result(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "sweep.json"
    proc = run_bench([*SMALL, "--backends", "rcoll,torch-rcoll,gloo", "--json", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-6000:]
    doc = json.loads(out.read_text())
    assert doc["errors"] == {} and doc["world"] == 3
    assert set(doc["results"]) == {"rcoll", "torch-rcoll", "gloo"}
    for backend, rows in doc["results"].items():
        done = {(r["op"], r["bytes"]) for r in rows if "time_us" in r}
        # every op at every size that fits the world (4 B is one float: too small to split 3 ways)
        assert len({op for op, _ in done}) == 4, (backend, rows)
        assert all(r["wrong"] == 0 and r["time_us"] > 0 for r in rows if "time_us" in r), (backend, rows)
    # the progress line on stderr, the nccl-tests table (with #wrong) on stdout
    assert "[rcoll world 3 " in proc.stderr and "[gloo world 3 " in proc.stderr
    assert "#wrong" in proc.stdout and "busbw" in proc.stdout


def test_bench_without_torch_backends_runs_rcoll(tmp_path):
    proc = run_bench(["--ops", "allreduce", "-b", "1K", "-e", "1K", "--iters", "2", "--world", "2",
                      "--backends", "rcoll"], tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "allreduce" in proc.stdout


def test_bench_rejects_bad_arguments(tmp_path):
    proc = run_bench(["--ops", "allreduce,nonsense"], tmp_path)
    assert proc.returncode == 2 and "unknown ops ['nonsense']" in proc.stderr


def test_a_wrong_element_is_counted():
    want = expected("allreduce", 0, 2, 100, 100)
    got = want.astype(np.float64).copy()
    assert count_wrong(got, want) == 0
    got[[3, 97]] += 1
    assert count_wrong(got, want) == 2
