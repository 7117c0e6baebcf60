"""Rings whose edges use different transports: shared memory between ranks of
one host, the network between hosts (issue #9). RCOLL_HOSTID gives each rank a
host identity, so one machine builds any layout; the real identity rule (boot id
and network namespace) is checked with two namespaces. Results are exact
against numpy (the collective sweeps of collective_workers.py). Ranks run as
threads of this process (rank_threads.py: each rank's RCOLL_HOSTID reaches its
communicator as a setting), except where a rank is killed or runs torch."""
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
from support import collective_workers as cw
from support import device_workers as dw
from support import mixed_workers as w
from support import rank_threads
from support.common import EMULATED_DEVICE, SMALL_CHUNKS, dev_shm_names, every_rank_passed

import rcoll
from rcoll import spawn

HERE = os.path.dirname(os.path.abspath(__file__))


def _pythonpath(env):
    """PYTHONPATH for child interpreters: the rcoll this test imported first (a
    checkout's python/ has no built module when CI installs rcoll into a venv)."""
    return os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(rcoll.__file__)), env.get("PYTHONPATH")) if p)

# Host of each rank, one letter per rank.
LAYOUTS = ["AAB", "ABA", "AABB", "ABAB", "AAAB", "AAAABBBB", "ABABABAB", "AAAAAAAB", "AABBCCDD"]


@pytest.fixture(autouse=True)
def auto_transport(monkeypatch):
    monkeypatch.delenv("RCOLL_TRANSPORT", raising=False)
    monkeypatch.delenv("RCOLL_SHM_DISABLE", raising=False)


def _hosts(layout):
    return {"RCOLL_HOSTID": list(layout)}


def _expected_edges(layout, rank, network="tcp"):
    return ["self" if p == rank else "shm" if layout[p] == layout[rank] else network for p in range(len(layout))]


def _expected_name(layout, rank, network="tcp"):
    kinds = {k for k in _expected_edges(layout, rank, network) if k != "self"}
    return "shm+" + network if len(kinds) == 2 else kinds.pop()




@pytest.mark.parametrize("layout", ["ABAB", "AABBCCDD", "BAABA"])
def test_every_rank_computes_the_same_topology(layout):
    hosts = []  # each host's ranks, hosts in the order of their lowest rank
    for letter in dict.fromkeys(layout):
        hosts.append([r for r, h in enumerate(layout) if h == letter])
    expected = {"hosts": hosts, "host_of": [next(i for i, h in enumerate(hosts) if r in h) for r in range(len(layout))],
                "local_rank": [layout[:r].count(layout[r]) for r in range(len(layout))],
                "host_order": [r for h in hosts for r in h],
                "text": f"{len(hosts)} hosts: " + " ".join("[" + " ".join(map(str, h)) + "]" for h in hosts)}
    # Equal hosts of two or more ranks take the hierarchical algorithms; uneven ones the ring, saying why.
    uneven = len({len(h) for h in hosts}) > 1
    for rank, topology in enumerate(rank_threads.run(w.topology, len(layout), timeout=60, env=_hosts(layout))):
        algorithms = topology.pop("algorithms")
        assert topology == expected, (rank, topology)
        if uneven:
            assert "the ring in host order, not hierarchical:" in algorithms and "different numbers" in algorithms, \
                algorithms
        else:
            assert algorithms.endswith(": hierarchical"), algorithms


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_edge_gets_the_transport_of_its_hosts(layout):
    results = rank_threads.run(w.report, len(layout), timeout=120, env=_hosts(layout))
    for rank, (name, edges, ok) in enumerate(results):
        assert ok, f"rank {rank}: wrong allreduce/alltoall result"
        assert edges == _expected_edges(layout, rank), (rank, edges)
        assert name == _expected_name(layout, rank), (rank, name)


def test_forced_transports_apply_to_every_edge():
    layout = "AABB"
    for forced in ("tcp",):
        results = rank_threads.run(w.report, 4, timeout=120, env={**_hosts(layout), "RCOLL_TRANSPORT": forced})
        for rank, (name, edges, ok) in enumerate(results):
            assert ok and name == forced and edges == _expected_edges("ABCD", rank, forced), (rank, name, edges)
    results = rank_threads.run(w.report, 4, timeout=120, env={**_hosts(layout), "RCOLL_SHM_DISABLE": "1"})
    assert [name for name, _, _ in results] == ["tcp"] * 4
    # One rank that refuses shared memory turns only its own edges into TCP.
    results = rank_threads.run(w.report, 4, timeout=120,
                               env={**_hosts(layout), "RCOLL_SHM_DISABLE": ["1", "0", "0", "0"]})
    assert [edges for _, edges, _ in results] == [
        ["self", "tcp", "tcp", "tcp"], ["tcp", "self", "tcp", "tcp"],
        ["tcp", "tcp", "self", "shm"], ["tcp", "tcp", "shm", "self"]]
    assert all(ok for _, _, ok in results)


