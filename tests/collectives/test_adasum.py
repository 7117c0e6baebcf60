"""Communicator.adasum(): Horovod's adaptive summation (csrc/adasum.h), against a
numpy reference that pairs the ranks as Horovod's vector halving does.

Ranks run as threads of this process (rank_threads.py) except where a rank
must die (a process). Every rank must end with the same bits, in place and
with out=."""
import numpy as np
import pytest
from support import rank_threads
from support.common import SMALL_CHUNKS

from collectives import adasum_workers as w
from rcoll import spawn

TRANSPORTS = {"shm": {"RCOLL_TRANSPORT": "shm"}, "tcp": {"RCOLL_TRANSPORT": "tcp"}}
# (rtol, atol as a share of the result's largest magnitude). float32 and
# float64 differ from the reference only by the order of the dot products'
# additions (the elements are combined with the same double arithmetic);
# float16 and bfloat16 by a unit in the last place where that tips a rounding,
# carried through the levels.
TOLERANCES = {"float32": (1e-5, 1e-6), "float64": (1e-10, 1e-12), "float16": (1e-2, 2e-3), "bfloat16": (5e-2, 2e-2)}
DTYPES = ["float32", "float64", "float16"] + (["bfloat16"] if w.BFLOAT16 is not None else [])


def small_counts(world):
    """Empty, one element, odd, fewer elements than ranks, and many segments of SMALL_CHUNKS."""
    return sorted({0, 1, 2, 3, 7, max(world - 1, 1), 1001})


def check(results, world, cases, expected=None, tolerances=None):
    """Every rank's results (in place, then out=) against the reference (or
    `expected`, one array per case), and every rank's bits against rank 0's."""
    for i, (dtype, count, kind) in enumerate(cases):
        inputs = [w.rank_input(r, world, dtype, count, kind) for r in range(world)]
        want = w.reference(inputs, dtype) if expected is None else expected[i]
        rtol, atol = (tolerances or TOLERANCES)[dtype]
        scale = float(np.max(np.abs(want))) if count else 0.0
        first = results[0][i][0]
        assert first.dtype == np.dtype(dtype) and first.shape == (count,)
        np.testing.assert_allclose(first.astype(np.float64), want, rtol=rtol, atol=atol * scale,
                                   err_msg=f"{dtype}, count {count}, {kind}, world {world}")
        for rank in range(world):
            for got in results[rank][i]:
                assert got.tobytes() == first.tobytes(), f"rank {rank} differs from rank 0: {dtype}, count {count}"


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
@pytest.mark.parametrize("world", [1, 2, 4, 8])
def test_matches_horovods_definition(world, transport):
    cases = [(dtype, count, "random") for dtype in DTYPES for count in small_counts(world)]
    env = dict(SMALL_CHUNKS, **TRANSPORTS[transport])
    results = rank_threads.run(w.adasum_cases, world, cases, timeout=120, env=env)
    check(results, world, cases)


@pytest.mark.parametrize("world", [2, 4, 8])
def test_many_chunks(world):
    """(1 << 20) + 3 elements: an uneven cut at every level, hundreds of segments of the default size."""
    cases = [("float32", (1 << 20) + 3, "random"), ("float64", (1 << 18) + 5, "random")]
    results = rank_threads.run(w.adasum_cases, world, cases, timeout=120, env={"RCOLL_CHUNK_BYTES": "64K"})
    check(results, world, cases)


def test_orthogonal_parallel_and_zero_vectors():
    """Horovod's own checks: orthogonal vectors add up, parallel ones average;
    and zero vectors enter with coefficient 1 (rank 0's input comes out as it is)."""
    world = 4
    cases = [(dtype, count, kind) for dtype in ("float32", "float64") for count in (5, 1001)
             for kind in ("orthogonal", "parallel", "one")]
    expected = []
    for dtype, count, kind in cases:
        inputs = np.array([w.rank_input(r, world, dtype, count, kind) for r in range(world)], np.float64)
        expected.append(inputs.sum(0) if kind == "orthogonal" else inputs.mean(0) if kind == "parallel" else inputs[0])
    results = rank_threads.run(w.adasum_cases, world, cases, timeout=60)
    check(results, world, cases, expected, tolerances={"float32": (1e-5, 1e-6), "float64": (1e-9, 1e-12)})
    for i, (_, _, kind) in enumerate(cases):
        if kind == "one":  # exactly: coefficients of exactly 1 and a zero vector
            assert np.array_equal(results[0][i][0], w.rank_input(0, world, cases[i][0], cases[i][1], kind))


