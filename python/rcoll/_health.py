"""Which rank is slow and which link is bad, from the statuses the ranks
publish (python/rcoll/_watch.py); rank 0's watch runs this every round and
publishes the result (docs/operations.md, "A slow job").

Stragglers. In a collective without a root every rank leaves at about the
same time (when the last one has arrived and the data has moved), so the
time a rank waited in it, from its call to the end, is shorter by how much
later it came. Comparing waits needs no clock shared between hosts. For
each rank, per collective, its lateness is the median of the other ranks'
waits minus its own; a rank whose median lateness over the last collectives
the ranks share is at least RCOLL_STRAGGLER_MS, and which came last in at
least half of them, is a straggler.

Slow links. Each rank's transports meter their large transfers per edge
(csrc/edge_meter.h); each rank publishes what they carried lately
(EdgeWindow: the last rounds, up to 30 s). An edge between two hosts whose rate is below the median of
the other such edges of its transport divided by RCOLL_SLOW_LINK_RATIO is
slow.

Either finding counts once it held in two rounds in a row (Judge).
"""
from __future__ import annotations

import collections
import statistics
from typing import Dict, List, Optional, Tuple

MIN_SHARED_OPS = 8               # collectives every member of a group reported
MIN_EDGE_BYTES = 8 << 20         # what an edge must have carried in the window to be judged
MIN_OTHER_EDGES = 2              # edges of the same transport to compare with


def lateness(statuses: Dict[int, dict], margin_ms: float) -> dict:
    """{"ranks": {group: {"rank": median lateness in ms}}, "stragglers": [...]}
    from each rank's ``arrivals`` ({group name: [[seq, wait ms, outside ms or
    None], ...]}; outside: from the end of the group's previous collective to
    this call, the time the rank spent elsewhere)."""
    members: Dict[str, Dict[int, Dict[int, tuple]]] = {}
    for rank, status in statuses.items():
        for group, arrivals in (status or {}).get("arrivals", {}).items():
            members.setdefault(group, {})[rank] = {int(a[0]): (float(a[1]), a[2]) for a in arrivals}
    ranks: Dict[str, Dict[int, float]] = {}
    stragglers: List[dict] = []
    for group, seen in sorted(members.items()):
        if len(seen) < 2:
            continue
        shared = set.intersection(*(set(w) for w in seen.values()))
        if len(shared) < MIN_SHARED_OPS:
            continue
        seqs = sorted(shared)[-64:]
        late: Dict[int, List[float]] = {r: [] for r in seen}
        away: Dict[int, List[float]] = {r: [] for r in seen}  # outside time beyond the others' median
        last = {r: 0 for r in seen}
        for seq in seqs:
            waits = {r: seen[r][seq][0] for r in seen}
            shortest = min(waits.values())
            latest = [r for r, w in waits.items() if w == shortest]
            if len(latest) == 1:
                last[latest[0]] += 1
            outside = {r: seen[r][seq][1] for r in seen}
            for r, w in waits.items():
                late[r].append(statistics.median(v for q, v in waits.items() if q != r) - w)
                others = [v for q, v in outside.items() if q != r and v is not None]
                if outside[r] is not None and others:
                    away[r].append(max(outside[r], 0.0) - statistics.median(max(v, 0.0) for v in others))
        medians = {r: round(statistics.median(v), 3) for r, v in late.items()}
        ranks[group] = {str(r): ms for r, ms in medians.items()}  # as JSON has them, on every rank alike
        for r, ms in medians.items():
            # Late, last in at least half, and because it spent longer outside
            # the collectives (its own work), not because the one before ended
            # later for it (a slow link into it).
            extra = statistics.median(away[r]) if away[r] else 0.0
            if ms >= margin_ms and 2 * last[r] >= len(seqs) and extra >= margin_ms / 2:
                stragglers.append({"group": group, "rank": r, "late_ms": ms, "away_ms": round(extra, 3),
                                   "last": last[r], "ops": len(seqs), "host": statuses[r].get("host", "?")})
    return {"ranks": ranks, "stragglers": stragglers}


def edge_rates(statuses: Dict[int, dict]) -> List[dict]:
    """Every edge some rank metered: src, dst, transport, bytes, seconds and
    rate (bytes/s) over the publishing rank's window."""
    edges: Dict[tuple, List[float]] = {}
    for rank, status in statuses.items():
        for e in (status or {}).get("edges", []):
            src, dst = (e["peer"], rank) if e["direction"] == "in" else (rank, e["peer"])
            totals = edges.setdefault((src, dst, e["transport"]), [0, 0.0])
            totals[0] += e["bytes"]
            totals[1] += e["seconds"]
    return [{"src": s, "dst": d, "transport": t, "bytes": b, "seconds": sec, "rate": b / sec if sec > 0 else 0.0}
            for (s, d, t), (b, sec) in sorted(edges.items())]


