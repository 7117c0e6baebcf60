"""The socket ceiling: raw TCP throughput on 127.0.0.1 between two processes,
one way and both ways at once, which the sweep's table and plot set the
backends' bus bandwidth against (--socket-ceiling)."""
from __future__ import annotations

import multiprocessing as mp
import selectors
import socket
import time


def _socket_endpoint(role, port, seconds, chunk, send, measure, results):
    """One end of a 127.0.0.1 TCP pair: sends if `send`, times what it receives if `measure`."""
    try:
        if role == "server":
            lsock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            lsock.bind(("127.0.0.1", port))
            lsock.listen(1)
            lsock.settimeout(30)
            sock, _ = lsock.accept()
            lsock.close()
        else:
            deadline = time.monotonic() + 30
            while True:
                try:
                    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.05)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        # One thread per process moving both directions with non-blocking I/O, as rcoll's
        # transport does (two threads per process would fight over the 2 cores here).
        sel = selectors.DefaultSelector()
        sel.register(sock, selectors.EVENT_READ)
        sbuf, rbuf = memoryview(bytearray(chunk)), memoryview(bytearray(chunk))
        sending, eof, wr_closed = send, False, False
        ramp_end = time.perf_counter() + 0.2  # a short ramp-up, then the measured window
        window_end = ramp_end + seconds
        got, window = 0, 0.0
        hard_deadline = window_end + 60
        while not (eof and wr_closed):
            now = time.perf_counter()
            if now > hard_deadline:
                raise TimeoutError("the socket measurement did not finish")
            if (measure and now >= window_end) or (not measure and eof):
                sending = False
            if not sending and not wr_closed and (not measure or now >= window_end):
                sock.shutdown(socket.SHUT_WR)  # the peer sees EOF once it has read everything
                wr_closed = True
            mask = (0 if eof else selectors.EVENT_READ) | (selectors.EVENT_WRITE if sending else 0)
            if mask == 0:
                break
            sel.modify(sock, mask)
            for _, ev in sel.select(timeout=0.1):
                if ev & selectors.EVENT_READ:
                    try:
                        n = sock.recv_into(rbuf)
                    except BlockingIOError:
                        n = -1
                    if n == 0:
                        eof = True
                    elif n > 0 and measure and ramp_end <= time.perf_counter() < window_end:
                        got += n
                if ev & selectors.EVENT_WRITE and sending:
                    try:
                        sock.send(sbuf)
                    except BlockingIOError:
                        pass
        if measure:
            window = seconds
        sel.close()
        sock.close()
        results.put((role, got, window, None))
    except Exception as exc:
        results.put((role, 0, 0.0, f"{type(exc).__name__}: {exc}"))


def _socket_pair(seconds, chunk, both):
    from rcoll.spawn import free_port
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    # both: each end sends and measures; one way: the client sends, the server measures
    spec = {"server": (both, True), "client": (True, both)}
    procs = [ctx.Process(target=_socket_endpoint, args=(role, port, seconds, chunk) + spec[role] + (results,),
                         daemon=True) for role in ("server", "client")]
    for p in procs:
        p.start()
    rates = {}
    try:
        for _ in procs:
            role, got, window, err = results.get(timeout=seconds + 60)
            if err:
                raise RuntimeError(f"socket ceiling, {role}: {err}")
            if window > 0:
                rates[role] = got / window / 1e9
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
    return rates


def socket_ceiling(seconds=1.0, chunk=4 << 20, repeats=3):
    """GB/s over a 127.0.0.1 TCP pair between two processes: one way, and both ways at once.

    Each is measured `repeats` times and the best is kept (it is a ceiling; loopback
    throughput on a small VM varies by tens of percent from run to run).
    """
    ones, twos = [], []
    for _ in range(repeats):
        ones.append(_socket_pair(seconds, chunk, both=False)["server"])
        two = _socket_pair(seconds, chunk, both=True)
        twos.append((sum(two.values()) / len(two), two))
    per_dir, best_two = max(twos, key=lambda t: t[0])
    return {"one_direction_GBps": max(ones), "per_direction_GBps": per_dir,
            "both_directions_GBps": sum(best_two.values()), "per_endpoint_GBps": best_two,
            "all_one_direction_GBps": ones, "all_per_direction_GBps": [t[0] for t in twos],
            "seconds": seconds, "chunk_bytes": chunk, "repeats": repeats}
