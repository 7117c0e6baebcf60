"""Rendezvous on a store that earlier attempts used (csrc/mesh.cc freshPrefix).

A launcher that restarts a job (torchrun --max-restarts) hands the new workers
the same store, holding the keys of the attempts before, any of which may have
been cut short: a worker killed before it joined, or rank 0 gone before it
published. Every new attempt must still meet on keys of its own, whatever the
order in which its ranks arrive. Ranks run as threads, each with its own store
client, as separate processes would."""
import threading
import time

import numpy as np
import pytest

import rcoll

WORLD = 3


@pytest.fixture
def store_server():
    server = rcoll._core.TcpStoreServer("127.0.0.1", 0)
    yield server.port
    del server


def _attempt(port, ranks, connect_timeout, delays=None):
    """Ranks `ranks` of a world of 3 create communicator "job" (rank r after delays[r] s) and
    allreduce; returns {rank: the sum, or the error}."""
    results = {}

    def rank_body(r):
        time.sleep((delays or {}).get(r, 0))
        try:
            comm = rcoll.Communicator(r, WORLD, store=rcoll._core.TcpStore("127.0.0.1", port, 10.0), name="job",
                                      settings={"RCOLL_CONNECT_TIMEOUT": str(connect_timeout)})
            results[r] = int(comm.allreduce(np.array([r + 1], np.int64))[0])
            comm.shutdown()
        except rcoll.RcollError as e:
            results[r] = e

    threads = [threading.Thread(target=rank_body, args=(r,)) for r in ranks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a rank hung"
    return results


@pytest.mark.timeout(120)
@pytest.mark.parametrize("cut_short", ["rank 2 never came", "rank 0 never came", "complete"])
def test_a_new_attempt_meets_on_fresh_keys_after_an_earlier_one(store_server, cut_short):
    first = {"rank 2 never came": [0, 1], "rank 0 never came": [1, 2], "complete": [0, 1, 2]}[cut_short]
    results = _attempt(store_server, first, connect_timeout=2)
    if cut_short == "complete":
        assert results == {0: 6, 1: 6, 2: 6}
    else:
        assert all(isinstance(e, rcoll.TimeoutError) for e in results.values()), results
    if cut_short == "rank 2 never came":
        assert "rank 2 did not join communicator 'job'" in str(results[0]), results[0]
    # The next attempts: rank 0 last (the others read the earlier attempt's epoch
    # first and must not settle on it), then rank 0 first.
    assert _attempt(store_server, [0, 1, 2], connect_timeout=30, delays={0: 0.5}) == {0: 6, 1: 6, 2: 6}
    assert _attempt(store_server, [0, 1, 2], connect_timeout=30, delays={1: 0.3, 2: 0.5}) == {0: 6, 1: 6, 2: 6}
