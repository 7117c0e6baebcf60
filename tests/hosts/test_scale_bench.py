"""bench/scale.py, the start-up harness behind docs/scale.md: 64 ranks as
threads of worker processes, on emulated hosts of 1 and 8 ranks, every rank's
first allreduce checked and every worker clean. Correctness only: the times
it reports are for the docs, never asserted."""
import json
import os
import subprocess
import sys

import pytest
from support.paths import ROOT

import rcoll

pytestmark = pytest.mark.slow  # 128 ranks' start-up in all


@pytest.mark.timeout(300)
def test_64_ranks_start_and_allreduce_correctly(tmp_path):
    out = tmp_path / "scale.json"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (os.path.dirname(os.path.dirname(rcoll.__file__)), os.environ.get("PYTHONPATH")) if p))
    env.pop("RCOLL_DEBUG", None)
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "scale.py"), "--ranks", "64",
                           "--ranks-per-host", "1,8", "--timeout", "120", "--json", str(out)],
                          env=env, capture_output=True, text=True, timeout=280)
    assert proc.returncode == 0 and proc.stderr == "", (proc.stdout, proc.stderr)
    results = json.loads(out.read_text())["results"]
    assert [(r["world"], r["ranks_per_host"]) for r in results] == [(64, 1), (64, 8)]
    for r in results:
        assert r["correct"] and r["errors"] == [], r
        # Connections on first use (docs/scale.md): a rank connects at start-up
        # to the peers its collectives always use, O(log P + local ranks), not
        # to all 63 twice: the ring's two neighbours and its host's ranks at
        # least, about 2 log2(P) + L + 3 in all (listeners and the store included).
        local = r["ranks_per_host"]
        assert 2 + (local - 1) <= r["sockets_per_rank"] <= 2 * 6 + local + 8, r
