"""python -m rcoll info | demo | bench | train

  info   version, build, RDMA library and devices, every RCOLL_* variable; under a
         launcher (torchrun -m rcoll info, srun, mpirun) the job's topology too
  demo   a real allreduce / allgather / broadcast between local ranks, checked
         and timed (python -m rcoll demo --world-size 4 --megabytes 16 [--hosts AABB])
  bench  the nccl-tests style sweep: ops x sizes, algbw/busbw, results checked
         (#wrong), rcoll against torch's gloo, JSON (python -m rcoll bench --help)
  train  a real DDP training run with backend="rcoll" and then "gloo" on
         synthetic data: loss, time per step, parameters compared (needs torch)
"""
from __future__ import annotations

import argparse
import os
import platform
import sys


def environment_markdown() -> str:
    """The table of every RCOLL_* variable, from the core's own list (config.cc):
    docs/environment.md holds this text, and tests/api/test_config.py checks it is current."""
    from rcoll import _core

    lines = ["| variable | default | meaning |", "| --- | --- | --- |"]
    for name, default, meaning in _core.config_vars():
        lines.append(f"| `{name}` | {f'`{default}`' if default else ''} | {meaning} |")
    return "\n".join(lines) + "\n"


_LOCAL_RANK_VARS = ("LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID")


def _launched() -> bool:
    """Started by a launcher that gives this process a rank in a job (rcoll._environment)."""
    from rcoll import _environment

    return any(os.environ.get(name) for name in _environment.RANK_VARS) and \
        any(os.environ.get(name) for name in _environment._SIZE_VARS)


def _job(timeout: float) -> int:
    """Joins the job the launcher started and, on rank 0, prints what every rank
    computed from the host identities: hosts, the rings' order, the algorithms
    and the transport of every edge (an allgather of each rank's edges)."""
    import numpy as np

    import rcoll

    comm = rcoll.init(timeout=timeout)
    kinds = ["self", "shm", "tcp", "ib"]
    mine = np.array([kinds.index(k) for k in comm.transports] if comm.size > 1 else [0], np.int8)
    edges = comm.allgather(mine)
    # Each rank's data interfaces (net_interfaces.h), as fixed-size text.
    text = ", ".join(_data_interfaces(comm.rank)["chosen"]).encode()[:_IFACE_TEXT_BYTES]
    interfaces = comm.allgather(np.frombuffer(text.ljust(_IFACE_TEXT_BYTES, b"\0"), np.uint8))
    if comm.rank == 0:
        t = comm.topology
        print(f"job: {comm.size} ranks, joined by rank 0 ({comm.transport})")
        print(f"  topology    {t['text']}")
        print(f"  ring order  {' '.join(map(str, t['host_order']))}")
        print(f"  algorithms  {t['algorithms']}")
        print("  edges       each rank's transport to ranks 0.. (. self, s shared memory, t TCP, i verbs)")
        for r in range(comm.size):
            print(f"    rank {r:<5} host {t['host_of'][r]:<4} local {t['local_rank'][r]:<4} "
                  f"{''.join('.sti'[k] for k in edges[r])}")
        print("  data interfaces (RCOLL_SOCKET_IFNAME, RCOLL_SOCKET_FAMILY)")
        for r in range(comm.size):
            print(f"    rank {r:<5} {interfaces[r].tobytes().rstrip(bytes(1)).decode(errors='replace')}")
    comm.shutdown()
    return 0


_IFACE_TEXT_BYTES = 256


def _data_interfaces(rank: int) -> dict:
    """The interfaces this process's data sockets would use, the address that
    reaches the store (MASTER_ADDR) first, as a communicator chooses them."""
    from rcoll import _core, _environment

    preferred = _core.source_address_for(_environment.store_address()[0]) if os.environ.get("MASTER_ADDR") else ""
    return _core.data_interfaces(preferred, rank)


