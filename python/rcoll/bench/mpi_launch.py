"""The mpi backends' launcher: the sweep's ranks under mpirun (launched_rank),
their rows read back from the files each rank writes (rank_files)."""
from __future__ import annotations

import json
import os
import sys

from .rank_files import LauncherFailed, collect_rank_files

# Open MPI through mpi4py, started by mpirun (see run_mpi): "mpi" over TCP on loopback only
# (the ob1 PML with the tcp BTL; vader, Open MPI's shared-memory BTL, is excluded so
# that bytes really cross sockets, as rcoll's and gloo's do), "mpi-shm" over shared memory.
MPI_BTL_ARGS = {
    "mpi": ["--mca", "pml", "ob1", "--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo"],
    "mpi-shm": ["--mca", "pml", "ob1", "--mca", "btl", "vader,self"],
}


def mpi_missing():
    """None if mpirun and mpi4py are usable, else a one-line reason."""
    import importlib.util
    import shutil
    if shutil.which("mpirun") is None:
        return "mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"
    if importlib.util.find_spec("mpi4py") is None:
        return f"mpi4py is not installed for {sys.executable} (pip install mpi4py)"
    return None


def mpi_command(backend, world, cfg_path, out_dir, extra=()):
    return (["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", str(world),
             # like the spawned rcoll and gloo ranks: not pinned (Open MPI binds to cores by default)
             "--bind-to", "none"]
            + MPI_BTL_ARGS[backend] + list(extra)
            + [sys.executable, "-m", "rcoll.bench.launched_rank",
               "--cfg", cfg_path, "--out", out_dir, "--backend", backend, "--launcher", "mpi"])


def run_mpi(backend, world, cfg, timeout, extra=()):
    """Runs rank_sweep.rank_main under mpirun; returns (per-rank rows, the command line)."""
    import subprocess
    import tempfile
    with tempfile.TemporaryDirectory(prefix="rcoll-sweep-mpi-") as tmp:
        cfg_path = os.path.join(tmp, "cfg.json")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        cmd = mpi_command(backend, world, cfg_path, tmp, extra)
        print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
        env = dict(os.environ, OMPI_MCA_rmaps_base_oversubscribe="1")
        # stdout/stderr of the ranks (progress lines of rank 0) pass through to our stderr
        proc = subprocess.Popen(cmd, stdout=sys.stderr, stderr=sys.stderr, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            import signal
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            raise LauncherFailed(f"mpirun did not finish within {timeout} s (killed)") from None
        try:
            per_rank = collect_rank_files(tmp, world, f"mpirun ({backend})")
        except LauncherFailed as exc:
            raise LauncherFailed(f"{exc}\nmpirun exit status {rc}") from None
        if rc != 0:
            raise LauncherFailed(f"mpirun exited with status {rc} although every rank reported")
    return per_rank, cmd