SWEEPS = {
    "allreduce": (cw.allreduce_sweep, SMALL_CHUNKS),
    "allreduce_default_chunks": (cw.allreduce_sweep, {}),
    "reduce_scatter": (cw.reduce_scatter_sweep, SMALL_CHUNKS),
    "allgather": (cw.allgather_sweep, SMALL_CHUNKS),
    "broadcast": (cw.broadcast_sweep, SMALL_CHUNKS),
    "reduce": (cw.reduce_sweep, SMALL_CHUNKS),
    "gather": (cw.gather_sweep, SMALL_CHUNKS),
    "scatter": (cw.scatter_sweep, SMALL_CHUNKS),
    "alltoall": (cw.alltoall_sweep, SMALL_CHUNKS),
    "large": (cw.large_sweep, {}),
    "barrier_send_recv": (w.barrier_and_ring_messages, {}),
}


@pytest.mark.parametrize("layout", ["ABA", "AABB", "ABAB", "AAAB", "AABBAABB", "AAAAAAAB"])
@pytest.mark.parametrize("sweep", sorted(SWEEPS))
def test_collectives_over_a_mixed_ring(layout, sweep):
    fn, env = SWEEPS[sweep]
    every_rank_passed(rank_threads.run(fn, len(layout), timeout=300, env={**env, **_hosts(layout)}))


# Placements the matrix above leaves out: 2 hosts x 3 ranks and 3 hosts x 2
# interleaved (hierarchical), and the flat ring across hosts on request.
@pytest.mark.parametrize("layout,algo", [("AAABBB", "auto"), ("ABCABC", "auto"), ("AABB", "ring")])
@pytest.mark.parametrize("sweep", ["allreduce_sweep", "allgather_sweep", "reduce_scatter_sweep"])
def test_matrices_across_hosts(layout, algo, sweep):
    env = {**SMALL_CHUNKS, **_hosts(layout), "RCOLL_ALGO": algo}
    every_rank_passed(rank_threads.run(getattr(cw, sweep), len(layout), timeout=300, env=env))


# Many more segments per block than the host executor's send window (64): the
# hierarchical phases inside and across hosts share that window, and a rank
# whose window filled with sends waiting on a local receiver once starved the
# sends across and stalled every rank (until the op timeout). 4 KiB chunks and
# rings and 16 KiB socket buffers make sends wait on their receivers, as
# buffers of hundreds of MiB do at the defaults.
@pytest.mark.parametrize("layout", ["AABB", "AAAABBBB"])
def test_long_schedules_across_hosts(layout):
    env = {**_hosts(layout), "RCOLL_CHUNK_BYTES": "4K", "RCOLL_MIN_CHUNK_BYTES": "4K", "RCOLL_SHM_RING_BYTES": "4K",
           "RCOLL_SOCKET_BUFFER_BYTES": "16K"}
    every_rank_passed(rank_threads.run(w.long_schedules, len(layout), timeout=120, env=env))


# GPU buffers (the emulated device runtime, tests/device/emulated_device/): staged
# through pinned host memory on every edge, the hierarchical allreduce on the
# device executor; one staging slot per direction must not deadlock it, nor
# two (where sends to one peer may take a slot ahead of schedule order).
@pytest.mark.usefixtures("emulated_device_runtime")
@pytest.mark.parametrize("layout,sweep,slots",
                         [("ABAB", "allreduce_sweep", "8"), ("AAABBB", "every_collective_once", "1"),
                          ("AABB", "allreduce_sweep", "2")])
def test_device_collectives_across_hosts(layout, sweep, slots):
    env = {**EMULATED_DEVICE, **SMALL_CHUNKS, **_hosts(layout), "RCOLL_PIPELINE_SLOTS": slots}
    every_rank_passed(rank_threads.run(getattr(dw, sweep), len(layout), timeout=300, env=env))


