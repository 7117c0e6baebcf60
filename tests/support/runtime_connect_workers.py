"""Per-rank bodies of test_runtime_connect.py: point-to-point connections made on first use."""
import socket
import struct
import time

import numpy as np

import rcoll
from support.collective_workers import blocking_exchange, open_sockets


def _sockets_around(comm, use):
    """Sockets this process holds (every rank quiet, after a barrier) before and after use(comm)."""
    comm.barrier()
    before = open_sockets()
    comm.barrier()
    use(comm)
    comm.barrier()
    after = open_sockets()
    comm.barrier()
    comm.shutdown()
    return before, after


def sockets_before_and_after_use(rank, world):
    """Sockets after start-up (with a collective), then after ranks 0 and world-1 exchanged a message."""
    comm = rcoll.init(rank, world, timeout=60)
    assert (comm.allreduce(np.ones(16, np.float32)) == world).all()
    last = world - 1

    def exchange(comm):
        x = np.arange(10, dtype=np.int64)
        if rank == 0:
            comm.send(x, last)
            y = np.empty_like(x)
            comm.recv(y, last)
            assert (y == x * 2).all()
        elif rank == last:
            y = np.empty_like(x)
            comm.recv(y, 0)
            comm.send(y * 2, 0)

    return _sockets_around(comm, exchange)


def send_before_the_receiver_posts(rank, world):
    """A small blocking send from a lower rank to a higher one that posts its
    receive only after a collective: the send needs the connection the higher
    rank makes, while that rank's caller is still in the collective."""
    comm = rcoll.init(rank, world, timeout=30)
    last = world - 1
    x = np.full(100, 7.0, np.float32)
    if rank == 0:
        comm.send(x, last)
    comm.barrier()
    if rank == last:
        y = np.zeros_like(x)
        comm.recv(y, 0)
        assert (y == 7.0).all()
    comm.barrier()
    comm.shutdown()
    return True


def exchange_with_every_peer(comm, rank, world):
    """Sends to every other rank (issued at once, in a rank-dependent order) and
    receives from each by name; every message checked."""
    peers = [p for p in range(world) if p != rank]
    order = peers[rank % len(peers):] + peers[:rank % len(peers)]
    sends = [comm.send(np.full(1000 + p, rank * 100 + p, np.int64), p, tag=1, async_op=True) for p in order]
    for p in reversed(order):
        y = np.empty(1000 + rank, np.int64)
        comm.recv(y, p, tag=1)
        assert (y == p * 100 + rank).all(), (p, y[:4])
    for h in sends:
        h.wait()


def every_pair(rank, world):
    """exchange_with_every_peer, then a receive from any source; every message checked."""
    comm = rcoll.init(rank, world, timeout=60)
    exchange_with_every_peer(comm, rank, world)
    # From any source: each rank sends one message to the next; the receiver names no sender.
    nxt, prev = (rank + 1) % world, (rank - 1) % world
    h = comm.send(np.array([rank], np.int32), nxt, tag=2, async_op=True)
    y = np.empty(1, np.int32)
    work = comm.recv(y, tag=2, async_op=True)
    work.wait()
    assert y[0] == prev, (y[0], prev)
    h.wait()
    assert (comm.allreduce(np.ones(8, np.float32)) == world).all()
    comm.shutdown()
    return True


def peer_gone(rank, world):
    """The last rank shuts its communicator down right after start-up; the others
    then send to it: a PeerError naming it, not a hang."""
    comm = rcoll.init(rank, world, timeout=20)
    last = world - 1
    comm.barrier()
    if rank == last:
        comm.shutdown()
        return "gone", "", 0.0
    time.sleep(0.5)  # its sockets are closed by now
    started = time.monotonic()
    try:
        comm.send(np.ones(4, np.float32), last)
    except rcoll.RcollError as exc:
        return type(exc).__name__, str(exc), time.monotonic() - started
    return "no error", "", time.monotonic() - started


def knock_after_setup(rank, world):
    """Rank 1 knocks on rank 0's point-to-point listener (open after start-up for
    the peers still to connect) with garbage and bad handshakes; point-to-point
    and collectives then still work between every pair."""
    comm = rcoll.init(rank, world, timeout=60)
    comm.barrier()
    if rank == 1:
        table = comm._store.get(comm._comm.rendezvous_prefix + "addr", 30).decode()
        length, rest = table.split(":", 1)
        p2p = rest[:int(length)].split("\n")[1]  # rank 0's entry: collective line, then point-to-point
        host, port = p2p.split()[0].split("=", 1)[1].split(",")[0].rsplit(":", 1)  # its first address
        host = host.strip("[]")  # an IPv6 address is written in brackets
        held = []
        for payload in (b"", b"GET / HTTP/1.0\r\n\r\n", struct.pack("<IHH", 0x53484352, 2, 0),
                        # a "dial me" note and a hello with a wrong token
                        struct.pack("<IHHIIQ16sHH", 0x53484352, 2, 2, 1, 0, 12345, bytes(16), 0, 1),
                        struct.pack("<IHHIIQ16sHH", 0x53484352, 2, 0, 1, 0, 12345, bytes(16), 0, 1),
                        b"\xff" * 44):
            s = socket.create_connection((host, int(port)), timeout=5)
            if payload:
                s.sendall(payload)
            held.append(s)
        time.sleep(0.5)
        for s in held:
            s.close()
    comm.barrier()
    x = np.full(50, rank, np.int64)
    for p in range(world):
        if p == rank:
            continue
        y = np.empty_like(x)
        blocking_exchange(comm, rank, p, x, y)
        assert (y == p).all()
    comm.shutdown()
    return True


def collective_sockets(rank, world):
    """Sockets after an allreduce and a barrier, then after an alltoall (which needs every peer)."""
    comm = rcoll.init(rank, world, timeout=60)
    assert (comm.allreduce(np.ones(1000, np.float32)) == world).all()

    def alltoall(comm):
        out = comm.alltoall(np.arange(world, dtype=np.int64) + 100 * rank)
        assert out.tolist() == [100 * p + rank for p in range(world)], out

    return _sockets_around(comm, alltoall)
