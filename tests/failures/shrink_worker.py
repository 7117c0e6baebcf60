"""One rank of the shrink trials (tests/failures/test_shrink.py), run as a script with
the launcher's variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT).

argv: victims store out [stop]
  victims  original ranks to kill, one per round, in order ("2" or "5,1")
  stop     instead: the (single) victim stops itself (SIGSTOP: alive to the
           kernel, so nobody sees it die) and the others shrink with a 3 s
           timeout without a failure; the test kills it afterwards
  store    "own": rcoll's store, hosted by rank 0; else host:port of a store
           hosted outside the job (then rank 0 may die too)
  out      where each survivor writes its JSON report (out.<rank>)

Each round the ranks run 4 MiB allreduces; the round's victim starts one and
SIGKILLs itself while it is in flight. Every survivor must then raise
PeerError, shrink, find itself at its place among the survivors, and compute
exact results at the new size (allreduce of several dtypes and sizes,
allgather, broadcast) before the next round. The report gives each round's
error, the shrink time and the new rank and size.
"""
import json
import os
import signal
import sys
import time

import numpy as np

import rcoll

SIZES = (0, 1, 7, 1000, 65537)  # empty, one element, odd, many chunks


def check_at_new_size(comm, members, me):
    """Exact results of the survivors' communicator, against numpy."""
    assert comm.size == len(members) and comm.rank == members.index(me), (comm.rank, comm.size, members)
    for dtype in (np.float32, np.int64, np.float16, np.uint8):
        for n in SIZES:
            x = (np.arange(n) % 5 + me + 1).astype(dtype)
            want = sum((np.arange(n) % 5 + r + 1).astype(dtype) for r in members)
            got = comm.allreduce(x.copy(), "sum")
            assert np.array_equal(got, np.asarray(want, dtype)), (dtype, n)
            got = comm.allreduce(x.copy(), "max")
            assert np.array_equal(got, (np.arange(n) % 5 + max(members) + 1).astype(dtype)), (dtype, n)
    gathered = comm.allgather(np.array([me], np.int32))
    assert gathered.ravel().tolist() == members, gathered
    root_value = comm.broadcast(np.array([me * 10], np.int64), root=0)
    assert root_value.tolist() == [members[0] * 10], root_value


def main():
    victims = [int(v) for v in sys.argv[1].split(",")]
    store_arg, out = sys.argv[2], sys.argv[3]
    stop = sys.argv[4:] == ["stop"]
    me = int(os.environ["RANK"])
    kwargs = {}
    if store_arg != "own":
        host, port = store_arg.rsplit(":", 1)
        kwargs["store"] = rcoll._core.TcpStore(host, int(port), 30.0)
    comm = rcoll.init(timeout=60, **kwargs)
    members = list(range(comm.size))
    x = np.ones(1 << 20, np.float32)
    rounds = []
    for victim in victims:
        comm.allreduce(x, "max")  # everyone is connected and past the previous round
        if stop:
            if me == victim:
                os.kill(os.getpid(), signal.SIGSTOP)
            time.sleep(0.5)
            start = time.monotonic()
            comm = comm.shrink(timeout=3.0)  # waits 3 s for the rank nobody saw die
            members = [r for r in members if r != victim]
            check_at_new_size(comm, members, me)
            rounds.append({"victim": victim, "error": "", "shrink_s": time.monotonic() - start, "rank": comm.rank,
                           "size": comm.size})
            continue
        if me == victim:
            comm.allreduce(x, "max", async_op=True)
            time.sleep(0.02)  # the peers are inside the op
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            for _ in range(1000):
                comm.allreduce(x, "max")
            raise AssertionError(f"rank {me} never heard of the death of rank {victim}")
        except rcoll.PeerError as e:
            error = str(e)
        start = time.monotonic()
        comm = comm.shrink()
        shrink_s = time.monotonic() - start
        members = [r for r in members if r != victim]
        check_at_new_size(comm, members, me)
        rounds.append({"victim": victim, "error": error, "shrink_s": shrink_s, "rank": comm.rank,
                       "size": comm.size})
    comm.shutdown()
    with open(f"{out}.{me}", "w") as f:
        json.dump(rounds, f)
    print("RCOLL-JOB-DONE", flush=True)


if __name__ == "__main__":
    main()
