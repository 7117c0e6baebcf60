"""The device (GPU) data path, end to end, on machines without a GPU.

RCOLL_DEVICE_RUNTIME=rcoll_emulated_device installs a host-memory emulation of
the device API (tests/device/emulated_device/, built for the tests) instead of CUDA: streams
are worker threads that complete work late and out of order, "device" memory
is host memory. Buffers expose __cuda_array_interface__ over numpy arrays
(device_workers.HostBackedDeviceArray), so everything but CUDA itself runs:
the Python checks, the caller-stream event, the pinned staging pipeline
(D2H -> network -> H2D + reduction), the completion event, the errors, for
allreduce, allgather, broadcast, reduce_scatter, reduce, gather and scatter.

What this does NOT check is CUDA: the kernels (tests/device/test_cuda.py), real
copies, real streams and torch CUDA tensors (tests/device/test_cuda_collectives.py,
which needs a GPU).
"""
import os

import pytest
from support import device_workers as w
from support import rank_threads
from support.common import EMULATED_DEVICE as EMULATE
from support.common import SMALL_CHUNKS, every_rank_passed

from rcoll import spawn

pytestmark = pytest.mark.usefixtures("emulated_device_runtime")
OPS_CALLED = ("allreduce", "allgather", "broadcast")


# "shm": every rank on one host, so device ops go through the CUDA IPC
# windows (emulated: memfd-backed "device" memory mapped by the peers);
# "shm-staging": the same with RCOLL_CUDA_IPC=0, pinned staging over the shm
# ring; "tcp": staging over sockets. Workers check which path ran.
@pytest.fixture(autouse=True, params=["shm", "shm-staging", "tcp"])
def transport(request, monkeypatch):
    monkeypatch.setenv("RCOLL_TRANSPORT", request.param.split("-")[0])
    monkeypatch.setenv("RCOLL_CUDA_IPC", "0" if request.param == "shm-staging" else "1")
    return request.param


def run_ranks(fn, world, *args, **kwargs):
    """Ranks as threads of this process (rank_threads.py), except where the CUDA
    IPC windows serve the op: a process cannot open its own IPC handles (CUDA's
    rule, which the emulation keeps), so those ranks are processes."""
    ipc = os.environ["RCOLL_TRANSPORT"] == "shm" and os.environ["RCOLL_CUDA_IPC"] == "1"
    return (spawn.run if ipc else rank_threads.run)(fn, world, *args, **kwargs)


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("chunks", ["small", "default"])
def test_allreduce_every_dtype_and_op(world, chunks):
    # small: many segments and steps, and the sliced IPC allreduce (direct 0).
    small = dict(SMALL_CHUNKS, RCOLL_CUDA_IPC_DIRECT_BYTES="0")
    env = dict(EMULATE, **(small if chunks == "small" else {}))
    every_rank_passed(run_ranks(w.allreduce_sweep, world, timeout=240, env=env))


def test_world_of_one_copies_and_divides_on_the_device(transport):
    if transport == "tcp":
        pytest.skip("a world of one has no transport")
    every_rank_passed(run_ranks(w.allreduce_sweep, 1, timeout=120, env=EMULATE))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_allgather(world):
    every_rank_passed(run_ranks(w.allgather_sweep, world, timeout=240, env=dict(EMULATE, **SMALL_CHUNKS)))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_broadcast_from_every_root(world):
    every_rank_passed(run_ranks(w.broadcast_sweep, world, timeout=240, env=dict(EMULATE, **SMALL_CHUNKS)))


@pytest.mark.parametrize("world", [2, 3, 4])
def test_reduce_scatter(world):
    every_rank_passed(run_ranks(w.reduce_scatter_sweep, world, timeout=240, env=dict(EMULATE, **SMALL_CHUNKS)))


@pytest.mark.parametrize("world", [2, 3])
def test_reduce_gather_scatter_from_every_root(world):
    every_rank_passed(run_ranks(w.rooted_sweep, world, timeout=240, env=dict(EMULATE, **SMALL_CHUNKS)))


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_alltoall(world, transport):
    if world == 1 and transport == "tcp":
        pytest.skip("a world of one has no transport")
    every_rank_passed(run_ranks(w.alltoall_sweep, world, timeout=240, env=dict(EMULATE, **SMALL_CHUNKS)))


