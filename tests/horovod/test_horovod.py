"""rcoll.horovod.torch run the way Horovod users run it: job scripts under
torchrun and under Open MPI's environment (tests/horovod/*_job.py), each
checking its own results exactly, every rank's exit code and stderr checked.
Horovod's own test/parallel/test_torch.py is run against it by hand
(docs/horovod.md gives its counts): it is not in Horovod's sdist."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import launch
from support.emulated_hosts import TwoHosts, mpirun_on_hosts, needs_netns, torchrun_on_hosts

pytestmark = pytest.mark.slow
JOBS = Path(__file__).parent
# torch's TCPStore (torchrun's rendezvous) warns that no name resolves for emulated hosts' addresses.
TORCH_WARNINGS = (r"\[c10d\] The hostname of the client socket cannot be retrieved",)


@pytest.mark.parametrize("world", [1, 2, 3])
def test_collectives_under_torchrun(tmp_path, world):
    launch.torchrun(launch.write_script(tmp_path, (JOBS / "collectives_job.py").read_text()), world, tmp_path)


def test_timeline_from_environment(tmp_path):
    """HOROVOD_TIMELINE=path at start: rank 0 writes the whole job's ops, a JSON array once the job ends."""
    timeline = tmp_path / "timeline.json"
    launch.torchrun(launch.write_script(tmp_path, (JOBS / "collectives_job.py").read_text()), 2, tmp_path,
                    env={"HOROVOD_TIMELINE": str(timeline)})
    events = json.loads(timeline.read_text())
    rows = {e["args"]["name"] for e in events if e.get("name") == "process_name" and e["pid"]}
    assert {"allreduce.t0", "allgather.noname.0", "broadcast.noname.0"} <= rows, sorted(rows)
    assert any(e.get("name") == "NEGOTIATE_ALLREDUCE" for e in events)


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_adasum_and_cached_negotiation_under_torchrun(tmp_path, world):
    launch.torchrun(launch.write_script(tmp_path, (JOBS / "adasum_job.py").read_text()), world, tmp_path)


@pytest.mark.parametrize("world, env", [(1, {}), (2, {}), (3, {}), (4, {}), (2, {"RCOLL_HOROVOD_INLINE_BYTES": "0"}),
                                        (3, {"RCOLL_HOROVOD_INLINE_BYTES": "16"})],
                         ids=["1", "2", "3", "4", "2-off", "3-16B"])
def test_small_named_allreduce_finishes_in_the_round_that_agrees_on_it(tmp_path, world, env):
    launch.torchrun(launch.write_script(tmp_path, (JOBS / "inline_job.py").read_text()), world, tmp_path, env=env)


def test_a_rank_with_another_cache_capacity_takes_rank_0s(tmp_path):
    """HOROVOD_CACHE_CAPACITY=2 on rank 1 alone (inline_job.py's hundreds of names overflow two slots):
    rank 1 warns once per process set and uses rank 0's, so a slot names the same op on every rank."""
    script = launch.write_script(tmp_path, (JOBS / "inline_job.py").read_text())
    port = str(launch.free_port())
    launch.run_ranks(script, [{"RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r), "MASTER_ADDR": "127.0.0.1",
                               "MASTER_PORT": port, **({"HOROVOD_CACHE_CAPACITY": "2"} if r else {})}
                              for r in range(2)],
                     allow=(r"WARN: rank 1: HOROVOD_CACHE_CAPACITY=2 differs from rank 0's 1024; process set \d+ "
                            r"uses rank 0's",))