def _info(args) -> int:
    if args.environment_markdown:
        sys.stdout.write(environment_markdown())
        return 0
    join = args.job if args.job is not None else _launched()
    local = next((os.environ[n] for n in _LOCAL_RANK_VARS if os.environ.get(n)), "0")
    if join and local != "0":
        return _job(args.timeout)  # one report of this machine per host is enough
    _machine()
    return _job(args.timeout) if join else 0


def _machine() -> None:
    import numpy as np

    import rcoll
    from rcoll import _core

    print(f"rcoll {rcoll.__version__}")
    print(f"  python      {platform.python_version()} ({sys.executable})")
    print(f"  numpy       {np.__version__}")
    print(f"  compiler    {_core.COMPILER}")
    print(f"  dtypes      {', '.join(rcoll.DTYPES)}")
    print(f"  reduce ops  {', '.join(rcoll.REDUCE_OPS)}")
    from rcoll import cuda as rcuda
    try:
        from rcoll import _cuda
        cuda = "built for " + ", ".join(_cuda.built_archs())
    except ImportError:
        cuda = "not built (no nvcc at build time, or a CPU-only build)"
    ok, why = rcuda.available()
    print(f"  cuda module {cuda}; {'usable' if ok else 'not usable: ' + why}")
    _print_rdma(_core.rdma_report())
    identity, from_env = _core.host_identity()
    print("host:")
    print(f"  identity    {identity or '(unknown: no boot id; shared memory off)'}"
          f"{' (RCOLL_HOSTID)' if from_env else ' (boot id / network namespace)'}")
    try:
        print(f"  network     {_data_interfaces(0)['why']}")
    except rcoll.ConfigError as e:
        print(f"  network     {e}")
    print("  rule        per pair of ranks: shared memory when both have this identity (and neither sets")
    print("              RCOLL_SHM_DISABLE=1); between hosts verbs when every rank with a peer on another")
    print("              host has an active RDMA port, else TCP. RCOLL_TRANSPORT=tcp|ib forces one transport")
    print("              on every pair; RCOLL_TRANSPORT=shm requires every rank on one host.")
    print("environment:")
    variables = _core.config_vars()
    width = max(len(name) for name, _, _ in variables)  # the longest name keeps the columns aligned
    for name, default, meaning in variables:
        value = os.environ.get(name)
        shown = value if value is not None else f"(unset, default {default or 'none'})"
        print(f"  {name:<{width}} {shown}")
        print(f"  {'':<{width}}   {meaning}")


def _print_rdma(report) -> None:
    """The RDMA part of `info`: enough to diagnose a RoCE/InfiniBand set-up alone."""
    transports = "shm, tcp, ib (verbs)" if report["library_loaded"] else "shm, tcp"
    print(f"  transports  {transports}")
    print("rdma:")
    if not report["library_loaded"]:
        print(f"  ibverbs     not available: {report['error']}")
    else:
        print(f"  ibverbs     {report['library']} loaded")
        if report["error"]:
            print(f"  devices     {report['error']}")
    print(f"  selected    {report['selection']}")
    print(f"  gpudirect   {report['gpudirect']}")
    for dev in report["devices"]:
        if dev["error"]:
            print(f"  device {dev['name']}: {dev['error']}")
            continue
        print(f"  device {dev['name']}  firmware {dev['firmware'] or '-'}  max_qp {dev['max_qp']}  "
              f"max_qp_wr {dev['max_qp_wr']}  max_sge {dev['max_sge']}  max_cqe {dev['max_cqe']}  "
              f"max_mr_size {dev['max_mr_size']}")
        for port in dev["ports"]:
            roce = " (RoCE)" if port["link_layer"] == "Ethernet" else ""
            print(f"    port {port['port']}  {port['state']}  {port['link_layer']}{roce}  "
                  f"MTU {port['active_mtu']}  LID {port['lid']}  max_msg {port['max_msg_size']}")
            for gid in port["gids"]:
                note = ""
                if gid["index"] == port["chosen_gid"]:
                    note = "  <- rcoll uses this one"
                elif gid["link_local"]:
                    note = "  (link-local: skipped)"
                print(f"      GID {gid['index']:<3} {gid['address']:<40} {gid['type'] or '?':<8} "
                      f"{gid['netdev'] or '':<10}{note}")
            print(f"      choice: {port['gid_reason']}")


