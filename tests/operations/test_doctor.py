"""`python -m rcoll doctor` on emulated hosts (network namespaces, each
host's link shaped with tbf), started as a launcher starts a job: one host's
link at a tenth of the others' rate, and the doctor names exactly the edges
through it."""
from __future__ import annotations

import pytest
from support.emulated_hosts import Hosts, finish_ranks, needs_netns, shape, start_ranks
from support.launch import FATAL

DOCTOR = """
import sys
from rcoll.__main__ import main
sys.exit(main(["doctor", "--bytes", str(1 << 20), "--iters", "4"]))
"""


@needs_netns()
@pytest.mark.timeout(240)
def test_the_doctor_names_the_edges_of_a_slow_link(tmp_path):
    script = tmp_path / "doctor_job.py"
    script.write_text(DOCTOR)
    with Hosts(4, rate="1gbit", tag="doctor", subnet="198.18.41") as hosts:
        slow = 3
        shape(hosts.spaces[slow], "eth0", "100mbit")  # a tenth, both ways
        shape(*hosts.far_end(slow), "100mbit")
        outcomes = finish_ranks(start_ranks(hosts, 1, script, hosts.addrs[0],
                                            env={"RCOLL_CONNECT_TIMEOUT": "30"}), timeout=180)
    for rank, (code, out, err) in enumerate(outcomes):
        assert not FATAL.search(err) and not err.strip(), f"rank {rank}: {err[-3000:]}"
        assert code == (1 if rank == 0 else 0), f"rank {rank} exited {code}: {out}{err[-2000:]}"
    report = outcomes[0][1]
    print(report)
    rows = {line.split()[0]: line for line in report.splitlines()[2:-1]}
    assert set(rows) == {f"{a}-{b}" for a in range(4) for b in range(a + 1, 4)}, report
    # Bandwidth only: latency flags depend on how busy this machine is.
    for edge, line in rows.items():
        through_slow = str(slow) in edge.split("-")
        assert ("SLOW" in line) == through_slow, report
        assert "tcp (hosts" in line, report
    assert "edges fall short" in report.splitlines()[-1], report