def slow_edges(edges: List[dict], ratio: float, statuses: Optional[Dict[int, dict]] = None) -> List[dict]:
    hosts = statuses or {}

    def host(rank):
        return (hosts.get(rank) or {}).get("host", "?")

    # An edge inside one host (loopback) is as slow as its CPUs, not a link.
    judged = [e for e in edges if e["bytes"] >= MIN_EDGE_BYTES and e["seconds"] > 0
              and (host(e["src"]) != host(e["dst"]) or host(e["src"]) == "?")]
    slow = []
    for e in judged:
        others = [o["rate"] for o in judged if o is not e and o["transport"] == e["transport"]]
        if len(others) < MIN_OTHER_EDGES:
            continue
        typical = statistics.median(others)
        if e["rate"] * ratio < typical:
            slow.append({**e, "typical": typical, "src_host": host(e["src"]), "dst_host": host(e["dst"])})
    return slow


def judge(statuses: Dict[int, dict], margin_ms: float, ratio: float) -> dict:
    """One round's findings from every rank's status."""
    found = lateness(statuses, margin_ms)
    edges = edge_rates(statuses)
    return {"lateness_ms": found["ranks"], "stragglers": found["stragglers"],
            "slow_edges": slow_edges(edges, ratio, statuses), "edges": len(edges)}


def straggler_key(s: dict) -> tuple:
    return ("straggler", s["group"], s["rank"])


def edge_key(e: dict) -> tuple:
    return ("edge", e["src"], e["dst"], e["transport"])


class Judge:
    """Rank 0's judgement over the rounds: a finding counts once it held in
    CONFIRM_ROUNDS rounds in a row (one round's burst of noise names no one),
    and is said (one WARN) when it first counts and again every WARN_AGAIN_S
    while it lasts."""

    CONFIRM_ROUNDS = 2
    WARN_AGAIN_S = 300.0

    def __init__(self, margin_ms: float, ratio: float):
        self.margin_ms = margin_ms
        self.ratio = ratio
        self._streak: Dict[tuple, int] = {}
        self._warned: Dict[tuple, float] = {}

    def round(self, statuses: Dict[int, dict], now: float) -> Tuple[dict, List[str]]:
        """The job's health (what rank 0 publishes) and the WARN lines due."""
        health = judge(statuses, self.margin_ms, self.ratio)
        found = [(straggler_key(s), s, describe_straggler) for s in health["stragglers"]]
        found += [(edge_key(e), e, describe_slow_edge) for e in health["slow_edges"]]
        self._streak = {key: self._streak.get(key, 0) + 1 for key, _, _ in found}
        confirmed = [(key, item, describe) for key, item, describe in found
                     if self._streak[key] >= self.CONFIRM_ROUNDS]
        health["stragglers"] = [item for key, item, _ in confirmed if key[0] == "straggler"]
        health["slow_edges"] = [item for key, item, _ in confirmed if key[0] == "edge"]
        warnings = []
        for key, item, describe in confirmed:
            if now - self._warned.get(key, -self.WARN_AGAIN_S) >= self.WARN_AGAIN_S:
                self._warned[key] = now
                warnings.append(describe(item))
        return health, warnings


class EdgeWindow:
    """What each edge carried lately, from the transports' running totals (one
    sample per watch round): over the shortest span back to a round's sample
    in which it carried at least 2 x MIN_EDGE_BYTES, at most WINDOW_S. A busy
    edge's rate then follows a link that degrades within a round or two; a
    quiet one's gathers bytes over the whole window."""

    WINDOW_S = 30.0

    def __init__(self, now: float):
        self._history = collections.deque([(now, {})])

    def update(self, totals: Dict[tuple, list], now: float) -> List[dict]:
        """`totals`: {(peer, direction, transport): [bytes, seconds]} so far;
        returns the edges that carried anything in their span."""
        history = self._history
        while len(history) > 1 and now - history[1][0] >= self.WINDOW_S:
            history.popleft()
        edges = []
        for key, (total_bytes, seconds) in sorted(totals.items()):
            old_bytes, old_seconds = 0, 0.0
            for _, then in reversed(history):  # newest first
                old_bytes, old_seconds = then.get(key, (0, 0.0))
                if total_bytes - old_bytes >= 2 * MIN_EDGE_BYTES:
                    break
            if total_bytes > old_bytes:
                edges.append({"peer": key[0], "direction": key[1], "transport": key[2],
                              "bytes": total_bytes - old_bytes, "seconds": round(seconds - old_seconds, 6)})
        history.append((now, totals))
        return edges


def _rate(bytes_per_s: float) -> str:
    return f"{bytes_per_s / 1e6:.1f} MB/s"


def describe_straggler(s: dict) -> str:
    return (f"rank {s['rank']} (host {s['host']}) is a straggler in group {s['group']}: it reaches collectives "
            f"{s['late_ms']:.0f} ms after the other ranks (median of the last {s['ops']}), and came last in "
            f"{s['last']} of them")


def describe_slow_edge(e: dict) -> str:
    return (f"the link from rank {e['src']} (host {e['src_host']}) to rank {e['dst']} (host {e['dst_host']}) over "
            f"{e['transport']} carries {_rate(e['rate'])}, {e['typical'] / e['rate']:.0f}x below the median of the "
            f"other {e['transport']} edges ({_rate(e['typical'])}; {e['bytes'] / 2**20:.0f} MiB in "
            f"{e['seconds']:.1f} s of transfers)")
