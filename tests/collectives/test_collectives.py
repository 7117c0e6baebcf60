"""Every collective x dtype x reduce op x size x world size (x root), exact against numpy.

The matrices run their ranks as threads of the test process (rank_threads.py):
the same transports, without an interpreter per rank. What depends on ranks
being processes (their own address spaces, per-rank settings, counting a
process's sockets) runs through rcoll.spawn, and test_matrices_between_processes
repeats a slice of each matrix with ranks as processes.
"""
import pytest
from support import collective_workers as w
from support import rank_threads
from support.common import SMALL_CHUNKS, every_rank_passed

from rcoll import spawn

WORLDS = [1, 2, 3, 4, 8]


# Local ranks use shared memory by default (RCOLL_TRANSPORT=auto); every matrix
# also runs over TCP, the transport between hosts. "shm" is the default there:
# allreduce, allgather, reduce_scatter, broadcast and barrier through the shared
# windows (csrc/shm/shm_collectives.h); "shm-ring" turns those off
# (RCOLL_SHM_COLL=0), so that the ring and recursive doubling run over the
# shared-memory transport, as they do between the local ranks of a multi-host job.
TRANSPORTS = {
    "shm": {"RCOLL_TRANSPORT": "shm"},
    "shm-ring": {"RCOLL_TRANSPORT": "shm", "RCOLL_SHM_COLL": "0"},
    "tcp": {"RCOLL_TRANSPORT": "tcp"},
    # Three sockets per pair: segments take turns on them (csrc/tcp_transport.h).
    "tcp-3sockets": {"RCOLL_TRANSPORT": "tcp", "RCOLL_SOCKETS_PER_PEER": "3"},
}
WINDOW_OPS = pytest.mark.transports(["shm", "shm-ring", "tcp"])  # ops the windows serve: both shm paths


def pytest_generate_tests(metafunc):
    if "transport" in metafunc.fixturenames:
        marker = metafunc.definition.get_closest_marker("transports")
        metafunc.parametrize("transport", marker.args[0] if marker else ["shm", "tcp"], indirect=True)


@pytest.fixture(autouse=True)
def transport(request, monkeypatch):
    monkeypatch.delenv("RCOLL_SHM_COLL", raising=False)
    monkeypatch.delenv("RCOLL_SOCKETS_PER_PEER", raising=False)
    for name, value in TRANSPORTS[request.param].items():
        monkeypatch.setenv(name, value)
    return request.param




@WINDOW_OPS
@pytest.mark.parametrize("world", range(2, 9))
def test_barrier_waits_for_every_rank(world):
    """The dissemination barrier once let a rank out early at 6, 7 and 8 ranks
    (csrc/algorithms.cc: a round waited for the round before it only)."""
    every_rank_passed(rank_threads.run(w.barrier_waits, world, timeout=60))


@pytest.mark.transports(["shm"])  # RCOLL_TRANSPORT=auto below: shm inside each emulated host, TCP between
@pytest.mark.parametrize("layout", ["AABBCC", "ABCABC", "AAABBBCC"])
def test_barrier_waits_for_every_rank_across_emulated_hosts(layout, monkeypatch):
    monkeypatch.setenv("RCOLL_TRANSPORT", "auto")
    env = {"RCOLL_HOSTID": list(layout)}
    every_rank_passed(rank_threads.run(w.barrier_waits, len(layout), timeout=60, env=env))


@WINDOW_OPS
@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("chunks", ["default", "small"])
def test_allreduce_matrix(world, chunks):
    env = SMALL_CHUNKS if chunks == "small" else {}
    every_rank_passed(rank_threads.run(w.allreduce_sweep, world, timeout=240, env=env))


# The windows' large-step path (each rank reduces one slice, the others copy it)
# at every size of the matrix, in many steps.
@pytest.mark.transports(["shm"])
@pytest.mark.parametrize("world", WORLDS[1:])
def test_allreduce_matrix_window_slices(world):
    env = dict(SMALL_CHUNKS, RCOLL_SHM_COLL_DIRECT_BYTES="0")
    every_rank_passed(rank_threads.run(w.allreduce_sweep, world, timeout=240, env=env))