# GPU buffers across hosts with each host's ranks as processes: allreduce,
# allgather, reduce_scatter and broadcast run inside each host through the
# device windows (CUDA IPC), and only each local index's share (broadcast: the
# root's local index) crosses between the hosts (cuda_ipc_collectives.h). Every dtype, op and size, checked exactly; and
# every collective once, where the other device ops (staged) come between
# ops through the windows.
@pytest.mark.usefixtures("emulated_device_runtime")
@pytest.mark.parametrize("layout,sweep", [("AABB", "allreduce_sweep"), ("ABAB", "allreduce_sweep"),
                                          ("AAABBB", "allreduce_sweep"), ("AABBCC", "allreduce_sweep"),
                                          ("ABAB", "allgather_sweep"), ("AAABBB", "allgather_sweep"),
                                          ("ABCABC", "allgather_sweep"), ("AABB", "reduce_scatter_sweep"),
                                          ("ABAB", "reduce_scatter_sweep"), ("AABBCC", "reduce_scatter_sweep"),
                                          ("AABB", "broadcast_sweep"), ("ABCABC", "broadcast_sweep"),
                                          ("AAABBB", "broadcast_sweep"), ("AABB", "every_collective_once")])
def test_device_collectives_across_hosts_through_cuda_ipc_windows(tmp_path, layout, sweep):
    env = {**EMULATED_DEVICE, **SMALL_CHUNKS, **_hosts(layout), "EXPECT_DEVICE_PATH": "cuda-ipc+staging",
           "RCOLL_TIMELINE": str(tmp_path / "trace")}
    every_rank_passed(spawn.run(getattr(dw, sweep), len(layout), timeout=300, env=env))
    for rank in range(len(layout)):
        events = json.loads((tmp_path / f"trace.rank{rank}.json").read_text())
        algorithms = {e["args"]["algorithm"] for e in events if e.get("cat") == "op"
                      and e["args"]["op"].startswith(("allreduce(", "allgather(", "reduce_scatter(", "broadcast("))}
        assert algorithms == {"hierarchical (cuda ipc windows in each host)"}, (rank, algorithms)


# Across hosts, allgather, reduce_scatter and broadcast of device buffers under
# RCOLL_CUDA_IPC_HOSTS_MIN_BYTES stage on every edge (their phases do not
# overlap: the windows cost more than they save there), from it on they take
# the windows; the ranks agree on the way by the size alone (the allreduce is
# not affected). The other tests set it to 0, to run the windows at every size.
@pytest.mark.usefixtures("emulated_device_runtime")
def test_small_device_ops_across_hosts_stage_below_the_windows_threshold(tmp_path):
    limit = 8 << 10
    env = {**EMULATED_DEVICE, **SMALL_CHUNKS, **_hosts("AABB"), "RCOLL_CUDA_IPC_HOSTS_MIN_BYTES": str(limit),
           "RCOLL_TIMELINE": str(tmp_path / "trace")}
    results = spawn.run(dw.around_the_windows_threshold, 4, timeout=300, env=env)
    for rank, (paths, failures) in enumerate(results):
        assert failures == [], (rank, failures)
        assert paths == [(op, whole, "staging" if whole < limit else "cuda-ipc+staging")
                         for whole in (limit - 16, limit) for op in ("allgather", "reduce_scatter", "broadcast")]
        events = json.loads((tmp_path / f"trace.rank{rank}.json").read_text())
        ops = [e["args"] for e in events if e.get("cat") == "op"]
        assert len(ops) == 6, (rank, ops)
        windows = [a["algorithm"] == "hierarchical (cuda ipc windows in each host)" for a in ops]
        assert windows == [False] * 3 + [True] * 3, (rank, ops)


# Work still queued on the caller's stream when a device op is called: the
# input written late, junk written late into the output. Every op through the
# windows and between the hosts waits for it, on the ranks that send and on
# those that only receive (the other hosts of a broadcast, whose chain writes
# the buffer off the windows' stream).
@pytest.mark.usefixtures("emulated_device_runtime")
@pytest.mark.parametrize("layout,ipc,path", [("AABB", "1", "cuda-ipc+staging"), ("ABCABC", "1", "cuda-ipc+staging"),
                                             ("AABB", "0", "staging")])
