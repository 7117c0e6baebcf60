"""``python -m rcoll status``: every rank of a running job, from the status
each process publishes on the job's store (python/rcoll/_watch.py), so it
needs nothing on the job's hosts but the store's address.

For each rank: host, pid, the op it is in and for how long, the ranks that op
waits for (the ones that have not reached it), how many ops it is behind the
furthest rank, its last error; a rank whose status stopped coming (stopped,
crashed, or stuck outside rcoll with the GIL held) is named with its last
known op. Then what rank 0's watch found (_health.py): how late each rank
arrives at collectives, the stragglers and the slow links.
"""
from __future__ import annotations

import json
import time
from typing import Dict, List, Optional, Tuple

from . import _health
from ._watch import JOB_KEY, _Store, job_keys


def connect(address: str, timeout: float = 10.0) -> _Store:
    """`address`: torch://host:port (torchrun's or torch's TCPStore), rcoll://host:port
    (rcoll's own store: the numpy API under mpirun, srun or its own ranks)."""
    kind, _, rest = address.rpartition("://")
    host, _, port = rest.rpartition(":")
    host = host.strip("[]")
    if kind not in ("torch", "rcoll"):
        raise ValueError(f"--store {address!r}: give torch://HOST:PORT or rcoll://HOST:PORT")
    if kind == "torch":
        from datetime import timedelta

        import torch.distributed as dist

        return _Store(dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=timeout),
                                    wait_for_workers=False))
    from . import _core

    return _Store(_core.TcpStore(host, int(port), timeout))


def read(reader: _Store, world: Optional[int] = None, job: Optional[str] = None) -> Tuple[Dict[int, dict], dict]:
    """Every rank's status, and the job's health ({} before rank 0's first round)."""
    if job is None:
        raw = reader.get(JOB_KEY)
        if raw is None:
            raise RuntimeError("no rcoll job has published its status on this store (rank 0 writes "
                               f"{JOB_KEY!r} within RCOLL_WATCH_INTERVAL of its start)")
        job = raw.decode()
    keys = job_keys(job)
    if world is None:
        raw = reader.get(keys["world"])
        if raw is None:
            raise RuntimeError(f"job {job!r} has published no status on this store")
        world = int(raw)
    statuses = {}
    for rank in range(world):
        raw = reader.get(keys["status"] + str(rank))
        statuses[rank] = json.loads(raw) if raw else None
    raw = reader.get(keys["health"])
    return statuses, (json.loads(raw) if raw else {})


def _describe(op: dict) -> str:
    if op["op"] in ("send", "recv"):
        return f"{op['op']} {'to' if op['op'] == 'send' else 'from'} rank {op['root']} ({op['dtype']} x {op['count']})"
    root = f", root {op['root']}" if op["root"] >= 0 else ""
    return f"{op['op']} #{op['seq']} ({op['dtype']} x {op['count']}{root})"


def report(statuses: Dict[int, Optional[dict]], now: Optional[float] = None,
           health: Optional[dict] = None) -> List[str]:
    """The table's lines (and a summary line first)."""
    now = time.time() if now is None else now
    seen = {r: s for r, s in statuses.items() if s}
    # The group every rank reports on (the job's first communicator).
    # The first group (by id: made in the same order on every rank) that
    # every rank reports on: the job's default group.
    group = 0 if seen and all(s["last_completed"] for s in seen.values()) else None

    def reached(status: dict) -> int:
        """The furthest collective of `group` this rank has called."""
        best = status["last_completed"][group] if group is not None else -1
        for op in status["pending"]:
            if op["group"] == group and op["op"] not in ("send", "recv"):
                best = max(best, op["seq"])
        return best

    furthest = max((reached(s) for s in seen.values()), default=-1)
    stale = {r for r, s in seen.items() if now - s["time"] > 2 * s["interval"] + 2}
    missing = {r for r, s in statuses.items() if not s}
    lines = [f"{len(statuses)} ranks; {len(stale) + len(missing)} not reporting"
             + (f" (ranks {sorted(stale | missing)})" if stale or missing else "")]
    header = f"{'rank':>4}  {'host':<16} {'pid':>7}  {'state':<34} {'waited':>8}  {'behind':>6}  waits for / note"
    lines.append(header)
    for rank in sorted(statuses):
        s = statuses[rank]
        if not s:
            lines.append(f"{rank:>4}  {'?':<16} {'?':>7}  {'no status published':<34} {'':>8}  {'':>6}")
            continue
        pending = [op for op in s["pending"] if op["state"] == "started"] or s["pending"]
        current = pending[0] if pending else None
        state = _describe(current) if current else "idle"
        waited = ""
        note = ""
        if current:
            since = (current["started_ns"] or current["created_ns"]) / 1e9
            waited = f"{s['time'] - since + (now - s['time'] if rank not in stale else 0):.1f} s"
            if current["group"] == group and current["op"] not in ("send", "recv"):
                late = sorted(r for r, o in seen.items() if r != rank and reached(o) < current["seq"])
                late += sorted(r for r in missing)
                note = f"ranks {late}" if late else "(every rank is in it)"
        if rank in stale:
            note = (f"NO STATUS FOR {now - s['time']:.0f} s: stopped, dead or stuck outside rcoll; "
                    f"last seen {('in ' + state) if current else 'idle'}")
        behind = furthest - reached(s)
        if s.get("errors"):
            note += f"  last error: {s['errors'][-1][:200]}"
        lines.append(f"{rank:>4}  {s['host'][:16]:<16} {s['pid']:>7}  {state[:34]:<34} {waited:>8}  "
                     f"{behind if behind > 0 else '':>6}  {note}")
    return lines + health_report(health or {})


def health_report(health: dict) -> List[str]:
    """What rank 0's watch found: lateness per rank, stragglers, slow links."""
    if not health:
        return []
    age = time.time() - health.get("time", time.time())
    lines = ["", f"rank 0's judgement of {age:.0f} s ago (python/rcoll/_health.py):"]
    for group, ranks in sorted(health.get("lateness_ms", {}).items()):
        cells = ", ".join(f"{r}: {ms:+.0f}" for r, ms in sorted(ranks.items(), key=lambda kv: int(kv[0])))
        lines.append(f"group {group}: how late each rank reaches collectives, ms (median): {cells}")
    stragglers = health.get("stragglers", [])
    slow = health.get("slow_edges", [])
    lines += [f"STRAGGLER: {_health.describe_straggler(s)}" for s in stragglers]
    lines += [f"SLOW LINK: {_health.describe_slow_edge(e)}" for e in slow]
    if not stragglers and not slow:
        lines.append(f"no straggler, no slow link (of {health.get('edges', 0)} edges metered)")
    return lines


def main(args) -> int:
    reader = connect(args.store, args.timeout)
    deadline = time.time() + args.wait
    while True:
        try:
            statuses, health = read(reader, args.world, args.job)
            break
        except RuntimeError:
            if time.time() >= deadline:
                raise
            time.sleep(0.5)
    print("\n".join(report(statuses, health=health)))
    return 0
