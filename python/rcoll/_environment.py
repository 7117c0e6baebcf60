"""Where rank, world size and the rendezvous address come from.

rcoll rides on the launchers users already have: torchrun / torch elastic
(RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), Slurm (SLURM_PROCID, SLURM_NTASKS)
and mpirun (OMPI_COMM_WORLD_RANK/SIZE, PMI_RANK/PMI_SIZE). Explicit arguments win.
"""
from __future__ import annotations

import os

from . import _core

RANK_VARS = ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK")
_SIZE_VARS = ("WORLD_SIZE", "SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE")
DEFAULT_PORT = 29500


def _first_int(names):
    for name in names:
        value = os.environ.get(name)
        if value not in (None, ""):
            try:
                return int(value), name
            except ValueError:
                raise _core.ConfigError(f"{name}={value!r} is not an integer") from None
    return None, None


def resolve(rank=None, world_size=None, master_addr=None, master_port=None):
    """(rank, world_size, master_addr, master_port) from arguments, then the environment."""
    if rank is None:
        rank, _ = _first_int(RANK_VARS)
    if world_size is None:
        world_size, _ = _first_int(_SIZE_VARS)
    if rank is None or world_size is None:
        raise _core.ConfigError(
            "rank and world size are unknown: pass rank= and world_size=, or start the processes with "
            "torchrun, srun or mpirun (or set RANK and WORLD_SIZE)")
    if not 0 <= rank < world_size:
        raise _core.ConfigError(f"rank {rank} is not in a world of size {world_size}")
    return (int(rank), int(world_size)) + store_address(master_addr, master_port)


def store_address(master_addr=None, master_port=None):
    """(master_addr, master_port) of the rendezvous store from arguments, then
    MASTER_ADDR / MASTER_PORT, then 127.0.0.1:29500. The address may be a
    name, an IPv4 or IPv6 literal (bare or in brackets), "[addr]:port",
    "host:port" or "tcp://..." of either (torch's init_method form): a port
    written there wins over MASTER_PORT."""
    if master_addr is None:
        master_addr = os.environ.get("MASTER_ADDR") or "127.0.0.1"
    host, port_in_addr = split_address(str(master_addr))
    if port_in_addr is not None:
        return host, port_in_addr
    if master_port is None:
        port, _ = _first_int(("MASTER_PORT",))
        master_port = port if port is not None else DEFAULT_PORT
    return host, int(master_port)


def split_address(address: str):
    """(host, port or None) of "host", "host:port", "[v6]", "[v6]:port", a
    bare IPv6 literal ("::1", "fe80::1%eth0"), each optionally after tcp://."""
    text = address.strip()
    if text.startswith("tcp://"):
        text = text[len("tcp://"):].rstrip("/")
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest.startswith(":") and rest[1:].isdigit():
            return host, int(rest[1:])
        if rest:
            raise _core.ConfigError(f"rendezvous address {address!r}: expected [IPv6 address] or [IPv6 address]:port")
        return host, None
    if text.count(":") == 1:
        host, _, port = text.partition(":")
        if not port.isdigit():
            raise _core.ConfigError(f"rendezvous address {address!r}: the port is not a number")
        return host, int(port)
    return text, None  # a name, an IPv4 literal or a bare IPv6 literal


def launcher_store(master_addr: str, master_port: int, timeout: float):
    """The store a launcher already hosts at master_addr:master_port, or None.

    torchrun's agent hosts a torch TCPStore on MASTER_PORT itself (and says so
    with TORCHELASTIC_USE_AGENT_STORE=True), so rank 0 cannot host rcoll's own
    there: rcoll joins torchrun's as a client, as torch's env:// rendezvous
    does, under a prefix of its own per run. A restarted group reuses the
    store with the earlier attempts' keys in it; the rendezvous itself keeps
    the attempts apart (csrc/mesh.cc freshPrefix). The restart count cannot:
    torchrun's agents count restarts differently on different hosts."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() != "true":
        return None
    if (str(master_addr), int(master_port)) != store_address():
        return None  # the caller chose another address: rcoll hosts its own there
    from datetime import timedelta

    import torch.distributed as dist  # torchrun comes with torch

    store = dist.TCPStore(master_addr, master_port, is_master=False, timeout=timedelta(seconds=timeout))
    return dist.PrefixStore("rcoll/{}".format(os.environ.get("TORCHELASTIC_RUN_ID", "run")), store)