def test_alltoall_argument_errors_name_the_rank(transport):
    if transport != "shm":
        pytest.skip("checked once: the errors are raised before any transfer")
    for messages, result in run_ranks(w.alltoall_errors, 2, timeout=60, env=EMULATE):
        assert all(m is not None and m.startswith("rank ") and "alltoall" in m for m in messages), messages
        assert "host memory" in messages[0] and "pass out=" in messages[1] and "in place" in messages[2], messages
        assert "dtype" in messages[3] and "not a multiple of the world size" in messages[4], messages
        assert result == [1.0] * 8


@pytest.mark.parametrize("world", [2, 3])
def test_one_staging_slot_per_direction_cannot_deadlock(world):
    env = dict(EMULATE, **SMALL_CHUNKS, RCOLL_PIPELINE_SLOTS="1")
    every_rank_passed(run_ranks(w.every_collective_once, world, timeout=120, env=env))


@pytest.mark.parametrize("world", [2, 3])
def test_the_op_waits_for_work_queued_on_the_callers_stream(world):
    every_rank_passed(run_ranks(w.waits_for_the_callers_stream, world, timeout=120, env=dict(EMULATE, **SMALL_CHUNKS)))


@pytest.mark.parametrize("world", [2, 4])
def test_device_and_host_ops_in_flight_together(world):
    every_rank_passed(run_ranks(w.many_async, world, timeout=120, env=dict(EMULATE, **SMALL_CHUNKS)))


@pytest.mark.parametrize("world", [2, 3])
def test_a_rank_without_peer_access_turns_cuda_ipc_off_for_all(world, transport):
    if transport != "shm":
        pytest.skip("CUDA IPC is only tried when every rank shares memory")
    for rank, (path, cases, failures) in enumerate(spawn.run(w.rank_without_peer_access, world, timeout=120,
                                                             env=EMULATE)):
        assert path == "staging", (rank, path)
        assert cases > 0 and failures == [], (rank, failures)


@pytest.mark.parametrize("kind", ["count", "dtype", "memory"])
def test_mismatch_names_both_ranks(kind, transport):
    if kind == "memory" and transport == "tcp":
        pytest.skip("over the ring, host and device buffers of one op interoperate (the wire is the same)")
    results = spawn.run(w.mismatch, 2, kind, timeout=60, env=EMULATE)
    for rank, (name, message, seconds) in enumerate(results):
        assert name in ("MismatchError", "PeerError"), (rank, name, message)
        assert seconds < 15, (rank, seconds, message)  # detected, not timed out
        assert f"rank {rank}" in message and "allreduce(" in message, message
    name, message, _ = results[1]
    assert "rank 0" in message and "rank 1" in message, message
    if kind == "memory":  # whoever saw it first says what differs
        assert any("host (CPU)" in m and "device (GPU)" in m for _, m, _ in results), results


def test_dead_peer_fails_the_survivors_naming_it():
    results = spawn.run(w.dead_peer, 3, timeout=60, env=EMULATE, allow_failures=True)
    assert results[2][0] == "error" and "exit code 3" in results[2][1]
    for rank in (0, 1):
        name, message, seconds = results[rank]
        assert name == "PeerError", (rank, name, message)
        assert "rank 2" in message and "allreduce(float32, count=4194304, op=sum)" in message, message
        assert seconds < 15, seconds


def test_gdr_required_where_impossible_is_a_config_error_naming_why(transport):
    """No transport here has a NIC (verbs runs in the Soft-RoCE guest, where
    tests/rdma/test_verbs.py checks GPUDirect RDMA itself)."""
    if transport == "shm":
        pytest.skip("every rank on one host: CUDA IPC, no network")
    env = dict(EMULATE, RCOLL_GDR="1", RCOLL_CUDA_IPC="0")
    for rank, outcomes in enumerate(run_ranks(w.gdr_required, 2, timeout=60, env=env)):
        (name, message), (later_name, later) = outcomes
        assert name == "ConfigError", (rank, name, message)
        assert message.startswith(f"rank {rank}: allreduce(") and "RCOLL_GDR=1" in message, message
        assert "transport has no NIC to read device memory" in message, message
        assert later_name == "ConfigError" and "failed earlier" in later and "RCOLL_GDR=1" in later, later


def test_argument_errors_name_the_rank_and_op(transport):
    if transport == "tcp":
        pytest.skip("checked once: the errors are raised before any transfer")
    for messages, result in run_ranks(w.argument_errors, 2, timeout=60, env=EMULATE):
        for m in messages:
            assert m is not None and m.startswith("rank ") and any(f": {op}" in m for op in OPS_CALLED), messages
        assert result == [2.0] * 8