@pytest.mark.parametrize("world", [2, 3])
def test_refusals_name_rank_and_op(world):
    results = rank_threads.run(w.refusals, world, timeout=60)
    for rank, (found, after) in enumerate(results):
        assert after == [world * (world + 1) / 2] * 3  # the communicator still works
        size, dtype, out_dtype, out_size = found[:4]
        if world == 3:
            assert size[0] == "InvalidArgumentError", size
            assert size[1].startswith(f"rank {rank}: adasum(float32, count=5): the world size 3 is not a power of two")
        else:
            assert size[0] == "ok", size
        assert dtype[0] == "InvalidArgumentError" and dtype[1].startswith(f"rank {rank}: adasum(int32, count=5)"), dtype
        assert "Adasum takes float16, bfloat16, float32 or float64" in dtype[1], dtype
        assert out_dtype[0] == "InvalidArgumentError" and f"rank {rank}: adasum: out has dtype" in out_dtype[1]
        assert out_size[0] == "InvalidArgumentError" and f"rank {rank}: adasum: out has 4 elements" in out_size[1]
        for name, message in found[4:]:  # float8
            assert name == "InvalidArgumentError" and "adasum(float8_e4m3fn" in message, message


# "shm" also runs the allreduce of "op_kind" through the shared windows while
# the other ranks' adasum goes through the transport (the windows must notice).
@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("kind", ["count", "dtype", "op_kind"])
def test_mismatch_is_reported(world, kind, transport):
    results = rank_threads.run(w.mismatch, world, kind, timeout=60, env=TRANSPORTS[transport])
    for rank, (name, message, seconds) in enumerate(results):
        assert name in ("MismatchError", "PeerError"), (rank, name, message)
        assert seconds < 15, (rank, seconds, message)  # detected, not timed out (the timeout is 20 s)
        assert message.startswith(f"rank {rank}: "), message
    detected = [rank for rank, (name, _, _) in enumerate(results) if name == "MismatchError"]
    assert 1 in detected and len(detected) >= 2, results
    message = results[1][1]  # the windows know the other op by its kind only: "rank 0 called adasum as op #2"
    assert "adasum" in message and "as op #2" in message, message
    if kind == "count":
        assert "count=1001" in message and "count=1000" in message, message
    if kind == "dtype":
        assert "float64" in message and "float32" in message, message
    if kind == "op_kind":
        assert "allreduce(" in message, message


def test_silent_peer_times_out_naming_it():
    results = rank_threads.run(w.silent_peer, 2, timeout=60)
    name, message, seconds = results[0]
    assert name == "TimeoutError", message
    assert message.startswith("rank 0: ") and "adasum(float32, count=65536)" in message, message
    assert "rank(s) 1" in message and "op #2" in message, message
    assert 1.4 < seconds < 5, seconds
    name1, message1, seconds1 = results[1]  # learns why rank 0 gave up
    assert name1 == "PeerError" and "rank 0 failed" in message1, message1
    assert seconds1 < 5


def test_dead_peer_fails_every_survivor_quickly():
    world = 4
    results = spawn.run(w.dead_peer, world, timeout=60, allow_failures=True)
    assert results[world - 1][0] == "error" and "exit code 3" in results[world - 1][1]
    for rank in range(world - 1):
        (name, message, seconds), (later_name, later_message, _) = results[rank]
        assert name == "PeerError" and message.startswith(f"rank {rank}: "), (rank, name, message)
        assert "adasum(float32, count=1048576)" in message, message
        assert seconds < 10, seconds  # the op timeout is 30 s: this is detection, not expiry
        assert later_name == "PeerError" and "failed earlier" in later_message, later_message
