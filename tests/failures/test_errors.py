"""Bad input and bad days: clear errors naming rank and op, never a hang.

Ranks run as threads of this process (rank_threads.py) where the failure is a
call's (mismatches, bad arguments, timeouts, aborts); as processes where it is a
process's (a rank that dies, per-rank settings, a rank's own store or port)."""
import re
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest
from support import error_workers as w
from support import rank_threads

import rcoll
from rcoll import _core, spawn

# The local ranks of these tests share memory: "windows" is the default path
# there (csrc/shm/shm_collectives.h: the ranks compare step descriptors),
# "ring" the schedules over the shm transport (RCOLL_SHM_COLL=0: headers are
# checked), as between hosts. "tcp-3sockets" is the TCP transport with three
# sockets per pair: a failure on one must fail them all, and an abort message
# must reach the peer whichever it reads.
PATHS = {"windows": {}, "ring": {"RCOLL_SHM_COLL": "0"},
         "tcp-3sockets": {"RCOLL_TRANSPORT": "tcp", "RCOLL_SOCKETS_PER_PEER": "3"}}


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("kind", ["count", "dtype", "op_kind", "reduce_op", "root"])
def test_mismatch_is_reported_on_every_rank(world, kind, path):
    # At world 4 the ranks that meet the odd call first may fail and exit (rank
    # 0 hosts the store) while another is still connecting: a barrier goes first.
    barrier_first = world > 2
    results = rank_threads.run(w.mismatch, world, kind, barrier_first, timeout=60, env=PATHS[path])
    for rank, (name, message, seconds) in enumerate(results):
        assert name in ("MismatchError", "PeerError"), (rank, name, message)
        assert seconds < 15, (rank, seconds, message)  # detected, not timed out (timeout is 20 s)
    # The ranks that exchanged the odd message name both sides: rank 1 and at
    # least one other (which ones depends on the algorithm: the ring's
    # neighbour, or recursive doubling's partner). With a root mismatch, rank 0
    # is a root that only sends: it learns from rank 1.
    op = 2 if barrier_first else 1
    detected = [rank for rank, (name, _, _) in enumerate(results) if name == "MismatchError"]
    assert 1 in detected and len(detected) >= 2, results
    if world == 2:
        assert detected == [0, 1], results
    for rank in detected:
        message = results[rank][1]
        assert "rank 1 called" in message or "while rank 1 called" in message, message
        assert f"as op #{op}" in message, message
        assert message.startswith(f"rank {rank}: "), message
    if kind == "count":
        assert "count=1001" in results[1][1] and "count=1000" in results[1][1]
    if kind == "dtype":
        assert "float64" in results[1][1] and "float32" in results[1][1]


@pytest.mark.parametrize("world", [2, 3])
def test_window_op_against_a_transport_op_is_a_mismatch(world):
    # Rank 1 gathers (through the shm transport) while the others allreduce
    # (through the shared windows): no header ever meets a wrong one, so the
    # window ranks must notice that rank 1 announced another op (or sent a
    # message where none was due), and tell it.
    results = rank_threads.run(w.mismatch, world, "window_vs_ring", True, timeout=60)
    for rank, (name, message, seconds) in enumerate(results):
        assert name in ("MismatchError", "PeerError"), (rank, name, message)
        assert seconds < 15, (rank, seconds, message)  # detected, not timed out (timeout is 20 s)
        assert "gather" in message and "allreduce" in message and "op #2" in message, message
    assert results[0][0] == "MismatchError" and "rank 1 called gather" in results[0][1], results[0]


@pytest.mark.parametrize("transport", ["shm", "tcp"])
def test_arrays_of_dropped_handles_outlive_their_ops(transport):
    results = spawn.run(w.handles_dropped_by_an_exception, 3, timeout=60, env={"RCOLL_TRANSPORT": transport})
    assert results[2] == "left"
    for rank in (0, 1):  # an error, not a crash (the rank returned at all)
        name, message, _ = results[rank]
        assert name == "PeerError" and "allreduce(int64, count=4, op=sum)" in message, (rank, message)


@pytest.mark.parametrize("path", sorted(PATHS))
@pytest.mark.parametrize("world", [2, 3, 4])
def test_dead_peer_fails_every_survivor_quickly(world, path):
    results = spawn.run(w.dead_peer, world, timeout=60, allow_failures=True, env=PATHS[path])
    dead = world - 1
    assert results[dead][0] == "error" and "exit code 3" in results[dead][1]
    for rank in range(dead):
        (name, message, seconds), (later_name, later_message, _) = results[rank]
        assert name in ("PeerError", "MismatchError") and name == "PeerError", (rank, message)
        assert f"rank {dead}" in message, message
        assert "allreduce(float32, count=4194304, op=sum)" in message, message
        assert seconds < 10, seconds  # the op timeout is 30 s: this is detection, not expiry
        # The communicator is poisoned: later ops fail at once with the same cause.
        assert later_name == "PeerError" and "failed earlier" in later_message, later_message