def _last_rank_killed(script, world, env, timeout):
    """Runs `script` as `world` processes started as a scheduler starts ranks (RANK, WORLD_SIZE: nothing kills
    the others when one dies); the last one must die by SIGKILL. Returns the others' (exit code, stdout, stderr)."""
    port = str(launch.free_port())
    procs = [subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=launch._clean_env({"RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r),
                                                     "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, **env}))
             for r in range(world)]
    try:
        outputs = [p.communicate(timeout=timeout) for p in procs]
    finally:
        launch.kill_leftovers(procs)
    assert procs[-1].returncode == -signal.SIGKILL, (procs[-1].returncode, outputs[-1][1][-3000:])
    return [(p.returncode, out, err) for p, (out, err) in zip(procs[:-1], outputs[:-1])]


@pytest.mark.parametrize("world", [2, 3])
def test_a_rank_killed_between_inline_allreduces_fails_the_others_without_a_hang(tmp_path, world):
    """The last rank SIGKILLs itself in a loop of small named allreduces (started as a scheduler starts
    ranks, so nothing kills the others): each other rank's next allreduce raises HorovodInternalError."""
    script = launch.write_script(tmp_path, (JOBS / "inline_job.py").read_text())
    for rank, (returncode, _, err) in enumerate(_last_rank_killed(script, world, {"KILL_AT": "30"}, timeout=60)):
        assert returncode == 0, f"rank {rank} exited {returncode}:\n{err[-4000:]}"


def test_script_without_launcher_runs_as_one_process(tmp_path):
    """`python train.py` with no launcher: one rank, as in Horovod."""
    launch.run_ranks(launch.write_script(tmp_path, (JOBS / "adasum_job.py").read_text()), [{}])


@pytest.mark.parametrize("world", [1, 2, 3])
def test_sync_batch_norm_matches_batch_norm_on_the_whole_batch(tmp_path, world):
    launch.torchrun(launch.write_script(tmp_path, (JOBS / "sync_batch_norm_job.py").read_text()), world, tmp_path)


@pytest.mark.parametrize("world", [2, 3])
def test_errors_join_and_process_sets_under_torchrun(tmp_path, world):
    launch.torchrun(launch.write_script(tmp_path, (JOBS / "errors_job.py").read_text()), world, tmp_path)


@pytest.mark.parametrize("env", [{}, {"FP16": "1"}, {"GROUPS": "2"}, {"HOROVOD_FUSION_THRESHOLD": "0"}],
                         ids=["fused", "fp16", "groups", "unfused"])
def test_distributed_optimizer_matches_single_process_training(tmp_path, env):
    launch.torchrun(launch.write_script(tmp_path, (JOBS / "optimizer_job.py").read_text()), 2, tmp_path, env=env)


SMALL_RUN = ["--path", "horovod", "--batch-size", "4", "--image", "32", "--width", "8", "--num-warmup-batches", "1",
             "--num-batches-per-iter", "2", "--num-iters", "2"]


def _synthetic(tmp_path, check=""):
    """A job that runs Horovod's synthetic benchmark loop (bench/horovod_synthetic.py), small,
    after `check` (lines run once hvd.init() returned)."""
    bench = Path(__file__).parents[2] / "bench"
    return launch.write_script(tmp_path, f"""
        import sys
        import rcoll.horovod.torch as hvd
        sys.path.insert(0, {str(bench)!r})
        import horovod_synthetic
        hvd.init()
        {check}
        horovod_synthetic.main({SMALL_RUN!r})
        """)


@pytest.mark.parametrize("world", [2, 4])
def test_synthetic_training_under_torchrun(tmp_path, world):
    """Horovod's training loop: every rank exits 0 with rank 0's parameters (the script checks)."""
    launch.torchrun(_synthetic(tmp_path), world, tmp_path, timeout=300)


@needs_netns()
@pytest.mark.timeout(400)
def test_synthetic_training_across_two_emulated_hosts(tmp_path):
    """`horovodrun -np 4 -H a:2,b:2` as `torchrun --nnodes 2 --nproc-per-node 2` on each host (docs/horovod.md):
    two ranks per host, Horovod's local and cross ranks from rcoll's topology, the loop's result the same everywhere."""
    script = _synthetic(tmp_path, check="assert (hvd.size(), hvd.local_size(), hvd.cross_size()) == (4, 2, 2)")
    with TwoHosts(addrs=("198.18.14.1", "198.18.14.2"), tag="hvd") as hosts:
        outcomes = torchrun_on_hosts(hosts, script, tmp_path, nproc=2)
    for node, (code, err) in enumerate(outcomes):
        logs = sorted((tmp_path / f"node{node}").glob("*/attempt_*/*"))
        assert code == 0, f"node {node}'s torchrun exited {code}\n{err[-3000:]}"
        assert len(logs) == 2, logs
        for rank_dir in logs:
            launch.check_rank_output(f"node {node} rank {rank_dir.name}", (rank_dir / "stdout.log").read_text(),
                                     (rank_dir / "stderr.log").read_text(), allow=TORCH_WARNINGS)


@needs_netns()
@pytest.mark.timeout(400)
@pytest.mark.parametrize("placement", ["-H", "--hostfile"])
def test_synthetic_training_under_mpirun_across_two_emulated_hosts(tmp_path, placement):
    """`horovodrun -np 4 -H a:2,b:2` (or `--hostfile`, and `--network-interface eth0`) as
    `mpirun -np 4 -H a:2,b:2 -x MASTER_ADDR=a -x RCOLL_SOCKET_IFNAME=eth0` (docs/horovod.md): mpirun on
    host a starts host b's ranks through its remote shell; every rank exits 0 with the loop's result."""
    script = _synthetic(tmp_path, check="assert (hvd.size(), hvd.local_size(), hvd.cross_size()) == (4, 2, 2)")
    logs = tmp_path / "ranks"
    logs.mkdir()
    with TwoHosts(addrs=("198.18.15.1", "198.18.15.2"), tag="hmpi") as hosts:
        code, err = mpirun_on_hosts(
            hosts, [sys.executable, str(script)], logs, slots=2,
            hostfile=tmp_path / "hosts.txt" if placement == "--hostfile" else None,
            env={"MASTER_ADDR": hosts.spaces[0], "MASTER_PORT": str(launch.free_port()),
                 "RCOLL_SOCKET_IFNAME": "eth0"})
    assert code == 0, f"mpirun exited {code}\n{err[-3000:]}"
    ranks = sorted((logs / "1").glob("rank.*"))
    assert [r.name for r in ranks] == [f"rank.{r}" for r in range(4)], ranks
    for rank_dir in ranks:
        launch.check_rank_output(rank_dir.name, (rank_dir / "stdout").read_text(), (rank_dir / "stderr").read_text())


def test_synthetic_training_under_open_mpi_environment(tmp_path):
    port = str(launch.free_port())
    launch.run_ranks(_synthetic(tmp_path), [{"OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_SIZE": "2",
                                             "OMPI_COMM_WORLD_LOCAL_RANK": str(r), "MASTER_ADDR": "127.0.0.1",
                                             "MASTER_PORT": port} for r in range(2)], timeout=300)


@pytest.mark.parametrize("world", [2, 3])
def test_elastic_training_goes_on_after_a_rank_is_killed(tmp_path, world):
    """hvd.elastic.run: the last rank dies (SIGKILL) in the middle of an epoch; the others restore the last
    commit, shrink to the ranks that are left and finish every epoch with equal parameters (elastic_job.py
    checks). The ranks are started as a scheduler would (RANK, WORLD_SIZE), so nothing kills the survivors."""
    script = launch.write_script(tmp_path, (JOBS / "elastic_job.py").read_text())
    survivors = _last_rank_killed(script, world, {"ELASTIC_CHANGE": "kill"}, timeout=120)
    for rank, (returncode, out, err) in enumerate(survivors):
        assert returncode == 0, f"rank {rank} exited {returncode}:\n{err[-4000:]}"
        # rcoll says once which op failed because of the dead rank, and that it shrinks.
        launch.check_rank_output(f"rank {rank}", out, err, allow=(r"\[rcoll \d+ rank \d+\] WARN: rank \d+: ",))


@pytest.mark.parametrize("first, joiners", [(2, 1), (2, 2)])
def test_elastic_training_takes_in_ranks_started_later(tmp_path, first, joiners):
    """hvd.elastic.run: ranks started in the middle of training with RCOLL_ELASTIC_JOIN=1 and the job's store
    address join at the next commit; the job goes on at the larger size and every rank ends with the same
    parameters and momentum, every sample of every epoch trained on (elastic_job.py checks)."""
    script = launch.write_script(tmp_path, (JOBS / "elastic_job.py").read_text())
    port, flag = str(launch.free_port()), tmp_path / "training"
    common = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "JOINERS": str(joiners), "TRAINING_FLAG": str(flag),
              "ELASTIC_CHANGE": "join"}

    def start(env):
        return subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=launch._clean_env({**common, **env}))

    procs = [start({"RANK": str(r), "WORLD_SIZE": str(first), "LOCAL_RANK": str(r)}) for r in range(first)]
    try:
        deadline = time.monotonic() + 60
        while not flag.exists() and all(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        procs += [start({"RCOLL_ELASTIC_JOIN": "1"}) for _ in range(joiners)]
        outputs = [p.communicate(timeout=120) for p in procs]
    finally:
        launch.kill_leftovers(procs)
    for i, (p, (out, err)) in enumerate(zip(procs, outputs)):
        who = f"rank {i}" if i < first else f"newcomer {i - first}"
        assert p.returncode == 0, f"{who} exited {p.returncode}:\n{err[-4000:]}"
        launch.check_rank_output(who, out, err)


def _collectives_with_launcher_environment(tmp_path, world, environment):
    """collectives_job.py as one process per rank with the variables a launcher sets (`environment(rank, port)`)."""
    script = launch.write_script(tmp_path, (JOBS / "collectives_job.py").read_text())
    port = str(launch.free_port())
    launch.run_ranks(script, [environment(r, port) for r in range(world)])


def test_collectives_under_open_mpi_environment(tmp_path):
    """hvd.init() reads mpirun's OMPI_COMM_WORLD_* (Kubeflow's MPIJob runs Horovod this way)."""
    _collectives_with_launcher_environment(tmp_path, 3, lambda r, port: {
        "OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_SIZE": "3", "OMPI_COMM_WORLD_LOCAL_RANK": str(r),
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})


def test_collectives_under_horovod_environment(tmp_path):
    """Horovod's own HOROVOD_RANK / HOROVOD_SIZE beside its Gloo rendezvous address."""
    _collectives_with_launcher_environment(tmp_path, 2, lambda r, port: {
        "HOROVOD_RANK": str(r), "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": str(r),
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1", "HOROVOD_GLOO_RENDEZVOUS_PORT": port})


def test_import_needs_no_horovod():
    """The front end exposes Horovod's names (Horovod itself need not be installed)."""
    import rcoll.horovod.torch as hvd

    for name in ["init", "allreduce_async_", "grouped_reducescatter", "DistributedOptimizer", "ProcessSet",
                 "broadcast_optimizer_state", "Compression", "HorovodInternalError", "join", "Adasum"]:
        assert hasattr(hvd, name), name