def test_device_ops_across_hosts_wait_for_the_callers_stream(layout, ipc, path):
    env = {**EMULATED_DEVICE, **SMALL_CHUNKS, **_hosts(layout), "RCOLL_CUDA_IPC": ipc, "EXPECT_DEVICE_PATH": path}
    every_rank_passed(spawn.run(dw.waits_for_the_callers_stream, len(layout), timeout=300, env=env))


# One host that cannot take the windows: its GPUs cannot reach each other (no
# peer access), or it has none (rank 0 refuses shared memory, so host A's ranks
# talk over TCP) and still answers the other hosts at the windows' set-up.
# Every host stages instead, since the wire protocols of the two paths differ;
# results stay right and nobody waits for a host that took the other path.
@pytest.mark.usefixtures("emulated_device_runtime")
@pytest.mark.parametrize("why,setting", [
    ("no_peer_access", {"EMULATED_DEVICE_ID": ["gpu:0", "gpu:0", "gpu:1", "gpu:2"]}),
    ("no_windows", {"RCOLL_SHM_DISABLE": ["1", "0", "0", "0"]})])
def test_a_host_without_cuda_ipc_sends_every_host_to_staging(why, setting):
    env = {**EMULATED_DEVICE, **SMALL_CHUNKS, **_hosts("AABB"), "EXPECT_DEVICE_PATH": "staging", **setting}
    every_rank_passed(spawn.run(dw.allreduce_sweep, 4, timeout=300, env=env))


# A rank killed (SIGKILL) while device allreduces (or broadcasts from rank 0)
# run through the windows and between the hosts: its host's ranks wait on it
# in a window, its local index's ranks on the other host in the ring (the
# chain) between the hosts; every survivor raises PeerError naming it, well
# within the op timeout.
@pytest.mark.usefixtures("emulated_device_runtime")
@pytest.mark.parametrize("op", ["allreduce", "broadcast"])
@pytest.mark.parametrize("victim", [1, 2])
def test_a_rank_killed_mid_device_op_across_hosts_is_named_by_every_survivor(tmp_path, victim, op):
    from support import kill_workers

    op_timeout = 20.0
    kill_file = tmp_path / "kill"
    env = {**EMULATED_DEVICE, **_hosts("AABB"), "RCOLL_CUDA_IPC_SLOT_BYTES": "1M"}
    results = spawn.run(kill_workers.allreduce_until_killed, 4, victim, 0.3, str(kill_file), op_timeout, 4 << 20,
                        True, op, timeout=60 + op_timeout, allow_failures=True, grace=op_timeout + 5, env=env)
    assert kill_file.exists(), results
    kill_time = float(kill_file.read_text().split()[0])
    assert results[victim] == ("error", f"rank {victim} died with exit code -9"), results[victim]
    for rank, outcome in enumerate(results):
        if rank == victim:
            continue
        name, message, error_time = outcome[0], outcome[1], outcome[2] if len(outcome) > 2 else None
        assert name == "PeerError", (rank, outcome)
        assert f"rank {victim}" in message, (rank, message)
        assert error_time - kill_time < op_timeout / 2, (rank, error_time - kill_time, message)


# Hosts that disagree on the reduce op (avg on host A, sum on host B) agree
# inside each host; the headers between the hosts carry the op and tell them
# apart: a MismatchError naming both calls, every rank failing fast.
@pytest.mark.usefixtures("emulated_device_runtime")
def test_hosts_that_disagree_on_the_reduce_op_fail_with_a_mismatch():
    env = {**EMULATED_DEVICE, **_hosts("AABB")}
    results = spawn.run(dw.op_per_rank, 4, ["avg", "avg", "sum", "sum"], timeout=120, env=env)
    assert all(name != "ok" and seconds < 15 for name, _, seconds in results), results
    mismatches = [message for name, message, _ in results if name == "MismatchError"]
    assert mismatches and all("avg" in m and "sum" in m for m in mismatches), results


# The allreduce and allgather algorithm, as each rank's timeline names it:
# hierarchical where several hosts have the same number (>= 2) of ranks, else
# the ring in host order.
@pytest.mark.parametrize("layout,algo,expected", [
    ("AABB", "auto", "hierarchical"), ("ABAB", "auto", "hierarchical"), ("AABB", "ring", "ring"),
    ("AAAB", "auto", "ring"), ("AAAB", "hierarchical", "ring"), ("ABCD", "auto", "ring")])