# Both allreduce algorithms over the whole matrix: recursive doubling forced for
# every size (world sizes that are not powers of two fold ranks in and out), and
# the ring forced for the small sizes that would otherwise take recursive doubling.
ALGORITHMS = {"recursive_doubling": "1G", "ring": "0"}


@pytest.mark.transports(["shm-ring", "tcp"])  # the windows have no algorithm to choose
@pytest.mark.parametrize("algorithm,world", [("recursive_doubling", n) for n in (2, 3, 5, 6, 7, 8)] +
                         [("ring", 3), ("ring", 8)])
def test_allreduce_algorithms(world, algorithm):
    env = dict(SMALL_CHUNKS, RCOLL_ALLREDUCE_RD_BYTES=ALGORITHMS[algorithm])
    every_rank_passed(rank_threads.run(w.allreduce_sweep, world, timeout=240, env=env))


@WINDOW_OPS
@pytest.mark.parametrize("world", [2, 3, 4, 6])
@pytest.mark.parametrize("algorithm", sorted(ALGORITHMS))
def test_allreduce_same_bits_on_every_rank(world, algorithm, transport):
    env = dict(SMALL_CHUNKS, RCOLL_ALLREDUCE_RD_BYTES=ALGORITHMS[algorithm])
    if transport == "shm":  # the windows have no algorithm: the two steps paths instead
        env["RCOLL_SHM_COLL_DIRECT_BYTES"] = "0" if algorithm == "ring" else "1G"
    results = rank_threads.run(w.allreduce_bits, world, timeout=240, env=env)
    for rank in range(1, world):
        for case, (mine, first) in enumerate(zip(results[rank], results[0])):
            assert mine == first, f"rank {rank} and rank 0 differ in case {case}"


@WINDOW_OPS
@pytest.mark.parametrize("world", WORLDS)
def test_reduce_scatter_matrix(world):
    every_rank_passed(rank_threads.run(w.reduce_scatter_sweep, world, timeout=240, env=SMALL_CHUNKS))


@WINDOW_OPS
@pytest.mark.parametrize("world", WORLDS)
def test_allgather_matrix(world):
    every_rank_passed(rank_threads.run(w.allgather_sweep, world, timeout=240, env=SMALL_CHUNKS))


@WINDOW_OPS
@pytest.mark.parametrize("world", WORLDS)
def test_broadcast_matrix(world):
    every_rank_passed(rank_threads.run(w.broadcast_sweep, world, timeout=240, env=SMALL_CHUNKS))


@WINDOW_OPS
@pytest.mark.parametrize("world", [2, 3, 4])
def test_large_buffers_default_chunks(world):
    every_rank_passed(rank_threads.run(w.large_sweep, world, timeout=240))


@pytest.mark.parametrize("world", [2, 3])
def test_large_rooted_and_alltoall_default_chunks(world):
    every_rank_passed(rank_threads.run(w.large_rooted_sweep, world, timeout=240))


@pytest.mark.parametrize("world", [1, 2, 4])
def test_many_async_ops_in_flight(world):
    every_rank_passed(rank_threads.run(w.async_many, world, timeout=120))


@pytest.mark.parametrize("world", [2, 3])
def test_streamed_messages_queued_in_the_sockets(world):
    every_rank_passed(rank_threads.run(w.streamed_messages, world, timeout=120))


# Several sockets per pair: the k-th message to a peer takes socket k mod 3 on
# both ends, so segments complete out of order across sockets. Small chunks put
# many segments (and every socket) into each op; the streamed and async cases
# queue messages on every socket before their receives are posted.
@pytest.mark.transports(["tcp-3sockets"])
@pytest.mark.parametrize("world", [2, 3, 5])
@pytest.mark.parametrize("sweep", ["allreduce_sweep", "reduce_scatter_sweep", "allgather_sweep", "broadcast_sweep",
                                   "alltoall_sweep", "large_sweep", "streamed_messages", "async_many"])
