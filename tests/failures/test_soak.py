"""The soak (scripts/soak.py) in its reduced CI form: world 3, 3000 small and 20
large ops of every kind, every result exact, open descriptors flat and RSS
within the bound."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest
from support.paths import ROOT

SCRIPT = os.path.join(ROOT, "scripts", "soak.py")

KINDS = {"allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "gather", "scatter", "alltoall",
         "barrier", "send", "recv"}


def _load_soak():
    spec = importlib.util.spec_from_file_location("soak", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # a reduced soak: many jobs in a row
def test_soak_reduced(tmp_path, capsys):
    out = tmp_path / "soak.json"
    cmd = [sys.executable, SCRIPT, "--world", "3", "--small-ops", "3000", "--large-ops", "20", "--seed", "7",
           "--json", str(out), "--timeout", "200", "--op-timeout", "60"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=260)
    report = json.loads(out.read_text()) if out.exists() else None
    assert proc.returncode == 0 and report is not None, f"{proc.stdout}\n{proc.stderr[-4000:]}"
    summary = report["summary"]
    with capsys.disabled():
        print(f"\nsoak: {summary['ops']} ops at world {summary['world']} in {summary['elapsed_s']:.1f} s "
              f"({summary['ops_per_s']:.0f} ops/s), {summary['wrong']} wrong, RSS MiB {summary['rss_start_mib']} -> "
              f"{summary['rss_end_mib']}, fds {summary['fds_start']} -> {summary['fds_end']}")
    assert report["ok"] and report["failures"] == [], report["failures"]
    assert summary["wrong"] == 0
    assert len(report["ranks"]) == 3
    for rank in report["ranks"]:
        assert rank["ops"] == 3020 and rank["wrong"] == 0, rank["wrong_examples"]
        assert set(rank["ops_per_kind"]) == KINDS, rank["ops_per_kind"]
        assert rank["end"]["fds"] == rank["start"]["fds"], (rank["start"]["fd_targets"], rank["end"]["fd_targets"])
        assert rank["end"]["rss_kib"] <= rank["start"]["rss_kib"] * 1.10 + 16 * 1024, (rank["start"], rank["end"])
        assert rank["bytes_large"] >= 20 * (256 << 10)


def _report(wrong=0, rss=(100_000, 101_000), fds=(20, 20)):
    snap = lambda r, f: {"rss_kib": r, "fds": f, "threads": 4, "hwm_kib": r, "fd_targets": {}}  # noqa: E731
    return {"rank": 0, "ops": 10, "calls": 10, "ops_per_kind": {"allreduce": 10}, "wrong": wrong,
            "wrong_examples": ["op #3 ..."] * wrong, "elapsed_s": 1.0, "bytes_large": 0,
            "start": snap(rss[0], fds[0]), "end": snap(rss[1], fds[1])}


def test_soak_verdicts():
    """What makes a soak fail: a wrong result, a rank's error, RSS over the bound, a descriptor more or less."""
    soak = _load_soak()
    cfg = {"world": 2, "seed": 1, "small_ops": 10, "large_ops": 0, "rss_slack": 0.10, "rss_slack_mib": 16}

    def failures(*reports):
        return soak.evaluate(list(reports), cfg)[2]

    assert failures(_report(), _report()) == []
    assert failures(_report(rss=(100_000, 110_000 + 16 * 1024)), _report()) == []
    assert "2 wrong results" in failures(_report(wrong=2), _report())[0]
    assert "RSS grew" in failures(_report(), _report(rss=(100_000, 110_000 + 16 * 1024 + 1)))[0]
    assert "descriptors went from 20 to 21" in failures(_report(fds=(20, 21)), _report())[0]
    assert "descriptors went from 20 to 19" in failures(_report(), _report(fds=(20, 19)))[0]
    assert "rank 1 failed: boom" in failures(_report(), ("error", "boom\ntraceback"))[0]
