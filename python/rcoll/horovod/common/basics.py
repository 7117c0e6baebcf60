"""The Horovod job on rcoll: hvd.init() and what it answers (ranks, sizes,
what is built), and the communicator of every process set.

The job's ranks come from the launcher, as rcoll.init() reads them (torchrun,
mpirun, srun, or Horovod's own HOROVOD_RANK / HOROVOD_SIZE beside a store
address): Horovod's semantics ride on one rcoll communicator per process set.
"""
from __future__ import annotations

import atexit
import os
import threading
from typing import Dict, List, Optional

from ... import _core
from ..._environment import RANK_VARS as _RANK_VARS
from .process_sets import ProcessSet, global_process_set

# Horovod's reduce op values (horovod/common/message.h ReduceOp).
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5


class _Job:
    """One initialized Horovod job: the global communicator and the process sets'."""

    def __init__(self, comm, process_sets: List[ProcessSet]):
        self.comm = comm  # rcoll.Communicator of every rank
        self.rank, self.size = comm.rank, comm.size
        topology = comm.topology
        local = topology["local_rank"]
        host_of = topology["host_of"]
        self.local_rank = local[self.rank]
        self.local_size = sum(1 for h in host_of if h == host_of[self.rank])
        # Horovod's cross communicator: the ranks that share this local rank, one per host.
        peers = [r for r in range(self.size) if local[r] == self.local_rank]
        self.cross_rank, self.cross_size = peers.index(self.rank), len(peers)
        self.homogeneous = len({len(ranks) for ranks in topology["hosts"]}) == 1
        self._lock = threading.Lock()
        self._timeline = None  # Horovod's timeline (timeline.py), on rank 0 while one is written
        self._sets: Dict[int, List[int]] = {0: list(range(self.size))}
        self._comms = {0: comm}
        self._controllers = {0: self._controller(0, comm)}
        self._next_id = 1
        global_process_set.ranks = list(range(self.size))
        for index, ps in enumerate(process_sets):
            if ps.ranks is None:
                raise ValueError(f"process_sets entry number {index} has no ranks: {ps}")
            try:
                ps.process_set_id = self.add_process_set(ps.ranks)
            except ValueError as e:
                raise ValueError(
                    f"Horovod could not be initialized because process_sets entry number {index} is a duplicate: "
                    f"{ps} ({e})") from None

    # -- process sets -------------------------------------------------------------------
    def add_process_set(self, ranks: List[int]) -> int:
        ranks = sorted(ranks)
        bad = [r for r in ranks if not 0 <= r < self.size]
        if bad or not ranks or len(set(ranks)) != len(ranks):
            raise ValueError(f"rank {self.rank}: add_process_set: {ranks} are not distinct ranks of a job of size "
                             f"{self.size}")
        with self._lock:
            if ranks in self._sets.values():
                raise ValueError(f"Attempted to add a duplicate process set: ranks {ranks}")
            process_set_id = self._next_id
            self._next_id += 1
            self._sets[process_set_id] = ranks
        # Only the members connect (rcoll.Communicator.group); the id is the
        # same everywhere because every rank adds the sets in the same order.
        comm = self.comm.group(ranks, name=f"set{process_set_id}")
        controller = self._controller(process_set_id, comm) if comm is not None else None
        with self._lock:
            self._comms[process_set_id] = comm
            self._controllers[process_set_id] = controller
        return process_set_id

    def _controller(self, process_set_id: int, comm):
        """The negotiation of a set (controller.py), over a communicator of its
        own (shared memory between ranks of a host: a cached round costs about
        as much as an 8-byte allreduce; its waits spin RCOLL_SPIN_US, then block)."""
        from .controller import Controller, check_metas

        if _frontend is None:
            raise ValueError("rcoll.horovod: import a front end (rcoll.horovod.torch) before hvd.init()")
        execute, stand_in, _ = _frontend
        control = comm.group(range(comm.size), name="control")
        controller = Controller(control, comm.rank, comm.size, f"process set {process_set_id}", check_metas,
                                lambda name, metas: stand_in(comm, name, metas), execute)
        controller.timeline = self._timeline
        return controller

    # -- Horovod's timeline ---------------------------------------------------------------
    def start_timeline(self, path: str, mark_cycles: bool) -> None:
        """Starts writing Horovod's timeline to `path` (rank 0 writes it, as
        Horovod's coordinator does; other ranks only take note)."""
        from .timeline import Timeline

        self.stop_timeline()
        timeline = Timeline(path, mark_cycles) if self.rank == 0 else None
        with self._lock:
            self._timeline = timeline
            for controller in self._controllers.values():
                if controller is not None:
                    controller.timeline = timeline

    def stop_timeline(self) -> None:
        with self._lock:
            timeline, self._timeline = self._timeline, None
            for controller in self._controllers.values():
                if controller is not None:
                    controller.timeline = None
        if timeline is not None:
            timeline.close()

    def remove_process_set(self, process_set_id: int) -> bool:
        with self._lock:
            ranks = self._sets.pop(process_set_id, None)
            comm = self._comms.pop(process_set_id, None)
            controller = self._controllers.pop(process_set_id, None)
        if controller is not None:
            controller.stop(_SHUTDOWN_GRACE)
            controller.close()
        if comm is not None:
            comm.shutdown()
        return ranks is not None

    def process_set_ranks(self, process_set_id: int) -> List[int]:
        ranks = self._sets.get(process_set_id)
        if ranks is None:
            raise ValueError(f"rank {self.rank}: process set {process_set_id} does not exist (removed, or added "
                             "before the last hvd.init())")
        return ranks

    def communicator(self, process_set_id: int, opname: str):
        """(rcoll communicator, controller) of a process set on this rank;
        ValueError when the set is unknown or this rank is not in it (as Horovod)."""
        comm = self._comms.get(process_set_id)
        if comm is None:
            ranks = self.process_set_ranks(process_set_id)
            raise ValueError(f"rank {self.rank}: {opname}: this rank is not in process set {process_set_id} "
                             f"(ranks {ranks})")
        return comm, self._controllers[process_set_id]

    def parts(self, process_set_id):
        """(rcoll communicator, controller) of a process set this rank is in, else None."""
        comm = self._comms.get(process_set_id)
        return None if comm is None else (comm, self._controllers[process_set_id])

    def _take_parts(self):
        """(controllers, process sets' communicators), leaving the job with none."""
        with self._lock:
            controllers = [c for c in self._controllers.values() if c is not None]
            comms = [c for i, c in self._comms.items() if i != 0 and c is not None]
            self._comms, self._sets, self._controllers = {}, {}, {}
        return controllers, comms

    def _close_parts(self):
        """Lets every controller leave its rounds (every rank does the same),
        then closes them and the process sets' communicators."""
        controllers, comms = self._take_parts()
        for controller in controllers:
            controller.stop(_SHUTDOWN_GRACE)
        for controller in controllers:
            controller.close()
        self.stop_timeline()
        for comm in comms:
            comm.shutdown()

    def shutdown(self):
        self._close_parts()
        self.comm.shutdown()

    def survivors(self) -> "_Job":
        """After a rank failed: the job of the ranks that are left (rcoll's
        shrink, agreed through the rendezvous store), without process sets.
        The controllers' rounds are cut at once (their communicators aborted)."""
        global_controller = self._controllers.get(0)
        controllers, comms = self._take_parts()
        # The failure may have shown on the global set's control communicator
        # (the same ranks as the job's) rather than on the job's own.
        lost = global_controller.lost_peers() if global_controller is not None else []
        for controller in controllers:
            controller.abandon(f"rank {self.rank}: Horovod is resetting after a failure")
        self.stop_timeline()
        for comm in comms:
            comm.abort(f"rank {self.rank}: Horovod is resetting after a failure")
        return _Job(self.comm.shrink(lost=lost), [])

    def grown(self, last_ticket: int) -> "_Job":
        """After every rank agreed that ranks wait to join (up to
        `last_ticket`): the job of these ranks followed by the newcomers
        (rcoll's grow), without process sets. Nothing is pending: the
        agreement was the last op."""
        self._close_parts()
        return _Job(self.comm.grow(last_ticket), [])