def test_several_sockets_per_peer(world, sweep):
    env = SMALL_CHUNKS if sweep.endswith("_sweep") and sweep != "large_sweep" else None
    every_rank_passed(rank_threads.run(getattr(w, sweep), world, timeout=240, env=env))


@pytest.mark.transports(["tcp"])
def test_sockets_per_peer_opens_that_many_sockets(monkeypatch):
    world = 3
    counts = {}
    for n in (1, 3):
        monkeypatch.setenv("RCOLL_SOCKETS_PER_PEER", str(n))
        counts[n] = spawn.run(w.socket_count, world, timeout=120)
    # Collective traffic gets n sockets to each of the other ranks; the
    # point-to-point engine, the store and the listeners keep theirs.
    for rank in range(world):
        assert counts[3][rank] - counts[1][rank] == 2 * (world - 1), counts


@pytest.mark.parametrize("world", [1, 3])
def test_rendezvous_through_a_caller_supplied_store(world):
    for total, gathered, used in rank_threads.run(w.caller_store, world, timeout=60):
        assert total == sum(range(world))
        assert gathered == [10 * r for r in range(world)]
        assert used


@pytest.mark.parametrize("world", WORLDS)
def test_reduce_matrix(world):
    every_rank_passed(rank_threads.run(w.reduce_sweep, world, timeout=240, env=SMALL_CHUNKS))


@pytest.mark.parametrize("world", WORLDS)
def test_gather_matrix(world):
    every_rank_passed(rank_threads.run(w.gather_sweep, world, timeout=240, env=SMALL_CHUNKS))


@pytest.mark.parametrize("world", WORLDS)
def test_scatter_matrix(world):
    every_rank_passed(rank_threads.run(w.scatter_sweep, world, timeout=240, env=SMALL_CHUNKS))


@pytest.mark.parametrize("world", WORLDS)
def test_alltoall_matrix(world):
    every_rank_passed(rank_threads.run(w.alltoall_sweep, world, timeout=240, env=SMALL_CHUNKS))


@pytest.mark.parametrize("world", [2, 4])
def test_point_to_point(world):
    every_rank_passed(rank_threads.run(w.point_to_point, world, timeout=180))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_recv_from_any_source(world):
    every_rank_passed(rank_threads.run(w.recv_from_any, world, timeout=180))


@pytest.mark.transports(["shm"])
def test_recv_from_any_source_across_emulated_hosts():
    """Shared memory inside each host, TCP between them: one composite transport."""
    env = {"RCOLL_TRANSPORT": "auto", "RCOLL_HOSTID": ["a", "a", "b", "b"]}
    every_rank_passed(spawn.run(w.recv_from_any, 4, timeout=180, env=env))


@pytest.mark.transports(["shm"])
def test_recv_from_any_source_times_out_naming_the_tag():
    message, seconds = rank_threads.run(w.recv_from_any_times_out, 2, timeout=60)[0]
    assert "recv of float64 (count=1, tag=3) from any source timed out" in message, message
    assert seconds < 10


# The matrices above run ranks as threads; these repeat each at world 3 with
# ranks as processes, whose shared-memory windows map another address space's
# segments (TCP once: the loopback does not care).
@pytest.mark.transports(["shm"])
@pytest.mark.parametrize("sweep", ["allreduce_sweep", "reduce_scatter_sweep", "allgather_sweep", "broadcast_sweep",
                                   "reduce_sweep", "gather_sweep", "scatter_sweep", "alltoall_sweep",
                                   "point_to_point"])
def test_matrices_between_processes(sweep):
    every_rank_passed(spawn.run(getattr(w, sweep), 3, timeout=240, env=SMALL_CHUNKS))


@pytest.mark.transports(["tcp"])
def test_allreduce_matrix_between_processes_over_tcp():
    every_rank_passed(spawn.run(w.allreduce_sweep, 3, timeout=240, env=SMALL_CHUNKS))
