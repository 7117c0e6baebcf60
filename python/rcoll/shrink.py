"""Survivors agreeing on who they are after a failure, through the rendezvous store.

Used by Communicator.shrink() and by rcoll.torch_backend.shrink(). The store
is the only thing every survivor can still reach (the old connections are
failing), and its atomic add() orders what the survivors do:

1. Every survivor checks in: it writes `lost/<rank>`, the ranks whose
   connections it saw die (closed, reset or unreachable, not those that
   reported an error), then bumps `in/<rank>`, then takes a ticket from
   `count`.
2. The holder of ticket 1 decides: it polls the `in/` counters (add(key, 0)
   never blocks, and a store such as torch's logs every get that times out)
   until every rank has checked in or is lost to someone, or until the
   timeout. Then it claims the decision (`claim`, first add wins), publishes
   `members`, the ranks that had checked in, sorted, and returns that list.
3. Everyone else waits for `members` a little longer than the decider may
   take. If nothing comes (the decider died too), each decides itself from
   what has checked in by then, and the one that wins `claim` publishes: there
   is never more than one list.

A dead rank never checks in. When someone saw its connection die, no one waits
for it; otherwise the decider waits for it until the timeout. A survivor that a
peer suspected wrongly is a member if it checked in before the decision; one
checking in after the decision learns that it was left out.

A rank checks in before it closes its old connections (Communicator.shrink),
so that a survivor which sees that close and suspects it checks in after it:
the decider, which waits for that survivor, has seen both.

The keys live under the old communicator's own rendezvous keys (new for every
communicator, also on a store that outlives jobs), so a shrink never reads
another's.
"""

import operator
import time
from typing import Iterable, List, Optional

from . import _core

_SLACK = 5.0  # s the others wait for the decision beyond the decider's timeout


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
        self._start = None
        self._ticket = 0

    def _key(self, name):
        return f"{self._prefix}/{name}"

    def check_in(self, lost: Iterable[int]):
        self._start = time.monotonic()
        self._store.set(self._key(f"lost/{self._rank}"), _encode(lost))
        self._store.add(self._key(f"in/{self._rank}"), 1)
        self._ticket = self._store.add(self._key("count"), 1)

    def members(self) -> List[int]:
        """The agreed survivors, sorted (this rank may be missing from them:
        it checked in after the decision)."""
        if self._ticket == 1:
            return self._decide(wait=True)
        wait = self._timeout + _SLACK - (time.monotonic() - self._start)
        try:
            return _decode(self._store.get(self._key("members"), max(wait, 0.1)))
        except _core.TimeoutError:
            return self._decide(wait=False)  # the decider failed too: take over

    def _arrived(self, arrived, suspected):
        """Adds the ranks that have checked in since (and whom they lost)."""
        for r in range(self._size):
            if r not in arrived and self._store.add(self._key(f"in/{r}"), 0) > 0:
                arrived.add(r)
                suspected.update(_decode(self._store.get(self._key(f"lost/{r}"), 10.0)))  # written before in/r

    def _decide(self, wait):
        arrived, suspected = set(), set()
        self._arrived(arrived, suspected)
        deadline = self._start + self._timeout
        pause = 0.001
        while wait and set(range(self._size)) - arrived - suspected and time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(pause * 2, 0.1)
            self._arrived(arrived, suspected)
        if self._store.add(self._key("claim"), 1) == 1:
            members = sorted(arrived)
            self._store.set(self._key("members"), _encode(members))
            return members
        try:  # another rank decided: its list is the one
            return _decode(self._store.get(self._key("members"), _SLACK))
        except _core.TimeoutError:
            raise _core.TimeoutError(
                f"rank {self._rank}: shrink: no decision on the survivors: the rank that claimed it failed before "
                f"it published the list") from None


def survivors(comm, store, prefix: str, exclude: Optional[Iterable[int]], timeout: float, store_hint: str,
              lost_elsewhere: Iterable[int] = ()) -> List[int]:
    """The ranks of `comm` (a core communicator) that go on, sorted, agreed with
    the others through `store` (keys under `prefix`, new for each shrink); ends
    `comm`. `exclude`: the ranks to leave out, given alike on every survivor (no
    agreement needed). Raises when this rank is not among them. `store_hint`
    names the argument that gives a store of one's own, for the error when the
    store died with a rank. `lost_elsewhere`: ranks this rank saw die on
    another communicator of the same ranks, reported as lost too."""
    rank, size = comm.rank, comm.size

    def end(reason):  # pending ops fail with `reason`, and the peers are told it
        comm.abort(reason)
        comm.shutdown(1.0)  # after the abort nothing is left to wait for

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
    lost = sorted(set(comm.lost_peers) | {int(r) for r in lost_elsewhere})
    try:
        agreement.check_in(lost)
    except _core.RcollError as e:  # PeerError from rcoll's store, ConfigError from a caller's that went away
        end(f"shrink failed: {e}")
        raise _core.PeerError(
            f"rank {rank}: shrink: the rendezvous store failed: {e}. A shrink agrees through the store, which must "
            f"outlive the failed ranks: torchrun's, or one hosted outside the job ({store_hint})") from None
    # After the check-in (see the top of this file): peers still in an op fail
    # with this reason, and come to shrink too.
    end("shrinking the communicator to the survivors" + (f" (lost: ranks {lost})" if lost else ""))
    members = agreement.members()
    if rank not in members:
        raise _core.PeerError(f"rank {rank}: shrink: the survivors {members} agreed without this rank (it came "
                              f"after the decision, or was found unreachable)")
    return members
