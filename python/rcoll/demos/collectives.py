"""The main job of the README: collectives between local ranks, checked and timed."""
from __future__ import annotations

import time


def demo_rank(rank, world, megabytes, iters):
    import numpy as np

    import rcoll

    comm = rcoll.init()
    n = int(megabytes * (1 << 20)) // 4
    rows = []

    def timed(label, fn, nbytes, factor, check):
        fn()  # warm-up (connections, page faults)
        comm.barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        seconds = (time.perf_counter() - t0) / iters
        algbw = nbytes / seconds / 1e9
        rows.append((label, seconds * 1e6, algbw, algbw * factor, check()))

    x = np.full(n, rank + 1, np.float32)
    expected_sum = world * (world + 1) / 2

    def allreduce():
        x.fill(rank + 1)
        comm.allreduce(x)
    timed("allreduce", allreduce, n * 4, 2 * (world - 1) / world, lambda: bool((x == expected_sum).all()))

    piece = np.full(n // world, rank, np.float32)
    gathered = np.empty((world, n // world), np.float32)
    timed("allgather", lambda: comm.allgather(piece, out=gathered), gathered.nbytes, (world - 1) / world,
          lambda: bool((gathered == np.arange(world, dtype=np.float32)[:, None]).all()))

    b = np.empty(n, np.float32)

    def broadcast():
        b.fill(7.0 if rank == 0 else -1.0)
        comm.broadcast(b, root=0)
    timed("broadcast", broadcast, n * 4, 1.0, lambda: bool((b == 7.0).all()))
    transport = (comm.transport, comm.transports)
    comm.shutdown()
    return transport, rows


def run_demo(world_size, megabytes, iters, timeout, hosts="") -> int:
    from rcoll import spawn

    env = {}
    if hosts:
        if len(hosts) != world_size:
            print(f"--hosts {hosts}: give one host name (a letter) per rank, {world_size} in all")
            return 2
        env["RCOLL_HOSTID"] = list(hosts)  # rank r gets hosts[r]
    print(f"rcoll demo: {world_size} local ranks{f' on hosts {hosts}' if hosts else ''}, {megabytes} MiB "
          f"float32 per rank, {iters} iterations per op")
    outcome = spawn.run(demo_rank, world_size, megabytes, iters, timeout=timeout, env=env)
    results = [rows for _transport, rows in outcome]
    print("transport per rank (shared memory between ranks of one host, verbs or TCP between hosts; "
          "RCOLL_TRANSPORT=tcp|shm|ib forces one, see python -m rcoll info):")
    for rank, ((name, per_peer), _rows) in enumerate(outcome):
        edges = ", ".join(f"rank {peer} {kind}" for peer, kind in enumerate(per_peer) if kind != "self")
        print(f"  rank {rank}: {name} ({edges or 'no peers'})")
    print(f"{'op':<12}{'time (us)':>12}{'algbw (GB/s)':>15}{'busbw (GB/s)':>15}  correct on every rank")
    ok = True
    for i, (label, *_rest) in enumerate(results[0]):
        worst = max(r[i][1] for r in results)  # the slowest rank sets the pace
        algbw = results[0][i][2] * results[0][i][1] / worst
        busbw = results[0][i][3] * results[0][i][1] / worst
        correct = all(r[i][4] for r in results)
        ok &= correct
        print(f"{label:<12}{worst:>12.1f}{algbw:>15.3f}{busbw:>15.3f}  {'yes' if correct else 'NO'}")
    return 0 if ok else 1
