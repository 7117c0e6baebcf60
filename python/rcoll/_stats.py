"""The core's op counters (csrc/op_stats.h) for operators: rcoll.stats(), a
JSON file at exit (RCOLL_STATS_FILE) and Prometheus' text format over HTTP
(RCOLL_METRICS_PORT). docs/operations.md."""
from __future__ import annotations

import atexit
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Optional

from . import _core


def stats() -> dict:
    """This process's counters and what the job's watch knows:
      ops: one dict per op, algorithm and path: op, algorithm, path, count,
        errors, bytes (nccl-tests' size, summed), seconds, algbw_gbps and
        busbw_gbps (GB/s over the ops' own time);
      edges: this rank's edges in the job's world (csrc/edge_meter.h): src,
        dst, transport, bytes and seconds of its large transfers, rate (bytes/s);
      health: rank 0's latest judgement of the job (_health.py): lateness_ms
        per group and rank, stragglers, slow_edges ({} until its first round)."""
    from . import _watch

    return {"rank": _RANK, "ops": _core.stats(), "edges": _watch.edges(), "health": _watch.health()}


def _label(value) -> str:
    return str(value).replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def prometheus_text(rank: int) -> str:
    """The counters in Prometheus' text exposition format (version 0.0.4)."""
    metrics = (("rcoll_ops_total", "counter", "ops that finished", "count"),
               ("rcoll_op_errors_total", "counter", "ops that failed", "errors"),
               ("rcoll_op_bytes_total", "counter", "bytes of the ops that finished (nccl-tests' size)", "bytes"),
               ("rcoll_op_seconds_total", "counter", "seconds the ops that finished took", "seconds"),
               ("rcoll_op_busbw_gbps", "gauge", "bus bandwidth over the ops' time, GB/s", "busbw_gbps"))
    snapshot = stats()
    lines = []
    for name, kind, meaning, field in metrics:
        lines += [f"# HELP {name} {meaning}", f"# TYPE {name} {kind}"]
        for r in snapshot["ops"]:
            labels = (f'rank="{rank}",op="{_label(r["op"])}",algorithm="{_label(r["algorithm"])}",'
                      f'path="{_label(r["path"])}"')
            lines.append(f"{name}{{{labels}}} {r[field]}")
    edge_metrics = (("rcoll_edge_bytes_total", "counter", "bytes of the large transfers over an edge", "bytes"),
                    ("rcoll_edge_seconds_total", "counter", "seconds those transfers were on the way", "seconds"))
    for name, kind, meaning, field in edge_metrics:
        lines += [f"# HELP {name} {meaning}", f"# TYPE {name} {kind}"]
        for e in snapshot["edges"]:
            labels = f'rank="{rank}",src="{e["src"]}",dst="{e["dst"]}",transport="{_label(e["transport"])}"'
            lines.append(f"{name}{{{labels}}} {e[field]}")
    lateness = snapshot["health"].get("lateness_ms", {})
    lines += ["# HELP rcoll_rank_lateness_seconds how late a rank reaches collectives (median), as rank 0 judged",
              "# TYPE rcoll_rank_lateness_seconds gauge"]
    for group, ranks in sorted(lateness.items()):
        for r, ms in sorted(ranks.items(), key=lambda kv: int(kv[0])):
            lines.append(f'rcoll_rank_lateness_seconds{{group="{_label(group)}",of_rank="{r}"}} {ms / 1000}')
    return "\n".join(lines) + "\n"


class _Metrics(BaseHTTPRequestHandler):
    rank = 0

    def do_GET(self):  # noqa: N802 (http.server's name)
        if self.path.split("?")[0] not in ("/metrics", "/"):
            self.send_error(404)
            return
        body = prometheus_text(self.rank).encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # no access log on the job's stderr
        pass


_SERVER: Optional[ThreadingHTTPServer] = None
_STATS_FILE: Optional[str] = None
_RANK = 0
_LOCK = threading.Lock()


def start(rank: int, local_rank: int) -> None:
    """At a process's first communicator: the metrics server and the exit
    file, as RCOLL_METRICS_PORT and RCOLL_STATS_FILE ask."""
    global _SERVER, _STATS_FILE, _RANK
    settings = _core.settings()
    with _LOCK:
        _RANK = rank
        if settings["stats_file"] and _STATS_FILE is None:
            _STATS_FILE = settings["stats_file"].replace("{rank}", str(rank))
            atexit.register(_write_file)
        port = settings["metrics_port"]
        if port and _SERVER is None:
            host = _data_address()
            handler = type("Metrics", (_Metrics,), {"rank": rank})
            server_class = ThreadingHTTPServer
            if ":" in host:
                server_class = type("Metrics6", (ThreadingHTTPServer,), {"address_family": socket.AF_INET6})
            _SERVER = server_class((host, port + local_rank), handler)
            _SERVER.daemon_threads = True
            threading.Thread(target=_SERVER.serve_forever, name="rcoll-metrics", daemon=True).start()
            atexit.register(_SERVER.shutdown)


def metrics_address() -> Optional[str]:
    """host:port the metrics are served on, None when they are not."""
    if _SERVER is None:
        return None
    host, port = _SERVER.server_address[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _data_address() -> str:
    """The address of the first interface the job's data goes through
    (link-local IPv6 ones need a scope: left out)."""
    for entry in _core.data_interfaces()["chosen"]:
        address = entry.split()[1].split("/")[0]
        if not address.lower().startswith("fe80"):
            return address
    return "127.0.0.1"


def _write_file() -> None:
    with open(_STATS_FILE, "w") as f:
        json.dump(stats(), f, indent=1)
