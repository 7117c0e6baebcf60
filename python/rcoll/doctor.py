"""``python -m rcoll doctor``, started by a launcher like the job it checks
(torchrun, mpirun, srun, or RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT): every
edge the job's ranks will use, checked one pair at a time, as nccl-tests and
NCCL's start-up diagnostics do for a new cluster.

For each pair of ranks: the transport rcoll picked for it and why, the
best round trip of a one-element message (halved), the bandwidth each way of
`--bytes` messages, and the MTU of each end's data interface. Rank 0 prints
the table; an edge whose bandwidth is under `--threshold` of the median of
the edges of its transport, or whose latency is over 1/threshold of theirs,
is named (exit status 1 when any is).

Pairs are scheduled in rounds (the circle method): every rank is in at most
one pair per round, so a round's pairs do not share a rank, and pairs on
different hosts' links run side by side.
"""
from __future__ import annotations

import statistics
import time
from typing import List, Optional, Tuple

import numpy as np

LAT_ITERS = 20
TRANSPORTS = ["self", "shm", "tcp", "ib"]


def rounds(world: int) -> List[List[Tuple[int, int]]]:
    """Round-robin pairings (circle method): each pair of ranks exactly once."""
    n = world + (world % 2)
    ranks = list(range(n))
    schedule = []
    for _ in range(n - 1):
        pairs = [(ranks[i], ranks[n - 1 - i]) for i in range(n // 2)]
        schedule.append([(min(a, b), max(a, b)) for a, b in pairs if a < world and b < world])
        ranks = [ranks[0], ranks[-1], *ranks[1:-1]]
    return schedule


def _mtu() -> int:
    from . import _core

    for entry in _core.data_interfaces()["chosen"]:
        name = entry.split()[0]
        try:
            with open(f"/sys/class/net/{name}/mtu") as f:
                return int(f.read())
        except OSError:
            continue
    return 0


def _measure(comm, peer: int, first: bool, nbytes: int, iters: int) -> Tuple[float, float, float]:
    """(latency in us, bandwidth to peer, bandwidth from peer, in GB/s): the
    lower rank of the pair leads."""
    one = np.zeros(1, np.float32)
    big = np.zeros(max(1, nbytes // 4), np.float32)
    # Latency: ping-pong, half the round trip.
    if first:
        comm.send(one, peer)
        comm.recv(one, peer)
        trips = []
        for _ in range(LAT_ITERS):
            t = time.perf_counter()
            comm.send(one, peer)
            comm.recv(one, peer)
            trips.append(time.perf_counter() - t)
        latency = min(trips) / 2 * 1e6  # the best trip: what the path costs, not what a busy CPU adds
    else:
        for _ in range(LAT_ITERS + 1):
            comm.recv(one, peer)
            comm.send(one, peer)
        latency = 0.0

    def stream(sender: bool) -> float:
        if sender:
            t = time.perf_counter()
            for _ in range(iters):
                comm.send(big, peer)
            comm.recv(one, peer)  # the receiver has it all
            return big.nbytes * iters / (time.perf_counter() - t) / 1e9
        t = time.perf_counter()
        for _ in range(iters):
            comm.recv(big, peer)
        elapsed = time.perf_counter() - t
        comm.send(one, peer)
        return big.nbytes * iters / elapsed / 1e9

    out = stream(first)
    back = stream(not first)
    return latency, out, back


def run(nbytes: int = 4 << 20, iters: int = 5, threshold: float = 0.5, comm=None) -> Optional[List[str]]:
    """Checks every edge; returns the report's lines on rank 0 (None elsewhere)."""
    import rcoll

    comm = comm or rcoll.init()
    rank, world = comm.rank, comm.size
    # Per peer: latency (us), bandwidth to it, bandwidth from it (GB/s).
    mine = np.zeros((world, 3), np.float64)
    for pairs in rounds(world):
        for a, b in pairs:
            if rank in (a, b):
                peer = b if rank == a else a
                lat, out, back = _measure(comm, peer, rank == a, nbytes, iters)
                if rank == a:
                    mine[peer] = (lat, out, back)
        comm.barrier()
    table = comm.allgather(mine.reshape(-1)).reshape(world, world, 3)
    mtus = comm.allgather(np.array([_mtu()], np.int64)).reshape(-1)
    codes = np.array([TRANSPORTS.index(t) if t in TRANSPORTS else len(TRANSPORTS) for t in comm.transports], np.int64)
    views = comm.allgather(codes).reshape(world, world)  # views[a][b]: what rank a uses to reach rank b
    if rank != 0:
        return None
    names = [[TRANSPORTS[c] if c < len(TRANSPORTS) else "other" for c in row] for row in views]
    return _report(table, mtus, comm.topology["host_of"], names, world, threshold, nbytes)


def _report(table, mtus, hosts, transports, world, threshold, nbytes) -> List[str]:
    edges = []
    for a in range(world):
        for b in range(a + 1, world):
            lat, out, back = table[a, b]
            ab, ba = transports[a][b], transports[b][a]
            kind = ab if ab == ba else f"{ab}/{ba}"
            why = "same host" if hosts[a] == hosts[b] else "hosts " + f"{hosts[a]}, {hosts[b]}"
            edges.append({"a": a, "b": b, "kind": kind, "why": why, "lat": lat, "out": out, "back": back})
    lines = [f"{world} ranks, {len(set(hosts))} hosts; {nbytes >> 10} KiB messages each way; "
             f"edges below {threshold:.0%} of the median of their kind are named"]
    lines.append(f"{'edge':>9}  {'transport':<14} {'latency us':>10} {'GB/s a->b':>10} {'GB/s b->a':>10}  "
                 f"{'MTU':>11}  note")
    short = 0
    for kind in sorted({e["kind"] for e in edges}):
        group = [e for e in edges if e["kind"] == kind]
        if not group:
            continue
        bw = statistics.median([min(e["out"], e["back"]) for e in group])
        lat = statistics.median([e["lat"] for e in group])
        for e in group:
            notes = []
            if min(e["out"], e["back"]) < threshold * bw:
                notes.append(f"SLOW: {min(e['out'], e['back']):.3f} GB/s, median {bw:.3f}")
            if e["lat"] > lat / threshold and e["lat"] - lat > 20:
                notes.append(f"LATE: {e['lat']:.0f} us, median {lat:.0f}")
            if mtus[e["a"]] != mtus[e["b"]] and e["why"] != "same host":
                notes.append("MTU differs")
            short += bool(notes)
            label = f"{kind} ({e['why']})"
            lines.append(f"{e['a']:>4}-{e['b']:<4}  {label:<14} {e['lat']:>10.1f} {e['out']:>10.3f} "
                         f"{e['back']:>10.3f}  {mtus[e['a']]:>5}/{mtus[e['b']]:<5}  {'; '.join(notes)}")
    lines.append(f"{short} of {len(edges)} edges fall short" if short else f"all {len(edges)} edges are in line")
    return lines


def main(args) -> int:
    lines = run(args.bytes, args.iters, args.threshold)
    if lines is not None:
        print("\n".join(lines), flush=True)
        return 1 if not lines[-1].startswith("all ") else 0
    return 0