def test_algorithm_follows_the_topology(tmp_path, layout, algo, expected):
    env = {**_hosts(layout), "RCOLL_ALGO": algo, "RCOLL_TIMELINE": str(tmp_path / "trace")}
    results = rank_threads.run(w.allreduce_allgather_then_shutdown, len(layout), timeout=60, env=env)
    assert results == [True] * len(layout)
    for rank in range(len(layout)):
        # Ranks as threads share a process: its later communicators' files are trace.rank<r>.comm<k>.json.
        (path,) = tmp_path.glob(f"trace.rank{rank}.*json")
        events = json.loads(path.read_text())
        ops = [e for e in events if e.get("cat") == "op"]
        assert [op["args"]["algorithm"] for op in ops] == [expected, expected, "bruck"], (rank, ops)


@pytest.mark.parametrize("layout,victim", [("AABB", 3), ("ABAB", 1), ("AAAB", 0)])
def test_kill_9_in_a_mixed_ring_fails_every_survivor(layout, victim):
    before = dev_shm_names()
    world = len(layout)
    results = spawn.run(w.killed_mid_collective, world, victim, timeout=90, env=_hosts(layout), allow_failures=True)
    assert results[victim][0] == "error"
    for rank in range(world):
        if rank == victim:
            continue
        name, message, seconds, edges = results[rank]
        assert edges == _expected_edges(layout, rank)
        assert name == "PeerError", (rank, message)
        assert f"rank {victim}" in message and "allreduce(float32, count=4194304, op=sum)" in message, (rank, message)
        assert seconds < 20, (rank, seconds, message)  # seen on the edge, not at the 60 s op timeout
    assert dev_shm_names() - before == set()


@pytest.mark.parametrize("layout,aborter", [("AABB", 0), ("ABAB", 3)])
def test_abort_crosses_both_kinds_of_edge(layout, aborter):
    results = rank_threads.run(w.abort_reaches_everyone, len(layout), aborter, timeout=90, env=_hosts(layout))
    for rank, (name, message, seconds) in enumerate(results):
        assert seconds < 20, (rank, seconds, message)
        if rank == aborter:
            assert name == "AbortedError", message
        else:
            assert name in ("PeerError", "AbortedError"), (rank, name, message)
            assert f"rank {aborter} gives up on purpose" in message, (rank, message)


def test_transport_shm_across_hosts_is_a_config_error_naming_the_rank():
    results = rank_threads.run(w.init_outcome, 4, timeout=90, env={**_hosts("AABB"), "RCOLL_TRANSPORT": "shm"})
    for rank, (name, message) in enumerate(results):
        other = 2 if rank < 2 else 0  # the lowest rank on the other host
        assert name == "ConfigError", (rank, message)
        assert f"rank {rank}: RCOLL_TRANSPORT=shm but rank {other} runs on another host" in message, message


def test_torch_all_reduce_over_a_mixed_ring():
    pytest.importorskip("torch")
    layout = "AABB"
    results = spawn.run(w.torch_all_reduce, 4, timeout=180, env=_hosts(layout))
    for rank, (failures, edges) in enumerate(results):
        assert failures == [], (rank, failures)
        assert edges == _expected_edges(layout, rank), (rank, edges)


# --- the real identity rule: two network namespaces -----------------------------------------

def _netns_unavailable():
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    probe = f"rcoll-edge-probe-{os.getpid()}"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"`ip netns add` does not work here: {r.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def _sh(*cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"`{' '.join(cmd)}` failed: {r.stderr.strip()}"