def _demo(args) -> int:
    from rcoll.demos.collectives import run_demo

    return run_demo(args.world_size, args.megabytes, args.iters, args.timeout, args.hosts)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["bench"]:  # the sweep parses its own arguments (and --help)
        from rcoll import bench

        return bench.main(argv[1:])
    parser = argparse.ArgumentParser(prog="python -m rcoll", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="version, build and environment")
    info.add_argument("--environment-markdown", action="store_true",
                      help="print only the table of RCOLL_* variables (docs/environment.md)")
    info.add_argument("--job", action=argparse.BooleanOptionalAction, default=None,
                      help="join the job of the launcher's environment (RANK/WORLD_SIZE, Slurm, mpirun) and "
                           "print its topology on rank 0; default: when such a rank is set")
    info.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for every rank (--job)")
    demo = sub.add_parser("demo", help="run collectives between local ranks and time them")
    demo.add_argument("--world-size", "-n", type=int, default=4)
    demo.add_argument("--megabytes", type=float, default=16.0)
    demo.add_argument("--iters", type=int, default=10)
    demo.add_argument("--timeout", type=float, default=300.0)
    demo.add_argument("--hosts", default="",
                      help="a host name per rank, e.g. AABB: sets each rank's RCOLL_HOSTID, so that one "
                           "machine runs the mixed ring of several hosts (shared memory inside, TCP across)")
    status = sub.add_parser("status", help="every rank of a running job: its op, how long it has waited and "
                                           "for whom, how far behind it is, its last error")
    status.add_argument("--store", default=None,
                        help="the job's store: torch://HOST:PORT (torchrun's, torch's TCPStore) or "
                             "rcoll://HOST:PORT (rcoll's own); default: torch:// at MASTER_ADDR:MASTER_PORT")
    status.add_argument("--world", type=int, default=None, help="ranks in the job (default: as rank 0 published)")
    status.add_argument("--timeout", type=float, default=10.0, help="seconds to connect to the store")
    status.add_argument("--wait", type=float, default=0.0, help="seconds to wait for the job's first status")
    status.add_argument("--job", default=None,
                        help="which job on the store (default: the latest; torchrun's run id and attempt, "
                             "e.g. 'myjob.0')")
    doctor = sub.add_parser("doctor", help="under a launcher: check every edge of the job (transport, latency, "
                                           "bandwidth, MTU) and name those that fall short")
    doctor.add_argument("--bytes", type=int, default=4 << 20, help="message size of the bandwidth test")
    doctor.add_argument("--iters", type=int, default=5, help="messages each way per edge")
    doctor.add_argument("--threshold", type=float, default=0.5,
                        help="an edge under this fraction of its transport's median bandwidth is named")
    sub.add_parser("bench", add_help=False,
                   help="nccl-tests style sweep against torch's gloo (python -m rcoll bench --help)")
    train = sub.add_parser("train", help="DDP training with rcoll and gloo side by side (needs torch)")
    train.add_argument("--world-size", "-n", type=int, default=2)
    train.add_argument("--steps", type=int, default=30)
    train.add_argument("--hidden", type=int, default=2048)
    train.add_argument("--batch", type=int, default=32)
    train.add_argument("--backends", default="rcoll,gloo")
    train.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    if args.command == "status" and args.store is None:
        args.store = f"torch://{os.environ.get('MASTER_ADDR', '127.0.0.1')}:{os.environ.get('MASTER_PORT', '29500')}"
    return {"info": _info, "demo": _demo, "train": _train, "status": _status, "doctor": _doctor}[args.command](args)


def _doctor(args) -> int:
    from rcoll import doctor

    return doctor.main(args)


def _status(args) -> int:
    from rcoll import job_status

    return job_status.main(args)


def _train(args) -> int:
    from rcoll.demos.training import run_training

    return run_training(args.world_size, args.steps, args.hidden, args.batch, args.backends.split(","),
                        args.timeout)


if __name__ == "__main__":
    sys.exit(main())
