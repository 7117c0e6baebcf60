"""RCOLL_TIMELINE writes a Chrome trace per rank that parses and holds the ops that ran."""
import json

import pytest
from support import launch

from api import timeline_workers as w
from rcoll import spawn


# RCOLL_SHM_COLL=1: the shared-window collectives (each rank reduces from every
# window); 0: the ring over shared memory (each reduce takes a peer's segment).
@pytest.mark.parametrize("windows", ["1", "0"])
def test_timeline_holds_every_op_with_its_phases(tmp_path, windows):
    base = tmp_path / "trace"
    env = {"RCOLL_TIMELINE": str(base), "RCOLL_SHM_COLL": windows}
    assert spawn.run(w.some_ops, 2, timeout=60, env=env) == [True, True]
    for rank in range(2):
        events = json.loads((tmp_path / f"trace.rank{rank}.json").read_text())  # strict JSON: the array is closed
        slices = [e for e in events if e["ph"] == "X"]
        assert all(e["pid"] == rank for e in events)
        ops = {e["name"]: e for e in slices if e["cat"] == "op"}
        assert set(ops) == {"allreduce #1", "allgather #2", "barrier #3"}, sorted(ops)
        assert ops["allreduce #1"]["args"]["op"] == "allreduce(float32, count=262144, op=sum)"
        assert ops["allreduce #1"]["args"]["bytes"] == 4 << 18
        assert ops["allreduce #1"]["args"]["algorithm"] == ("shm windows" if windows == "1" else "ring")
        assert ops["barrier #3"]["args"]["algorithm"] == ("shm windows" if windows == "1" else "dissemination")
        assert all(op["args"]["outcome"] == "done" and op["tid"] == 0 for op in ops.values())
        # Phases nest inside their op, in order: queue, wait for peers, transfer.
        for op in ops.values():
            start, end = op["ts"], op["ts"] + op["dur"]
            inside = [e for e in slices if e["cat"] != "op" and e["tid"] == 0 and start <= e["ts"] <= end]
            names = [e["name"] for e in sorted(inside, key=lambda e: e["ts"]) if e["name"] != "reduce"]
            assert names[:3] == ["queue", "wait for peers", "transfer"], (op["name"], names)
            for e in inside:
                assert e["ts"] + e["dur"] <= end + 1, (op["name"], e)
        reduces = [e for e in slices if e["name"] == "reduce"]
        if windows == "1":
            assert reduces and all(e["args"]["windows"] == 2 for e in reduces)
        else:
            assert reduces and all(e["args"]["from"] == 1 - rank for e in reduces)
        p2p = [e for e in slices if e["tid"] == 1]
        assert len(p2p) == 1 and p2p[0]["cat"] == ("send" if rank == 0 else "recv"), p2p
        assert p2p[0]["args"]["bytes"] == 40
        names = {e["args"]["name"] for e in events if e["ph"] == "M" and "name" in e["args"]}
        assert names == {f"rank {rank}", "collectives", "send/recv"}
        labels = [e["args"]["labels"] for e in events if e["ph"] == "M" and e["name"] == "process_labels"]
        assert labels == [f"transport shm; per rank: {rank} self, {1 - rank} shm" if rank == 0 else
                          f"transport shm; per rank: {1 - rank} shm, {rank} self"], labels


def test_each_communicator_of_a_process_writes_its_own_file(tmp_path):
    env = {"RCOLL_TIMELINE": str(tmp_path / "trace")}
    assert spawn.run(w.two_communicators, 2, spawn.free_port(), timeout=60, env=env) == [True, True]
    for rank in range(2):
        for name, op in ((f"trace.rank{rank}.json", "allreduce #1"), (f"trace.rank{rank}.comm2.json", "allgather #1")):
            events = json.loads((tmp_path / name).read_text())  # each one strict JSON, not two writers' interleaving
            assert [e["name"] for e in events if e.get("cat") == "op"] == [op], (name, events)


def test_a_torch_job_that_ends_without_destroying_its_groups_closes_its_files(tmp_path):
    """Scripts that end without destroy_process_group() (DeepSpeed's do) leave
    their communicators to the interpreter's exit, and an object that is never
    freed (DeepSpeed's engine holds its groups so) keeps one open through it:
    the files are still strict JSON."""
    pytest.importorskip("torch")
    script = launch.write_script(tmp_path, """
        import ctypes
        import torch
        import torch.distributed as dist
        import rcoll  # noqa: F401
        dist.init_process_group("rcoll")
        dist.all_reduce(torch.ones(4))
        group = dist.new_group()
        dist.broadcast(torch.ones(3), 0, group=group)
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(group))  # never freed
    """)
    port = str(launch.free_port())
    launch.run_ranks(script, [{"RANK": str(r), "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                               "RCOLL_TIMELINE": str(tmp_path / "trace")} for r in range(2)])
    for rank in range(2):
        for name, op in ((f"trace.rank{rank}.json", "allreduce #1"), (f"trace.rank{rank}.comm2.json", "broadcast #1")):
            events = json.loads((tmp_path / name).read_text())
            assert [e["name"] for e in events if e.get("cat") == "op"] == [op], (name, events)
