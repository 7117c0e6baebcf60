"""Survivors agreeing on who they are after a failure, through the rendezvous store.

Used by Communicator.shrink() and by rcoll.torch_backend.survivors(). The store
is the only thing every survivor can still reach (the old connections are
failing), and its atomic add() gives a total order of check-ins:

1. Every survivor checks in: `add(count, 1)` gives it a ticket n, and it writes
   `arrival/n` = its rank and the ranks whose connections it saw die (its lost
   peers: closed, reset or unreachable, not those that reported an error).
2. The holder of ticket 1 decides. It reads the check-ins in ticket order
   until every rank has checked in or is lost to someone, or until the
   timeout; then it reads what else has checked in by then and publishes
   `members`, the ranks that checked in, sorted.
3. Everyone reads `members`; the new rank is the index in it.

A dead rank never checks in. When someone saw its connection die, no one waits
for it; otherwise the decider waits for it until the timeout. A survivor that a
peer suspected wrongly is still a member if it checked in before the decision.
A rank checking in after the decision learns that it was left out.

A rank checks in before it closes its old connections (Communicator.shrink),
so that a survivor which sees that close and suspects it has checked in
after it: the decider, which waits for that survivor, reads both.
"""

import operator
import time
from typing import Iterable, List, Optional

from . import _core


def _encode(ranks: Iterable[int]) -> bytes:
    return ",".join(str(r) for r in ranks).encode()


def _decode(value: bytes) -> List[int]:
    text = value.decode()
    return [int(r) for r in text.split(",")] if text else []


class SurvivorAgreement:
    """One shrink's agreement among the ranks of a communicator of `world_size`
    ranks: check_in(), then members(). `prefix` must be the same on every rank
    and new for each shrink."""

    def __init__(self, store, prefix: str, rank: int, world_size: int, timeout: float):
        self._store = store
        self._prefix = prefix
        self._rank = rank
        self._size = world_size
        self._timeout = timeout
        self._deadline = None
        self._ticket = 0

    def _key(self, name):
        return f"{self._prefix}/{name}"

    def _remaining(self):
        return max(0.001, self._deadline - time.monotonic())

    def check_in(self, lost: Iterable[int]):
        self._deadline = time.monotonic() + self._timeout
        self._ticket = self._store.add(self._key("count"), 1)
        self._store.set(self._key(f"arrival/{self._ticket}"), _encode([self._rank, *lost]))

    def members(self) -> List[int]:
        """The agreed survivors, sorted (this rank may be missing from them:
        it checked in after the decision)."""
        if self._ticket == 1:
            self._decide()
        try:
            return _decode(self._store.get(self._key("members"), self._remaining()))
        except _core.TimeoutError as e:
            raise _core.TimeoutError(
                f"rank {self._rank}: shrink: no decision on the survivors within {self._timeout:g} s (the rank "
                f"that checked in first must have failed too): {e}") from None

    def _read_arrival(self, ticket, arrived, suspected, timeout=None):
        entry = _decode(self._store.get(self._key(f"arrival/{ticket}"), timeout or self._remaining()))
        arrived.add(entry[0])
        suspected.update(entry[1:])

    def _decide(self):
        arrived, suspected = set(), set()
        ticket = 1
        while set(range(self._size)) - arrived - suspected and time.monotonic() < self._deadline:
            try:
                self._read_arrival(ticket, arrived, suspected)
            except _core.TimeoutError:
                break
            ticket += 1
        # Those that checked in meanwhile are members too, suspected or not. A
        # ticket is written right after it is taken: a short wait, unless its
        # holder died in between.
        for later in range(ticket, self._store.add(self._key("count"), 0) + 1):
            try:
                self._read_arrival(later, arrived, suspected, timeout=2.0)
            except _core.TimeoutError:
                pass
        self._store.set(self._key("members"), _encode(sorted(arrived)))


def survivors(comm, store, prefix: str, exclude: Optional[Iterable[int]], timeout: float, store_hint: str) -> List[int]:
    """The ranks of `comm` (a core communicator) that go on, sorted, agreed with
    the others through `store` (keys under `prefix`, new for each shrink); ends
    `comm`. `exclude`: the ranks to leave out, given alike on every survivor (no
    agreement needed). Raises when this rank is not among them. `store_hint`
    names the argument that gives a store of one's own, for the error when the
    store died with a rank."""
    rank, size = comm.rank, comm.size

    def end(reason):  # pending ops fail with `reason`, and the peers are told it
        comm.abort(reason)
        comm.shutdown(0.0)

    if exclude is not None:
        try:
            excluded = {operator.index(r) for r in exclude}
        except TypeError:
            raise _core.InvalidArgumentError(
                f"rank {rank}: shrink: exclude must be a sequence of ranks, got {exclude!r}") from None
        bad = sorted(r for r in excluded if not 0 <= r < size)
        if bad:
            raise _core.InvalidArgumentError(
                f"rank {rank}: shrink: exclude names {bad}, not ranks of this communicator (size {size})")
        if rank in excluded:
            raise _core.InvalidArgumentError(
                f"rank {rank}: shrink: this rank is in exclude; excluded ranks must not call shrink")
        end(f"shrinking the communicator, leaving out ranks {sorted(excluded)}")
        return [r for r in range(size) if r not in excluded]
    agreement = SurvivorAgreement(store, prefix, rank, size, timeout)
    lost = comm.lost_peers
    try:
        agreement.check_in(lost)
    except _core.PeerError as e:
        end(f"shrink failed: {e}")
        raise _core.PeerError(
            f"rank {rank}: shrink: {e}. A shrink agrees through the rendezvous store, which must outlive the "
            f"failed ranks: torchrun's, or one hosted outside the job ({store_hint})") from None
    # After the check-in (see the top of this file): peers still in an op fail
    # with this reason, and come to shrink too.
    end("shrinking the communicator to the survivors" + (f" (lost: ranks {lost})" if lost else ""))
    members = agreement.members()
    if rank not in members:
        raise _core.PeerError(f"rank {rank}: shrink: the survivors {members} agreed without this rank (it came "
                              f"after the decision, or was found unreachable)")
    return members