def test_two_namespaces_use_shm_inside_and_tcp_across(tmp_path):
    why = _netns_unavailable()
    if why:
        pytest.skip(why)
    tag = f"rcoll-edge-{os.getpid()}"
    spaces = [f"{tag}-a", f"{tag}-b"]
    addrs = ["198.18.0.1", "198.18.0.2"]
    procs = []
    try:
        for ns in spaces:
            _sh("ip", "netns", "add", ns)
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
        _sh("ip", "-n", spaces[0], "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns", spaces[1])
        for ns, addr in zip(spaces, addrs):
            _sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
            _sh("ip", "-n", ns, "link", "set", "eth0", "up")
        env = {k: v for k, v in os.environ.items() if not k.startswith("RCOLL_")}
        env.update(PYTHONPATH=_pythonpath(env),
                   WORLD_SIZE="4", MASTER_ADDR=addrs[0], MASTER_PORT="29517")
        for rank in range(4):
            out = open(tmp_path / f"rank{rank}.out", "w")
            procs.append(subprocess.Popen(
                ["ip", "netns", "exec", spaces[rank // 2], sys.executable, os.path.join(HERE, "netns_rank.py")],
                env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank % 2)), stdout=out, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + 120
        for p in procs:
            p.wait(timeout=max(1, deadline - time.monotonic()))
        outputs = [(tmp_path / f"rank{rank}.out").read_text() for rank in range(4)]
        for rank, p in enumerate(procs):
            assert p.returncode == 0, f"rank {rank}: exit {p.returncode}: {outputs[rank][-3000:]}"
        for rank, text in enumerate(outputs):
            seen = json.loads(text.strip().splitlines()[-1])
            assert seen["failures"] == [], (rank, seen["failures"])
            assert seen["transports"] == _expected_edges("AABB", rank), (rank, seen)
            assert seen["transport"] == "shm+tcp", (rank, seen)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
        for ns in spaces:  # deleting a namespace deletes its end of the veth, and so the pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def test_a_waiting_composite_sleeps_instead_of_spinning():
    # Ranks 0 and 1 run shm+tcp; rank 2 (alone on host B) comes 2 s late.
    results = spawn.run(w.idle_wait_cpu, 3, timeout=60, env=_hosts("AAB"))
    for rank, (name, cpu, wall, ok) in enumerate(results[:2]):
        assert ok and name == "shm+tcp", (rank, name)
        assert wall > 1.5, (rank, wall)  # it did wait for rank 2
        assert cpu < 0.5, f"rank {rank} burnt {cpu:.2f} s of CPU in a {wall:.2f} s wait"


def test_info_prints_this_hosts_identity_and_the_rule():
    env = dict(os.environ, RCOLL_HOSTID="rack7-node3", PYTHONPATH=_pythonpath(os.environ))
    out = subprocess.run([sys.executable, "-m", "rcoll", "info"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "identity    hostid:rack7-node3 (RCOLL_HOSTID)" in out.stdout, out.stdout
    assert "per pair of ranks: shared memory when both have this identity" in out.stdout, out.stdout
    # The data interfaces a communicator would take here, and why (docs/network.md).
    assert re.search(r"network     data interfaces \S+ \S+/\d+.* \((default|RCOLL_SOCKET_IFNAME=.*)\)",
                     out.stdout), out.stdout


def test_info_under_a_launcher_prints_the_jobs_topology():
    """`python -m rcoll info` started by a launcher (RANK, WORLD_SIZE, LOCAL_RANK
    as torchrun sets them) joins the job: rank 0 prints the topology every rank
    computed, the algorithms and each rank's edges; each host's local rank 0
    its machine report; the others nothing. Every rank exits 0, stderr empty."""
    from rcoll.spawn import free_port

    layout = "ABAB"
    base = dict(os.environ, PYTHONPATH=_pythonpath(os.environ), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
                WORLD_SIZE=str(len(layout)))
    base.pop("RCOLL_DEBUG", None)
    procs = []
    for rank, host in enumerate(layout):
        env = dict(base, RANK=str(rank), LOCAL_RANK=str(layout[:rank].count(host)), RCOLL_HOSTID=host)
        procs.append(subprocess.Popen([sys.executable, "-m", "rcoll", "info"], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = [p.communicate(timeout=120) for p in procs]
    for rank, (p, (_out, err)) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and err == "", (rank, p.returncode, err)
    report = outs[0][0]
    assert "job: 4 ranks" in report and "topology    2 hosts: [0 2] [1 3]" in report, report
    assert "ring order  0 2 1 3" in report, report
    assert "algorithms  allgather, reduce_scatter and allreduce above" in report and ": hierarchical" in report, report
    for rank, edges in enumerate([".tst", "t.ts", "st.t", "tst."]):
        host, local = layout[rank], layout[:rank].count(layout[rank])
        assert f"rank {rank:<5} host {'AB'.index(host):<4} local {local:<4} {edges}" in report, report
    assert "identity    hostid:B (RCOLL_HOSTID)" in outs[1][0] and "job:" not in outs[1][0], outs[1][0]
    assert outs[2][0] == "" and outs[3][0] == "", outs[2:]
    assert "data interfaces (RCOLL_SOCKET_IFNAME, RCOLL_SOCKET_FAMILY)" in report, report
    for rank in range(4):  # each rank's own choice, gathered
        assert re.search(rf"\n    rank {rank:<5} \S+ \S+/\d+", report), report
