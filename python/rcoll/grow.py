"""Ranks joining a running job, through the rendezvous store.

Used by Communicator.join() (a rank started later) and Communicator.grow()
(the job's ranks taking it in). The store is all a newcomer shares with the
job: it knows the store's address and the name of the job's first
communicator, nothing of who is running now.

1. A newcomer takes a ticket from the job's `tickets` counter (1, 2, ...)
   and waits for `admit/<ticket>` (it polls `ready/<ticket>` with add(key, 0),
   which never blocks, rather than holding a get open for minutes).
2. The job's ranks read the counter when they choose to, on one rank
   (Communicator.joiners_waiting(): one store round trip), and agree on the
   last ticket to admit by passing it along one of their own collectives,
   so every rank admits the same newcomers at the same point of its program.
3. Communicator.grow(ticket), on every rank of the job: its rank 0 writes each
   newcomer, in ticket order, its rank (after the job's, which keep theirs),
   the new size and the new communicator's name; then everyone builds that
   communicator. A ticket taken after the job read the counter waits for the
   next growth.

The keys live under `join/<name>/`, `name` being the job's first
communicator's: its shrinks and growths keep it, so a newcomer finds them
whatever happened to the job before it came.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from . import _core


def _key(root: str, name: str) -> str:
    return f"join/{root}/{name}"


@dataclass
class Admission:
    """What a newcomer is told: its rank, the size of the grown communicator,
    that communicator's name and the last ticket it admitted."""
    rank: int
    size: int
    name: str
    last_ticket: int

    def encode(self) -> bytes:
        return f"{self.rank},{self.size},{self.last_ticket},{self.name}".encode()

    @classmethod
    def decode(cls, value: bytes) -> "Admission":
        rank, size, last_ticket, name = value.decode().split(",", 3)
        return cls(int(rank), int(size), name, int(last_ticket))


def last_ticket(store, root: str) -> int:
    """The last ticket a newcomer took (0: none yet); never blocks."""
    return store.add(_key(root, "tickets"), 0)


def admit(store, root: str, first_ticket: int, admissions) -> None:
    """Tells the newcomers holding tickets first_ticket, first_ticket + 1, ...
    their Admission (one per ticket, in order)."""
    for ticket, admission in enumerate(admissions, first_ticket):
        store.set(_key(root, f"admit/{ticket}"), admission.encode())
        store.add(_key(root, f"ready/{ticket}"), 1)


def wait_for_admission(store, root: str, timeout: float, where: str) -> Admission:
    """A newcomer's side: takes a ticket and waits up to `timeout` seconds
    for the job to admit it. `where` names the store for the error."""
    ticket = store.add(_key(root, "tickets"), 1)
    deadline = time.monotonic() + timeout
    pause = 0.005
    while store.add(_key(root, f"ready/{ticket}"), 0) == 0:
        if time.monotonic() >= deadline:
            raise _core.TimeoutError(
                f"joining job '{root}' at {where} (ticket {ticket}): not admitted within {timeout:g} s; the job's "
                "ranks take newcomers in when they check for them (hvd.elastic: at state.commit()); set RCOLL_TIMEOUT "
                "to wait longer")
        time.sleep(pause)
        pause = min(pause * 2, 0.2)
    return Admission.decode(store.get(_key(root, f"admit/{ticket}"), 10.0))