_lock = threading.Lock()
_current: Optional[_Job] = None
_SHUTDOWN_GRACE = 10.0  # seconds hvd.shutdown() waits for the other ranks to shut down too
_frontend = None  # (execute, stand_in, forget) of the framework's ops: controller.py's callbacks


def register_frontend(execute, stand_in, forget) -> None:
    """The framework front end (rcoll.horovod.torch) names how agreed ops
    run; forget() drops its handles and op names when a job ends."""
    global _frontend
    _frontend = (execute, stand_in, forget)


def reset_after_failure() -> None:
    """hvd.elastic's reset: the job goes on with the ranks that are left."""
    global _current
    with _lock:
        current = _current
        if current is None:
            raise ValueError("Horovod has not been initialized; use hvd.init().")
        _frontend[2]()
        _current = current.survivors()
        global_process_set.ranks = list(range(_current.size))


def ranks_waiting_to_join(bcast_object) -> int:
    """hvd.elastic's check for newcomers, on every rank: rank 0 looks at the
    store, the others learn what it saw through `bcast_object` (Horovod's
    broadcast_object, so the check is ordered with the job's other ops).
    Returns the last ticket waiting (0: none), for reset_after_update()."""
    current = job()
    return bcast_object(current.comm.joiners_waiting() if current.rank == 0 else 0)


def reset_after_update(last_ticket: int) -> None:
    """hvd.elastic's reset when ranks joined: the job goes on with them
    (nothing changes when none did: a HostsUpdatedInterrupt raised by hand)."""
    global _current
    if not last_ticket:
        return
    with _lock:
        current = job()
        _frontend[2]()
        _current = current.grown(last_ticket)
        global_process_set.ranks = list(range(_current.size))