def test_silent_peer_times_out_naming_it():
    results = rank_threads.run(w.silent_peer, 2, timeout=60)
    name, message, seconds = results[0]
    assert name == "TimeoutError", message
    assert "rank 0" in message and "rank(s) 1" in message and "op #1" in message, message
    # What torch's own tests (and users' log filters) look for in a timeout.
    assert re.search(" (Timed out|closed|timeout) ", message) and "timed out" in message, message
    assert 1.4 < seconds < 5, seconds
    # Rank 1 learns why rank 0 gave up instead of waiting for its own timeout.
    name1, message1, seconds1 = results[1]
    assert name1 == "PeerError" and "rank 0 failed" in message1 and "timed out" in message1, message1
    assert seconds1 < 5


def test_abort_from_another_thread():
    results = rank_threads.run(w.abort_from_thread, 2, timeout=60)
    (name, message, seconds), (later_name, later_message, _) = results[0]
    assert name == "AbortedError" and "test abort" in message and seconds < 5, (name, message, seconds)
    assert later_name == "AbortedError", later_message


def _stray_clients(port, stop, errors):
    """Knocks on rank 0's data port with everything a scanner or a broken peer might send."""
    try:
        _knock(port, stop)
    except Exception as exc:  # reported by the test: a knock that never happened proves nothing
        errors.append(repr(exc))


def _knock(port, stop):
    store = _core.TcpStore("127.0.0.1", port, 30)
    # A fresh store: the first epoch (csrc/mesh.cc freshPrefix). The table of every
    # rank's addresses (allGather): "<length>:<entry>" per rank; rank 0's entry
    # is its collective mesh's "kind=host:port[,host:port...] ..." line, then its p2p mesh's.
    length, table = store.get("rcoll/default/1/addr", 30).decode().split(":", 1)
    published = table[:int(length)].split("\n")[0]
    host, p = published.split()[0].split("=", 1)[1].split(",")[0].rsplit(":", 1)  # its first address
    host = host.strip("[]")  # an IPv6 address is written in brackets
    held = []

    def connect():
        s = socket.create_connection((host, int(p)), timeout=5)
        held.append(s)
        return s

    connect()                                   # says nothing at all (slow loris)
    connect().sendall(b"GET / HTTP/1.0\r\n\r\n" * 4)  # garbage
    connect().sendall(struct.pack("<IHH", 0x53484352, 2, 0))  # half a handshake, then silence
    # A full handshake (wire version 3: 44 bytes) with a wrong token, then one of another wire version.
    connect().sendall(struct.pack("<IHHIIQ16sHH", 0x53484352, 3, 0, 1, 0, 12345, bytes(16), 0, 1))
    connect().sendall(struct.pack("<IHHIIQ16s", 0x53484352, 1, 0, 1, 0, 12345, bytes(16)))
    s = connect()
    s.sendall(b"\xff" * 44)
    s.close()                                   # random bytes, then gone
    stop.wait(20)
    for s in held:
        s.close()


def test_stray_connections_are_rejected_and_the_job_completes():
    port = spawn.free_port()
    stop = threading.Event()
    errors = []
    t = threading.Thread(target=_stray_clients, args=(port, stop, errors), daemon=True)
    t.start()
    try:
        results = spawn.run(w.late_rank, 3, 2.0, timeout=60, port=port, env={"RCOLL_DEBUG": "WARN"})
    finally:
        stop.set()
        t.join(10)
    assert results == [True, True, True]
    assert errors == [], errors  # every stray connection was made


def test_bad_arguments_raise_value_errors_and_nothing_is_lost():
    for messages, result in rank_threads.run(w.bad_arguments, 2, timeout=60):
        for m in messages:
            assert m is not None, messages
            is_rcoll_error, text = m
            assert is_rcoll_error and text.startswith("rank "), text
        assert result == [2.0] * 4


def test_ranks_that_count_sockets_differently_use_rank_0s_count():
    # Both ends of a pair must open as many sockets: every rank takes rank 0's
    # RCOLL_SOCKETS_PER_PEER and says so. (Were a peer still to announce another
    # count in its handshake, both ends would fail with a ConfigError: see
    # tests/native/fuzz/fuzz_handshake.cc.)
    env = {"RCOLL_TRANSPORT": "tcp", "RCOLL_CONNECT_TIMEOUT": "30"}
    differ = spawn.run(w.sockets_per_peer_differ, 3, True, timeout=60, env=env)
    same = spawn.run(w.sockets_per_peer_differ, 3, False, timeout=60, env=env)
    for rank in range(3):
        assert differ[rank][0] == "ok" and same[rank][0] == "ok", (rank, differ[rank], same[rank])
        assert differ[rank][1] == same[rank][1] == (3.0, same[rank][1][1]), (rank, differ, same)


