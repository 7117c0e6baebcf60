"""Point-to-point connections made on first use (RCOLL_RUNTIME_CONNECT, #20 item 4).

Between hosts (here TCP on one machine, and RCOLL_HOSTID to split the ranks
into emulated hosts) a job keeps no point-to-point socket to a rank it never
sends to or receives from. The higher rank of a pair dials; a lower rank that
needs a higher one asks it to with a note it does not wait on (csrc/peer_listener.h),
so a lower rank's send completes while the higher rank's caller is busy
elsewhere, as it did with every connection made at start-up.
"""
import pytest
from support import collective_workers as cw
from support import rank_threads
from support import runtime_connect_workers as w
from support.common import SMALL_CHUNKS, every_rank_passed

from rcoll import spawn

TCP = {"RCOLL_TRANSPORT": "tcp"}


def test_no_point_to_point_socket_until_first_use():
    world = 4
    lazy = spawn.run(w.sockets_before_and_after_use, world, timeout=120, env=TCP)
    eager = spawn.run(w.sockets_before_and_after_use, world, timeout=120, env=dict(TCP, RCOLL_RUNTIME_CONNECT="0"))
    for rank in range(world):
        (lazy_before, lazy_after), (eager_before, eager_after) = lazy[rank], eager[rank]
        # Eager: a socket to each other rank. On demand: none, and the listener stays open.
        assert lazy_before == eager_before - (world - 1) + 1, (rank, lazy, eager)
        # Ranks 0 and 3 exchanged messages: one socket between them, nobody else gained one.
        assert lazy_after - lazy_before == (1 if rank in (0, world - 1) else 0), (rank, lazy)
        assert eager_after == eager_before, (rank, eager)


@pytest.mark.parametrize("runtime_connect", ["1", "0"])
def test_send_completes_before_the_higher_rank_posts_its_receive(runtime_connect):
    env = dict(TCP, RCOLL_RUNTIME_CONNECT=runtime_connect)
    assert spawn.run(w.send_before_the_receiver_posts, 3, timeout=60, env=env) == [True] * 3


@pytest.mark.parametrize("world,lanes", [(2, "1"), (5, "1"), (5, "3")])
def test_every_pair_over_tcp(world, lanes):
    """lanes: RCOLL_SOCKETS_PER_PEER, connected on first use as one peer (tests/native/cpp/test_on_demand_connector.cc
    has what happens when one of them fails)."""
    env = dict(TCP, RCOLL_SOCKETS_PER_PEER=lanes)
    assert spawn.run(w.every_pair, world, timeout=120, env=env) == [True] * world


def test_every_pair_across_emulated_hosts():
    """Shared memory inside each host (connected at start-up), TCP between hosts (on first use)."""
    env = {"RCOLL_TRANSPORT": "auto", "RCOLL_HOSTID": ["a", "a", "b", "b", "c"]}
    assert spawn.run(w.every_pair, 5, timeout=120, env=env) == [True] * 5


def test_send_to_a_rank_that_is_gone_fails_naming_it():
    results = spawn.run(w.peer_gone, 3, timeout=60, env=TCP, allow_failures=True)
    for rank in (0, 1):  # rank 0 dials rank 2's listener; rank 1 asks rank 2 to dial: both refused
        name, message, seconds = results[rank]
        assert name == "PeerError" and "rank 2" in message, (rank, results[rank])
        assert seconds < 10, (rank, results[rank])


def test_stray_connections_after_setup_are_dropped(capfd):
    assert spawn.run(w.knock_after_setup, 3, timeout=90, env=dict(TCP, RCOLL_DEBUG="WARN")) == [True] * 3
    err = capfd.readouterr().err
    # Each knock was seen and dropped by rank 0's listener, after start-up.
    assert err.count("rank 0: rejected a connection") == 3, err
    assert err.count("rank 0: dropped a connection") == 3, err


def _collective_peers(rank, world):
    """csrc/algorithms.cc collectivePeers for one rank per host: ring and barrier
    neighbours (rank +- 2^k) and recursive-doubling partners (world a power of two)."""
    peers = set()
    dist = 1
    while dist < world:
        peers |= {(rank + dist) % world, (rank - dist) % world, rank ^ dist}
        dist *= 2
    return peers - {rank}


def test_collectives_connect_the_peers_their_algorithms_use():
    world = 8
    env = dict(RCOLL_HOSTID=[f"host{r}" for r in range(world)])  # a host per rank: TCP between all
    lazy = spawn.run(w.collective_sockets, world, timeout=120, env=env)
    eager = spawn.run(w.collective_sockets, world, timeout=120, env=dict(env, RCOLL_RUNTIME_CONNECT="0"))
    for rank in range(world):
        (lazy_before, lazy_after), (eager_before, eager_after) = lazy[rank], eager[rank]
        needed = len(_collective_peers(rank, world))
        assert needed < world - 1, needed  # this layout leaves some peers to connect on first use
        # Eager: two sockets to each other rank (collectives, point-to-point). On
        # demand: one to each needed peer, and both listeners stay open.
        assert lazy_before == eager_before - 2 * (world - 1) + needed + 2, (rank, needed, lazy, eager)
        # The alltoall connected the rest, on the collectives' transport only.
        assert lazy_after == lazy_before + (world - 1 - needed), (rank, lazy)
        assert eager_after == eager_before, (rank, eager)


# Every collective with its peers on emulated hosts, TCP between them, so that
# rooted ops and alltoall connect most pairs on first use, in the middle of the op.
LAYOUTS = {
    "8x1": [f"h{r}" for r in range(8)],
    "4x2": ["a", "a", "b", "b", "c", "c", "d", "d"],  # hierarchical
    "3+2+3": ["a", "a", "a", "b", "b", "c", "c", "c"],  # uneven hosts
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("sweep", ["allreduce_sweep", "broadcast_sweep", "reduce_sweep", "gather_sweep",
                                   "scatter_sweep", "alltoall_sweep", "allgather_sweep", "reduce_scatter_sweep"])
def test_matrices_on_emulated_hosts(layout, sweep):
    env = dict(SMALL_CHUNKS, RCOLL_HOSTID=LAYOUTS[layout])
    every_rank_passed(rank_threads.run(getattr(cw, sweep), 8, timeout=240, env=env))