def _launcher_settings():
    """Horovod's own environment (HOROVOD_RANK, HOROVOD_SIZE beside
    MASTER_ADDR/MASTER_PORT or HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT) as rcoll.init() reads a launcher's."""
    kwargs = {}
    if "RANK" not in os.environ and "HOROVOD_RANK" in os.environ:
        kwargs["rank"] = int(os.environ["HOROVOD_RANK"])
        kwargs["world_size"] = int(os.environ["HOROVOD_SIZE"])
    elif not any(os.environ.get(name) for name in _RANK_VARS):
        # No launcher: one process on its own, as Horovod runs a script
        # started without one (`python train.py`), with a store of its own.
        return {"rank": 0, "world_size": 1, "master_addr": "127.0.0.1", "master_port": 0}
    kwargs.update(_rendezvous_address())
    return kwargs


def _rendezvous_address():
    """Horovod's HOROVOD_GLOO_RENDEZVOUS_ADDR/PORT where MASTER_ADDR is not set
    (rcoll reads MASTER_ADDR/MASTER_PORT itself)."""
    addr = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")
    if addr and "MASTER_ADDR" not in os.environ:
        return {"master_addr": addr, "master_port": int(os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT", "29500"))}
    return {}


def _join_running_job(communicator):
    """A rank started later with RCOLL_ELASTIC_JOIN=1 beside the job's store
    address: it waits for the job's ranks to take it in (docs/horovod.md,
    "Ranks that join later")."""
    return communicator.join("horovod", **_rendezvous_address())


def init(comm=None, process_sets=None):
    """Starts Horovod on this rank (every rank calls it). `comm`: None (every
    rank of the launcher's job) or a list of those ranks to run Horovod on;
    `process_sets`: ProcessSets to set up now, or "dynamic" (add_process_set
    later). A second init() while initialized does nothing, as in Horovod."""
    global _current
    from ...communicator import Communicator

    if process_sets is None:
        process_sets = []
    elif isinstance(process_sets, str):
        if process_sets.lower() != "dynamic":
            raise ValueError(f"process_sets must be a list of ProcessSet or 'dynamic', got {process_sets!r}")
        os.environ["HOROVOD_DYNAMIC_PROCESS_SETS"] = "1"
        process_sets = []
    process_sets = list(process_sets)
    if comm is not None and not isinstance(comm, (list, tuple, range)):
        raise ValueError("Horovod has not been built with MPI support: rcoll.horovod.init takes comm=None or a "
                         "list of ranks, not an MPI communicator")
    with _lock:
        if _current is not None:
            return
        if _core.settings()["elastic_join"]:
            world = _join_running_job(Communicator)
        else:
            world = Communicator(name="horovod", **_launcher_settings())
        if comm is not None and sorted(comm) != list(range(world.size)):
            sub = world.group(comm, name="init")
            if sub is None:
                world.shutdown()
                raise ValueError(f"rank {world.rank} is not in hvd.init(comm={list(comm)})")
            world.shutdown()
            world = sub
        _current = _Job(world, process_sets)
        path = os.environ.get("HOROVOD_TIMELINE", "")
        if path and path != "DYNAMIC":  # DYNAMIC: started later by start_timeline(), which needs no variable here
            _current.start_timeline(path, os.environ.get("HOROVOD_TIMELINE_MARK_CYCLES", "0") not in ("", "0"))


def job() -> _Job:
    current = _current
    if current is None:
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    return current


def shutdown():
    """Ends Horovod on this rank: pending ops finish or fail, the communicators close."""
    global _current
    with _lock:
        current, _current = _current, None
    if current is not None:
        current.shutdown()
        global_process_set.ranks = []
        _frontend[2]()


atexit.register(shutdown)


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Starts writing Horovod's timeline (a Chrome trace of every op's
    negotiation and run) to `file_path`, on rank 0; every rank calls it."""
    job().start_timeline(str(file_path), bool(mark_cycles))


def stop_timeline() -> None:
    """Stops the timeline and closes its file."""
    job().stop_timeline()


def is_initialized() -> bool:
    return _current is not None


def size() -> int:
    return job().size


def rank() -> int:
    return job().rank


def local_size() -> int:
    return job().local_size


def local_rank() -> int:
    return job().local_rank


def cross_size() -> int:
    return job().cross_size


def cross_rank() -> int:
    return job().cross_rank


def is_homogeneous() -> bool:
    return job().homogeneous


# What is built and enabled, answered truthfully: rcoll's own transports (shm,
# TCP, ibverbs) stand where Horovod had MPI, Gloo, NCCL, DDL and oneCCL.
def mpi_threads_supported() -> bool:
    job()
    return False


def mpi_enabled() -> bool:
    return False


def mpi_built() -> bool:
    return False


def gloo_enabled() -> bool:
    return False


def gloo_built() -> bool:
    return False


def nccl_built() -> int:
    return 0


def ddl_built() -> bool:
    return False


def ccl_built() -> bool:
    return False


def cuda_built() -> bool:
    """Whether this rcoll has its CUDA path (rcoll._cuda, built when nvcc was found)."""
    import importlib.util
    return importlib.util.find_spec("rcoll._cuda") is not None


def rocm_built() -> bool:
    return False