def test_rank_outside_world_is_a_config_error():
    with pytest.raises(rcoll.ConfigError, match="rank 3 is not in a world of size 2"):
        rcoll.init(rank=3, world_size=2)


def test_missing_rendezvous_store_times_out(monkeypatch):
    monkeypatch.setenv("RCOLL_CONNECT_TIMEOUT", "1")
    t0 = time.monotonic()
    with pytest.raises(rcoll.TimeoutError, match="rendezvous store"):
        rcoll.init(rank=1, world_size=2, master_port=spawn.free_port())
    assert time.monotonic() - t0 < 10


def test_error_hierarchy():
    assert issubclass(rcoll.TimeoutError, rcoll.RcollError) and issubclass(rcoll.TimeoutError, TimeoutError)
    assert issubclass(rcoll.InvalidArgumentError, ValueError)
    for cls in (rcoll.PeerError, rcoll.MismatchError, rcoll.ConfigError, rcoll.AbortedError):
        assert issubclass(cls, rcoll.RcollError) and issubclass(cls, RuntimeError)


def test_import_needs_no_torch():
    code = "import sys, rcoll; assert 'torch' not in sys.modules, 'rcoll imported torch'; print(rcoll.__version__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr


def test_abort_reaching_an_idle_rank_fails_its_next_op_at_once():
    name, message, seconds = rank_threads.run(w.peer_aborts_while_idle, 2, timeout=60)[0]
    assert name == "PeerError" and "rank 1 gave up" in message, message
    assert seconds < 3, seconds  # not the 30 s op timeout


class _StoreThatTimesOut:
    def set(self, key, value):
        pass

    def add(self, key, delta):
        return delta

    def get(self, key):
        raise TimeoutError(f"no key {key}")


def test_a_caller_store_timeout_is_an_rcoll_timeout():
    with pytest.raises(rcoll.TimeoutError, match="rendezvous store raised"):
        rcoll.Communicator(0, 2, store=_StoreThatTimesOut())  # rank 0 waits (get) for rank 1 to join


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("kind", ["reduce_root", "gather_root", "scatter_root", "alltoallv_count"])
def test_mismatch_in_rooted_ops_and_alltoallv(world, kind):
    """Ranks that disagree on a root, or on one alltoallv pair's count, fail within seconds."""
    results = rank_threads.run(w.mismatch, world, kind, True, timeout=60)  # op #1 is a barrier
    for rank, (name, message, seconds) in enumerate(results):
        assert name in ("MismatchError", "PeerError"), (rank, name, message)
        assert seconds < 15, (rank, seconds, message)  # detected, not timed out (timeout is 20 s)
        assert message.startswith(f"rank {rank}: "), message
    if kind == "alltoallv_count":
        # Rank 1 expects 4 elements from `sender`, which sends 3: the receiver names
        # both ranks and both counts; the sender hears it from rank 1.
        sender = 2 % world
        for rank in (1, sender):
            name, message, _ = results[rank]
            assert name == "MismatchError", (rank, message)
            assert (f"rank {sender} called alltoall(float32) as op #2 sending 3 elements to rank 1 while rank 1 "
                    f"called alltoall(float32) as op #2 expecting 4 elements from rank {sender}") in message, message
        return
    opname = kind.split("_")[0]
    # Rank 1 believes it is the root. It usually meets rank 0's or 2's header
    # (root=0); with scatter it may meet a faster rank's next op (a barrier) first.
    name, message, _ = results[1]
    assert name == "MismatchError", message
    assert f"{opname}(float32, count=1000" in message and "root=1" in message, message
    assert "as op #2" in message and ("root=0" in message or "barrier() as op #3" in message), message
    name, message, _ = results[0]
    assert name == "MismatchError" and "rank 1" in message and "root=1" in message, message


@pytest.mark.parametrize("kind", ["tag", "count", "dtype"])
def test_point_to_point_mismatch_fails_the_receiver_at_once(kind):
    results = rank_threads.run(w.p2p_mismatch, 2, kind, timeout=60)
    name, message, seconds = results[1]
    assert name == "MismatchError", message
    assert "rank 0 called send/recv" in message and seconds < 10, message
    # The sender's 40-byte message left at once; it completed, or learned of the failure.
    assert results[0][0] in ("ok", "MismatchError", "PeerError"), results[0]


def test_point_to_point_bad_peer_or_tag_is_a_value_error():
    for errors in rank_threads.run(w.p2p_bad_peer, 2, timeout=60):
        assert all(e and e.startswith("rank ") for e in errors), errors


def test_shutdown_from_another_thread_aborts_what_cannot_finish():
    name, message, seconds = rank_threads.run(w.shutdown_from_thread, 2, timeout=60)[0]
    assert name == "AbortedError" and "shutdown() was called" in message, message
    assert seconds < 5, seconds  # the op timeout is 60 s
