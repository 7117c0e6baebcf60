"""The op counters (csrc/op_stats.h) and edge meters (csrc/edge_meter.h) as an
operator reads them: rcoll.stats() in the job, a Prometheus scrape of
RCOLL_METRICS_PORT (plain HTTP GET) that matches it, and the JSON file
RCOLL_STATS_FILE leaves at exit; the numpy API under a launcher's
environment (over TCP), every process's exit and stderr checked."""
from __future__ import annotations

import json

from support.launch import free_port, run_ranks, write_script

JOB = """
import json, urllib.request
import numpy as np
import rcoll
from rcoll import _stats

comm = rcoll.init()
for _ in range(5):
    comm.allreduce(np.ones(1000, np.float32))
for _ in range(2):
    comm.allgather(np.ones(10, np.int64))
comm.allreduce(np.ones(1 << 20, np.float32))  # large enough to be metered on its edges
text = urllib.request.urlopen(f"http://{_stats.metrics_address()}/metrics", timeout=10).read().decode()
scraped = {}
for line in text.splitlines():
    if line.startswith("rcoll_ops_total{"):
        labels, value = line[len("rcoll_ops_total{"):].rsplit("} ", 1)
        fields = dict(part.split("=", 1) for part in labels.split('",'))
        scraped[fields["op"].strip('"')] = scraped.get(fields["op"].strip('"'), 0) + float(value)
    if line.startswith("rcoll_edge_bytes_total{"):
        scraped["edge bytes"] = scraped.get("edge bytes", 0) + float(line.rsplit(" ", 1)[1])
snapshot = rcoll.stats()
counted = {"edge bytes": float(sum(e["bytes"] for e in snapshot["edges"]))}
for row in snapshot["ops"]:
    counted[row["op"]] = counted.get(row["op"], 0) + row["count"]
print("EDGES", json.dumps(snapshot["edges"]), flush=True)
print("SCRAPED", json.dumps(scraped, sort_keys=True), flush=True)
print("COUNTED", json.dumps(counted, sort_keys=True), flush=True)
print("TYPES", "# TYPE rcoll_ops_total counter" in text and "# TYPE rcoll_op_busbw_gbps gauge" in text, flush=True)
comm.shutdown()
"""


def test_a_prometheus_scrape_matches_stats_and_the_exit_file_has_them(tmp_path):
    script = write_script(tmp_path, JOB)
    port, metrics = str(free_port()), free_port()
    outs = run_ranks(script, [{"RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                               "RCOLL_METRICS_PORT": str(metrics), "RCOLL_SOCKET_IFNAME": "lo",
                               "RCOLL_TRANSPORT": "tcp",
                               "RCOLL_STATS_FILE": str(tmp_path / "stats.{rank}.json")} for r in range(2)])
    for out in outs:
        scraped = json.loads(out.split("SCRAPED ", 1)[1].splitlines()[0])
        counted = json.loads(out.split("COUNTED ", 1)[1].splitlines()[0])
        assert scraped == counted and counted["allreduce"] == 6 and counted["allgather"] == 2, out
        edges = json.loads(out.split("EDGES ", 1)[1].splitlines()[0])
        # Two ranks over TCP: the one edge into this rank, measured as it received.
        assert [(e["transport"], e["bytes"] > 0, e["seconds"] > 0) for e in edges] == [("tcp", True, True)], out
        assert "TYPES True" in out, out
    for rank in range(2):
        written = json.loads((tmp_path / f"stats.{rank}.json").read_text())
        assert written["rank"] == rank
        rows = written["ops"]
        allreduce = [r for r in rows if r["op"] == "allreduce"]
        assert sum(r["count"] for r in allreduce) == 6, rows
        assert sum(r["bytes"] for r in allreduce) == 5 * 4000 + (4 << 20), rows
        assert written["edges"] and written["edges"][0]["dst"] == rank, written
        allgather = [r for r in rows if r["op"] == "allgather"]
        assert sum(r["bytes"] for r in allgather) == 2 * 10 * 8 * 2, rows  # nccl-tests' size: the whole output
        assert all(r["seconds"] > 0 and r["busbw_gbps"] > 0 and r["errors"] == 0 for r in allreduce), rows
