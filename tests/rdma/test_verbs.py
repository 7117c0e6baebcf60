"""The ibverbs transport, for real: these run inside the Soft-RoCE guest
(scripts/softroce/guest.py; tests/rdma/test_softroce_guest.py starts it), where
rxe0 and rxe1 are RoCE v2 devices on the two ends of a veth pair.

Ranks alternate between rxe0 and rxe1 (RCOLL_IB_HCA per rank), so every ring
edge between neighbours crosses the veth as RoCE v2 packets. Ranks run as
threads of the test process (rank_threads.py; each rank's RCOLL_IB_HCA reaches
its communicator as a setting), which spares the emulated CPU an interpreter
and a numpy import per rank; a killed rank and torch need processes.
"""
import json
import os
import re
import statistics
import subprocess
import sys
import time

import numpy as np
import pytest
from support import collective_workers as cw
from support import device_workers as dw
from support import error_workers as ew
from support import mixed_workers as mw
from support import rank_threads
from support import runtime_connect_workers as rw
from support.common import EMULATED_DEVICE, SMALL_CHUNKS, every_rank_passed

from rcoll import _core, spawn
from rdma import verbs_workers as vw

IN_GUEST = os.environ.get("RCOLL_SOFTROCE_GUEST") == "1"  # set by scripts/softroce/guest.py

pytestmark = [
    pytest.mark.skipif(not IN_GUEST, reason="needs the Soft-RoCE guest (run through test_softroce_guest.py)"),
    pytest.mark.timeout(900),
]

IB = {"RCOLL_TRANSPORT": "ib", "RCOLL_IB_HCA": ["rxe0", "rxe1"]}


def _ib(**extra):
    env = dict(IB)
    env.update(extra)
    return env


PYVERBS_LISTING = r"""
import json
import pyverbs.device as d
from pyverbs.enums import IBV_LINK_LAYER_ETHERNET
out = []
for dev in d.get_device_list():
    name = dev.name.decode()
    with d.Context(name=name) as ctx:
        attr = ctx.query_device()
        ports = []
        for p in range(1, attr.phys_port_cnt + 1):
            pa = ctx.query_port(p)
            gids = []
            for i in range(pa.gid_tbl_len):
                try:
                    g = ctx.query_gid(p, i)
                except Exception:
                    continue
                if str(g) in ("0000:0000:0000:0000:0000:0000:0000:0000", "::"):
                    continue
                try:
                    t = ctx.query_gid_type(p, i)
                except Exception:
                    t = None
                gids.append({"index": i, "gid": str(g), "type": t})
            ports.append({"port": p, "state": pa.state, "mtu": pa.active_mtu,
                          "ethernet": pa.link_layer == IBV_LINK_LAYER_ETHERNET, "gids": gids})
        out.append({"name": name, "max_qp_wr": attr.max_qp_wr, "max_mr_size": attr.max_mr_size, "ports": ports})
print(json.dumps(out))
"""


def test_rcoll_sees_what_pyverbs_sees():
    """Devices, ports, limits and GID tables as rcoll reports them (`python -m rcoll info`)
    agree with pyverbs (rdma-core's own Python binding, under Debian's python3)."""
    theirs = json.loads(subprocess.run(["/usr/bin/python3", "-c", PYVERBS_LISTING], check=True,
                                       capture_output=True, text=True, timeout=60).stdout)
    mine = _core.rdma_report()
    assert mine["library_loaded"], mine["error"]
    assert sorted(d["name"] for d in mine["devices"]) == sorted(d["name"] for d in theirs)
    assert {"rxe0", "rxe1"} <= {d["name"] for d in theirs}
    for ref in theirs:
        dev = next(d for d in mine["devices"] if d["name"] == ref["name"])
        assert dev["max_qp_wr"] == ref["max_qp_wr"]
        assert dev["max_mr_size"] == ref["max_mr_size"]
        for ref_port, port in zip(ref["ports"], dev["ports"]):
            assert port["port"] == ref_port["port"]
            assert port["active"] == (ref_port["state"] == 4)  # IBV_PORT_ACTIVE
            assert port["link_layer"] == ("Ethernet" if ref_port["ethernet"] else "InfiniBand")
            assert [g["index"] for g in port["gids"]] == [g["index"] for g in ref_port["gids"]]
            for g, rg in zip(port["gids"], ref_port["gids"]):
                # pyverbs prints GIDs as eight groups of four hex digits.
                assert bytes.fromhex(rg["gid"].replace(":", "")) == _gid_bytes(g["address"])
                if rg["type"] is not None and ref_port["ethernet"]:
                    # pyverbs reports libibverbs' sysfs GID type: 0 = IB/RoCE v1, 1 = RoCE v2.
                    assert g["type"] == ("RoCE v2" if rg["type"] == 1 else "RoCE v1"), (g, rg)


def _gid_bytes(text):
    import ipaddress
    return ipaddress.IPv6Address(text).packed


def test_gid_auto_selection_picks_roce_v2_ipv4():
    report = _core.rdma_report()
    for dev in report["devices"]:
        if dev["name"] not in ("rxe0", "rxe1"):
            continue
        port = dev["ports"][0]
        chosen = next(g for g in port["gids"] if g["index"] == port["chosen_gid"])
        assert chosen["type"] == "RoCE v2" and chosen["ipv4_mapped"], port
        assert not chosen["link_local"]
        assert "RoCE v2 with an IPv4-mapped address" in port["gid_reason"]
        # A link-local entry exists and is passed over.
        assert any(g["link_local"] for g in port["gids"]), port["gids"]
    assert report["selection"].startswith("rxe"), report["selection"]


def test_gid_index_override_is_respected(monkeypatch):
    monkeypatch.setenv("RCOLL_IB_GID_INDEX", "0")
    port = next(d for d in _core.rdma_report()["devices"] if d["name"] == "rxe0")["ports"][0]
    assert port["chosen_gid"] == 0 and "RCOLL_IB_GID_INDEX=0" in port["gid_reason"]


# A network with IPv6 alone (rxe4 on sr4, rxe5 on sr5: no IPv4 address, so no
# IPv4-mapped GID). The ranks meet at a store on an IPv6 address, their
# handshake sockets (the side channel, which also carries aborts) listen on
# IPv6, and the queue pairs address the RoCE v2 GID of the IPv6 address.
# Ranks are processes started as a launcher starts them (RANK, WORLD_SIZE,
# MASTER_ADDR, MASTER_PORT); each one's exit code and stderr are checked.
IPV6_RANK = r"""
import json
import numpy as np
import rcoll
from rcoll import _core
comm = rcoll.init(timeout=120)
rank, world = comm.rank, comm.size
ok = True
for dtype in (np.float32, np.float64, np.int64, np.uint8):
    for n in (0, 1, 7, 1000, 300_001):
        x = (np.arange(n) % 50 + rank).astype(dtype)
        comm.allreduce(x)
        ok &= bool((x == (world * (np.arange(n) % 50) + world * (world - 1) // 2).astype(dtype)).all())
got = comm.allgather(np.full(3, rank, np.int32)).reshape(world, 3)
ok &= got[:, 0].tolist() == list(range(world))
comm.barrier()
print(json.dumps({"transport": comm.transport, "ok": ok, "selection": _core.rdma_report()["selection"]}))
comm.shutdown()
"""


def _started_ranks(envs, script, master_addr="127.0.0.1"):
    """Ranks started as a launcher starts them (one process each, RANK/WORLD_SIZE/MASTER_ADDR), each with its
    entries of `envs`."""
    port = spawn.free_port()
    procs = []
    for rank, extra in enumerate(envs):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE=str(len(envs)), LOCAL_RANK="0", MASTER_ADDR=master_addr,
                   MASTER_PORT=str(port), RCOLL_CONNECT_TIMEOUT="120", **extra)
        procs.append(subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    return procs


def _launched_ranks(envs, script, master_addr="127.0.0.1"):
    """_started_ranks(), waited for: (exit code, stdout, stderr) per rank, every rank killed if one outlives
    the bound."""
    return _outcomes(_started_ranks(envs, script, master_addr))


def _outcomes(procs):
    outcomes = []
    for p in procs:
        try:
            out, err = p.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
        outcomes.append((p.returncode, out, err))
    return outcomes


def test_a_network_with_ipv6_alone():
    world, addresses = 2, os.environ["RCOLL_SOFTROCE_ADDRS"].split(",")[4:6]
    envs = [dict(RCOLL_TRANSPORT="ib", RCOLL_IB_HCA=f"rxe{4 + rank}", RCOLL_SOCKET_IFNAME=f"=sr{4 + rank}",
                 RCOLL_DEBUG="INFO") for rank in range(world)]
    for rank, (code, out, err) in enumerate(_launched_ranks(envs, IPV6_RANK, master_addr=addresses[0])):
        assert code == 0 and "Traceback" not in err, (rank, code, out, err[-3000:])
        report = json.loads(out.strip().splitlines()[-1])
        assert report["transport"] == "ib" and report["ok"], (rank, report)
        # The GID of the device's own IPv6 address, chosen because there is no IPv4-mapped one.
        assert f"RoCE v2 {addresses[rank]}" in report["selection"], report["selection"]
        assert "RoCE v2 (IPv6)" in report["selection"], report["selection"]
        assert f"handshakes at [{addresses[rank]}]:" in err, err[-3000:]


def test_gids_of_different_ip_families_are_refused_at_set_up():
    """Rank 0 takes the link-local IPv6 GID (index 0), rank 1 the IPv4-mapped one: RoCE v2 cannot connect an
    IPv6 GID to an IPv4 one, and both ranks say so when they swap queue pairs, instead of every write timing
    out after its retries."""
    env = _ib(RCOLL_IB_GID_INDEX=["0", os.environ["RCOLL_SOFTROCE_GID_INDEX"]])
    for rank, (name, message, seconds) in enumerate(spawn.run(vw.set_up_and_allreduce, 2, timeout=300, env=env)):
        assert name != "ok", (rank, message)
        assert f"rank {rank}: setting up the RDMA connection to rank {1 - rank}" in message, (rank, message)
        assert "different IP families" in message and "fe80::" in message and "::ffff:192.0.2." in message, message
        assert seconds < 30, (rank, seconds)


@pytest.mark.parametrize("family, gid", [(None, "::ffff:198.51.100."), ("ipv6", "2001:db8:2::")])
def test_the_ip_family_of_the_gid_can_be_chosen(family, gid):
    """rxe2 and rxe3 sit on a dual-stack network: the ranks take the IPv4-mapped GID by default, the IPv6 one with
    RCOLL_IB_ADDR_FAMILY=ipv6, and the job runs over either."""
    env = {"RCOLL_TRANSPORT": "ib", "RCOLL_IB_HCA": ["rxe2", "rxe3"]}
    if family:
        env["RCOLL_IB_ADDR_FAMILY"] = family
    for rank, (transport, ok, selection) in enumerate(spawn.run(vw.transport_and_gid, 2, timeout=300, env=env)):
        assert transport == "ib" and ok, (rank, transport, selection)
        assert f"RoCE v2 {gid}" in selection, (rank, selection)
        assert ("RCOLL_IB_ADDR_FAMILY" in selection) == bool(family), (rank, selection)


@pytest.mark.parametrize("world", [2, 4])
def test_transport_is_verbs(world):
    assert rank_threads.run(vw.transport_of, world, timeout=120, env=IB) == ["ib"] * world


def test_the_senders_meter_what_their_rdma_writes_carry():
    assert rank_threads.run(vw.edges_metered, 2, timeout=120, env=IB) == [[(1, "out", "ib", True, True)],
                                                                          [(0, "out", "ib", True, True)]]


# All ranks share the guest, where auto would pick shared memory: RCOLL_SHM_DISABLE=1
# makes auto choose between verbs and TCP, as across hosts.
def test_auto_uses_verbs_when_every_rank_has_a_port():
    env = {"RCOLL_TRANSPORT": "auto", "RCOLL_SHM_DISABLE": "1", "RCOLL_IB_HCA": ["rxe0", "rxe1"]}
    assert rank_threads.run(vw.transport_of, 2, timeout=120, env=env) == ["ib", "ib"]


def test_auto_falls_back_to_tcp_when_a_rank_has_no_active_device():
    env = {"RCOLL_TRANSPORT": "auto", "RCOLL_SHM_DISABLE": "1", "RCOLL_IB_HCA": ["rxe0", "no_such_device"]}
    assert rank_threads.run(vw.transport_of, 2, timeout=120, env=env) == ["tcp", "tcp"]


def test_ib_without_a_device_is_a_clear_error():
    env = {"RCOLL_TRANSPORT": "ib", "RCOLL_IB_HCA": ["rxe0", "no_such_device"]}
    results = rank_threads.run(vw.transport_of, 2, timeout=120, env=env, allow_failures=True)
    for _rank, (status, text) in enumerate(results):
        assert status == "error" and "ConfigError" in text, text
        assert "RCOLL_TRANSPORT=ib" in text and "rank 1" in text and "no usable ACTIVE port" in text, text


# Two "hosts" of two ranks (RCOLL_HOSTID), host A on rxe0 and host B on rxe1:
# auto gives shared memory inside each host and verbs across, in one ring.
MIXED = {"RCOLL_TRANSPORT": "auto", "RCOLL_HOSTID": ["A", "A", "B", "B"],
         "RCOLL_IB_HCA": ["rxe0", "rxe0", "rxe1", "rxe1"]}
MIXED_EDGES = [["self", "shm", "ib", "ib"], ["shm", "self", "ib", "ib"],
               ["ib", "ib", "self", "shm"], ["ib", "ib", "shm", "self"]]


def test_mixed_ring_shm_inside_hosts_verbs_across():
    for rank, (name, edges, ok) in enumerate(rank_threads.run(mw.report, 4, timeout=300, env=MIXED)):
        assert ok, f"rank {rank}: wrong allreduce/alltoall result"
        assert (name, edges) == ("shm+ib", MIXED_EDGES[rank]), (rank, name, edges)
    every_rank_passed(rank_threads.run(cw.allreduce_sweep, 4, timeout=900, env={**MIXED, **SMALL_CHUNKS}))
    every_rank_passed(rank_threads.run(cw.alltoall_sweep, 4, timeout=900, env={**MIXED, **SMALL_CHUNKS}))


def test_mixed_ring_kill_9_fails_every_survivor():
    results = spawn.run(mw.killed_mid_collective, 4, 3, timeout=300, env=MIXED, allow_failures=True)
    assert results[3][0] == "error"
    for rank in range(3):
        name, message, seconds, edges = results[rank]
        assert edges == MIXED_EDGES[rank]
        assert name == "PeerError", (rank, message)
        assert "rank 3" in message and "allreduce(float32, count=4194304, op=sum)" in message, (rank, message)
        assert seconds < 30, (rank, seconds)  # the side channel's EOF, not the 60 s timeout


# Two ports per rank (rails_transport.h): rxe0 and rxe2 on one side, rxe1 and
# rxe3 on the other (two veth pairs). A pair's messages are spread over the
# two ports in the shares measured at set-up (rails_probe.h): every device
# sends packets, and every result is exact. (The guest's rxe devices share its
# CPUs, so two alike ports may measure unlike: what share each takes is
# test_a_pair_measures_its_ports_and_spreads_bytes_in_their_proportion's.)
RAILS = {"RCOLL_TRANSPORT": "ib", "RCOLL_IB_HCA": ["rxe0,rxe2", "rxe1,rxe3"]}
RAILS_MIXED = {"RCOLL_TRANSPORT": "auto", "RCOLL_HOSTID": ["A", "A", "B", "B"],
               "RCOLL_IB_HCA": ["rxe0,rxe2", "rxe0,rxe2", "rxe1,rxe3", "rxe1,rxe3"]}


def _sent_packets():
    counters = "/sys/class/infiniband/{}/ports/1/hw_counters/sent_pkts"
    return {dev: int(open(counters.format(dev)).read()) for dev in ("rxe0", "rxe1", "rxe2", "rxe3")}


@pytest.mark.parametrize("env, world, name", [(RAILS, 2, "ib"), (RAILS_MIXED, 4, "shm+ib")],
                         ids=["two ranks", "two hosts of two"])
def test_two_ports_per_rank_carry_a_pair_s_messages_in_turn(env, world, name):
    before = _sent_packets()
    for rank, (transport, edges, ok) in enumerate(rank_threads.run(mw.report, world, timeout=300, env=env)):
        assert ok, f"rank {rank}: wrong allreduce/alltoall result"
        assert transport == name and edges.count("ib") == world // 2, (rank, transport, edges)
    every_rank_passed(rank_threads.run(cw.allreduce_sweep, world, timeout=900, env={**env, **SMALL_CHUNKS}))
    every_rank_passed(rank_threads.run(cw.alltoall_sweep, world, timeout=900, env={**env, **SMALL_CHUNKS}))
    every_rank_passed(rank_threads.run(mw.barrier_and_ring_messages, world, timeout=900, env=env))
    sent = {dev: n - before[dev] for dev, n in _sent_packets().items()}
    # Each port carried a share (at least 1 of 17; both directions of every pair use both).
    for first, second in (("rxe0", "rxe2"), ("rxe1", "rxe3")):
        assert min(sent[first], sent[second]) > 0.03 * (sent[first] + sent[second]), sent


# One rank of a pair over two ports each: after set-up (the ports measured),
# the packets each of its ports sends during 16 MiB of allreduces.
PORTS_RANK = r"""
import json, os
import numpy as np
import rcoll
comm = rcoll.init(timeout=300)
rank, world = comm.rank, comm.size
devices = os.environ["RCOLL_IB_HCA"].split(",")
def sent():
    return [int(open(f"/sys/class/infiniband/{d}/ports/1/hw_counters/sent_pkts").read()) for d in devices]
before = sent()
ok = True
for _ in range(4):
    x = np.full(1 << 20, rank + 1, np.float32)
    comm.allreduce(x)
    ok &= bool((x == world * (world + 1) // 2).all())
print(json.dumps({"transport": comm.transport, "ok": ok, "sent": [b - a for a, b in zip(before, sent())]}))
comm.shutdown()
"""


def _shares(err, peer):
    """The shares a rank's INFO line gives the ports to `peer`, and the rates it measured (acceptor only)."""
    line = re.search(rf"the RDMA ports to rank {peer} take shares (.*)", err)
    assert line, err[-3000:]
    parts = [p.strip() for p in line.group(1).split(",")]
    weights = [int(p.split()[0]) for p in parts]
    rates = [float(m.group(1)) for p in parts for m in [re.search(r"\((\d+) MB/s\)", p)] if m]
    return weights, rates


@pytest.mark.parametrize("shaped", [False, True], ids=["alike ports", "one port shaped to 16 Mbit/s"])
def test_a_pair_measures_its_ports_and_spreads_bytes_in_their_proportion(shaped):
    """The rails' shares are measured when a pair connects (rails_probe.h), the same at both ends, and each
    port sends packets in proportion to its share; with the second veth pair shaped by tbf, the shaped port
    takes the small share. Every result is exact. (Alike ports need not measure alike here: the guest's rxe
    devices share its CPUs.)"""
    shaping = [["tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", "16mbit", "burst", "32kb", "latency",
                "2s"] for dev in ("sr2", "sr3")] if shaped else []
    try:
        for command in shaping:
            subprocess.run(command, check=True, capture_output=True, text=True, timeout=30)
        envs = [dict(RCOLL_TRANSPORT="ib", RCOLL_IB_HCA=hca, RCOLL_DEBUG="INFO") for hca in ("rxe0,rxe2", "rxe1,rxe3")]
        outcomes = _launched_ranks(envs, PORTS_RANK)
    finally:
        for dev in ("sr2", "sr3") if shaped else ():
            subprocess.run(["tc", "qdisc", "del", "dev", dev, "root"], capture_output=True, timeout=30)
    reports = []
    for rank, (code, out, err) in enumerate(outcomes):
        assert code == 0 and "Traceback" not in err, (rank, code, out, err[-3000:])
        reports.append(json.loads(out.strip().splitlines()[-1]))
        assert reports[-1]["transport"] == "ib" and reports[-1]["ok"], (rank, reports[-1])
    # Rank 1 dials rank 0, which measures and says the shares.
    (weights, rates), (dialer_weights, _) = _shares(outcomes[0][2], 1), _shares(outcomes[1][2], 0)
    assert weights == dialer_weights and len(rates) == 2, (weights, dialer_weights, rates)
    print(f"shares {weights}, measured {rates} MB/s, packets sent per port {[r['sent'] for r in reports]}")
    # Packets count acknowledgements too (each rank sends and receives): within 0.06 of the share, and
    # never none (a share is at least 1 of 17).
    for sent in (r["sent"] for r in reports):
        assert min(sent) > 0 and abs(sent[1] / sum(sent) - weights[1] / sum(weights)) < 0.06, (weights, sent)
    if shaped:  # 2 MB/s against tens unshaped
        assert weights[0] == 16 and weights[1] <= 4, (weights, rates)


def test_two_ports_per_rank_with_peers_connected_on_first_use():
    """A host per rank: while a rank measures the ports to one set-up peer, others dial in, at set-up or on
    demand; a set-up peer's dial stays for accept(), so set-up ends, and every pair then exchanges. (Had the
    measurement's progress taken it in, rank 0 would wait for it until the connect timeout: 3 of 3 runs did.)"""
    world = 8
    env = {**RAILS, "RCOLL_HOSTID": [f"h{r}" for r in range(world)]}
    assert rank_threads.run(vw.every_pair_named, world, timeout=600, env=env) == [True] * world


def test_ranks_with_different_port_counts_use_as_many_as_the_fewest():
    env = {"RCOLL_TRANSPORT": "ib", "RCOLL_IB_HCA": ["rxe0,rxe2", "rxe1"]}
    before = _sent_packets()
    for rank, (transport, edges, ok) in enumerate(rank_threads.run(mw.report, 2, timeout=300, env=env)):
        assert ok and transport == "ib", (rank, transport, edges)
    sent = {dev: n - before[dev] for dev, n in _sent_packets().items()}
    assert sent["rxe0"] > 0 and sent["rxe1"] > 0 and sent["rxe2"] == sent["rxe3"] == 0, sent


# Connections on first use (#20 item 4): queue pairs swapped by each side's
# thread in steps over the socket the connector made (csrc/on_demand_peers.h).
def test_point_to_point_queue_pairs_are_made_on_first_use():
    world = 4
    lazy = spawn.run(rw.sockets_before_and_after_use, world, timeout=300, env=IB)
    eager = spawn.run(rw.sockets_before_and_after_use, world, timeout=300, env=_ib(RCOLL_RUNTIME_CONNECT="0"))
    for rank in range(world):
        (lazy_before, lazy_after), (eager_before, eager_after) = lazy[rank], eager[rank]
        # Each queue pair keeps its socket as a side channel: eager, one per other
        # rank; on demand, none (the listener stays open) until ranks 0 and 3 exchanged.
        assert lazy_before == eager_before - (world - 1) + 1, (rank, lazy, eager)
        assert lazy_after - lazy_before == (1 if rank in (0, world - 1) else 0), (rank, lazy)
        assert eager_after == eager_before, (rank, eager)


@pytest.mark.parametrize("world", [2, 5])
def test_every_pair_connects_on_first_use_over_verbs(world):
    """A host per rank (RCOLL_HOSTID): point-to-point and the collectives'
    peers outside the algorithms' rings connect on first use."""
    env = _ib(RCOLL_HOSTID=[f"h{r}" for r in range(world)])
    assert rank_threads.run(vw.every_pair_named, world, timeout=600, env=env) == [True] * world


def test_send_to_a_rank_that_is_gone_fails_naming_it_over_verbs():
    results = spawn.run(rw.peer_gone, 3, timeout=300, env=IB, allow_failures=True)
    for rank in (0, 1):
        name, message, seconds = results[rank]
        assert name == "PeerError" and "rank 2" in message, (rank, results[rank])
        assert seconds < 30, (rank, results[rank])


def test_a_rank_gone_during_the_queue_pair_exchange_fails_the_send_naming_it():
    results = spawn.run(vw.gone_during_the_queue_pair_exchange, 2, timeout=300, env=IB, allow_failures=True)
    assert results[1][0] == "error" and "exit code 3" in results[1][1]
    name, message, seconds = results[0]
    assert name == "PeerError" and "rank 1" in message, results[0]
    assert seconds < 30, results[0]  # the socket's EOF, not the 60 s timeout


@pytest.mark.parametrize("world", [2, 4])
def test_allreduce_matrix_over_verbs(world):
    every_rank_passed(rank_threads.run(cw.allreduce_sweep, world, timeout=900, env=_ib(**SMALL_CHUNKS)))


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("sweep", ["reduce_scatter_sweep", "allgather_sweep", "broadcast_sweep", "reduce_sweep",
                                   "gather_sweep", "scatter_sweep", "alltoall_sweep"])
def test_collective_matrix_over_verbs(world, sweep):
    every_rank_passed(rank_threads.run(getattr(cw, sweep), world, timeout=900, env=_ib(**SMALL_CHUNKS)))


@pytest.mark.parametrize("world", [2, 3])
def test_large_buffers_over_verbs(world):
    every_rank_passed(rank_threads.run(cw.large_sweep, world, timeout=900, env=IB))


def test_point_to_point_over_verbs():
    every_rank_passed(rank_threads.run(cw.point_to_point, 2, timeout=300, env=IB))


def test_recv_from_any_source_over_verbs_is_refused_clearly():
    for rank, (message, total) in enumerate(rank_threads.run(vw.recv_from_any_over_verbs, 2, timeout=300, env=IB)):
        assert message is not None and message.startswith(f"rank {rank}: recv from any source"), message
        assert "over the ib transport" in message and "src=" in message, message
        assert total == [2.0] * 4


def test_registration_cache_survives_freed_and_reused_buffers():
    assert rank_threads.run(vw.buffer_reuse_and_free, 2, timeout=600, env=IB) == [True, True]


@pytest.mark.parametrize("kind", ["count", "dtype"])
def test_mismatch_over_verbs(kind):
    results = rank_threads.run(ew.mismatch, 2, kind, timeout=120, env=IB)
    for rank, (name, message, _seconds) in enumerate(results):
        assert name == "MismatchError", (rank, message)
        assert "as op #1" in message and message.startswith(f"rank {rank}: "), message


@pytest.mark.parametrize("world, ports", [(2, "one"), (3, "one"), (2, "two")])
def test_peer_killed_mid_collective(world, ports):
    """A killed rank fails the others with a PeerError naming it, also over two ports per rank, where a
    port that stops acknowledging looks like a failed link at first (rails_failover.cc) until the side
    channels close."""
    env = IB if ports == "one" else RAILS
    results = spawn.run(vw.killed_mid_collective, world, timeout=180, env=env, allow_failures=True)
    dead = world - 1
    assert results[dead][0] == "error" and "exit code 3" in results[dead][1]
    for rank in range(dead):
        name, message, seconds = results[rank]
        assert name == "PeerError", (rank, message)
        assert f"rank {dead}" in message and "allreduce(float32, count=1048576, op=sum)" in message, message
        assert seconds < 30, seconds  # detected (side channel or RC retries), not the 60 s timeout


# GPU buffers over verbs, on the core's emulated device runtime
# (tests/support/device_workers.py). RCOLL_GDR=1: GPUDirect RDMA, the RDMA device
# registers the emulated GPU's slot memory (the peer-memory route, as with
# nvidia-peermem: the guest kernel has no udmabuf, so the dma-buf export is
# refused first), the NIC writes device slots and the reductions read them
# there; workers check that the ops said "gdr". RCOLL_GDR=0: pinned staging
# over the same queue pairs.
EMULATE = EMULATED_DEVICE


@pytest.mark.usefixtures("emulated_device_runtime")
@pytest.mark.parametrize("gdr", ["1", "0"])
@pytest.mark.parametrize("world", [2, 3])
def test_device_buffers_over_verbs(world, gdr):
    env = _ib(**EMULATE, **SMALL_CHUNKS, RCOLL_GDR=gdr)
    every_rank_passed(rank_threads.run(dw.every_collective_once, world, timeout=600, env=env))
    every_rank_passed(rank_threads.run(dw.alltoall_sweep, world, timeout=600, env=env))


@pytest.mark.usefixtures("emulated_device_runtime")
@pytest.mark.parametrize("world", [2, 3])
def test_device_allreduce_matrix_with_gdr(world):
    # RCOLL_GDR unset: auto takes GPUDirect RDMA where it works.
    every_rank_passed(rank_threads.run(dw.allreduce_sweep, world, timeout=900, env=_ib(**EMULATE, **SMALL_CHUNKS)))


@pytest.mark.usefixtures("emulated_device_runtime")
def test_device_buffers_on_a_mixed_ring_are_staged():
    """A rank whose edges mix shared memory and verbs cannot give the NIC its
    GPU slots (the shm edges copy with the CPU): auto stages (workers check
    "staging"), RCOLL_GDR=1 fails every rank's first GPU op saying why."""
    env = {**MIXED, **EMULATE, **SMALL_CHUNKS}
    every_rank_passed(rank_threads.run(dw.every_collective_once, 4, timeout=600, env=env))
    for rank, outcomes in enumerate(rank_threads.run(dw.gdr_required, 4, timeout=300, env={**env, "RCOLL_GDR": "1"})):
        name, message = outcomes[0]
        assert name == "ConfigError" and message.startswith(f"rank {rank}: allreduce("), (rank, message)
        assert "RCOLL_GDR=1" in message and "mix transports (shm+ib)" in message, message


def test_torch_backend_over_verbs():
    torch = pytest.importorskip("torch")
    from support import torch_workers as tw
    del torch
    # One job: under TCG each torch import takes about a minute.
    results = spawn.run(tw.torch_tour, 2, timeout=900, env=IB)
    every_rank_passed([checked for checked, _mine, _gloo in results])
    for rank, (_checked, mine, gloo) in enumerate(results):
        for a, b in zip(mine, gloo):
            np.testing.assert_array_equal(a, b, err_msg=f"rank {rank}")


# A port that fails mid-job (csrc/rails_failover.cc): two ports per rank,
# 4 MiB allreduces back to back; the second port's link is cut while they run.
FAILOVER_RANK = r"""
import json, os, time
import numpy as np
import rcoll
comm = rcoll.init(timeout=300)
rank, world = comm.rank, comm.size
base = np.arange(1 << 20, dtype=np.float32)
ok, times = True, []
cut_at = [int(i) for i in os.environ.get("RCOLL_TEST_CUT_AT", "2").split(",")]
for i in range(int(os.environ["RCOLL_TEST_OPS"])):
    if i in cut_at and rank == 0:
        open(f"{os.environ['RCOLL_TEST_MARK']}.{i}", "w").close()  # the test cuts a link now
    x = base * (rank + 1) + i
    start = time.monotonic()
    comm.allreduce(x)
    times.append(round(time.monotonic() - start, 3))
    ok &= bool((x == base * 3 + 2 * i).all())  # exact: every value is an integer below 2**24
print(json.dumps({"ok": ok, "times": times}))
comm.shutdown()
"""

ADDR2, ADDR3 = "198.51.100.1", "198.51.100.2"  # sr2 and sr3 (scripts/softroce/guest.py)
ADDR2_6, ADDR3_6 = "2001:db8:2::1", "2001:db8:2::2"
VETH_PEER = {"sr0": "sr1", "sr2": "sr3", "sr4": "sr5"}


def _forget_neighbours(*devs):
    """Commands that flush the neighbour entries of each veth and of its other end, both families: while a
    link was cut, the address resolution across it failed and left FAILED entries, which the guest had not
    before the cut; the next test starts from the state the others do."""
    ends = [end for dev in devs for end in (dev, VETH_PEER[dev])]
    return [["ip", *family, "neigh", "flush", "dev", end] for end in ends for family in ([], ["-6"])]


def _drop_every_packet(*devs):
    """Commands that make each veth drop every packet it sends (netem), and the ones that undo them."""
    return ([["tc", "qdisc", "replace", "dev", dev, "root", "netem", "loss", "100%"] for dev in devs],
            [["tc", "qdisc", "del", "dev", dev, "root"] for dev in devs] + _forget_neighbours(*devs))


CUTS = {
    "every packet dropped": _drop_every_packet("sr2"),
    # Last: the link's routes go with it and come back by hand.
    "link down": ([["ip", "link", "set", "sr2", "down"]],
                  [["ip", "link", "set", "sr2", "up"],
                   ["ip", "-6", "addr", "replace", f"{ADDR2_6}/64", "dev", "sr2", "nodad"],
                   ["ip", "-6", "addr", "replace", f"{ADDR3_6}/64", "dev", "sr3", "nodad"],
                   ["ip", "route", "replace", f"{ADDR3}/32", "dev", "sr2", "src", ADDR2, "table", "102"],
                   ["ip", "route", "replace", f"{ADDR2}/32", "dev", "sr3", "src", ADDR3, "table", "103"],
                   ["ip", "-6", "route", "replace", f"{ADDR3_6}/128", "dev", "sr2", "src", ADDR2_6, "table", "102"],
                   ["ip", "-6", "route", "replace", f"{ADDR2_6}/128", "dev", "sr3", "src", ADDR3_6, "table", "103"],
                   *_forget_neighbours("sr2")]),
}


def _kernel_log_tail(lines=40):
    """The guest kernel's last log lines (rdma_rxe and the network stack say there what they refused)."""
    try:
        return "\n".join(subprocess.run(["dmesg"], capture_output=True, text=True, timeout=30).stdout
                         .splitlines()[-lines:])
    except (OSError, subprocess.SubprocessError) as e:
        return f"(dmesg: {e})"


def _cut_while_running(envs, script, cuts, restore_commands):
    """Ranks started with `script`; `cuts`: (mark, what, commands) in turn: once rank 0 wrote the file `mark`
    (reached `what`), `commands` run. Returns the ranks' outcomes (_outcomes); every rank is killed and
    `restore_commands` run whatever happened."""
    procs = _started_ranks(envs, script)
    try:
        for mark, what, commands in cuts:
            deadline = time.monotonic() + 300
            while not mark.exists() and time.monotonic() < deadline and all(p.poll() is None for p in procs):
                time.sleep(0.02)
            if not mark.exists():
                for p in procs:
                    p.kill()
                outcomes = [(code, out, err[-3000:]) for code, out, err in _outcomes(procs)]
                raise AssertionError(f"rank 0 never reached {what}: {outcomes}\nthe kernel's last words:\n"
                                     f"{_kernel_log_tail()}")
            for command in commands:
                subprocess.run(command, check=True, capture_output=True, text=True, timeout=30)
        return _outcomes(procs)
    finally:
        for p in procs:
            p.kill()
        for command in restore_commands:
            subprocess.run(command, capture_output=True, timeout=30)


@pytest.mark.parametrize("cut", list(CUTS))
def test_a_port_that_fails_hands_its_messages_to_the_other(cut, tmp_path):
    """rxe2-rxe3's link fails during the third of ten allreduces: both ranks warn once naming the port and
    the peer, the op goes on over rxe0-rxe1 (the port's IBV_EVENT_PORT_ERR when the link goes down; RC
    retries exhausted after about 7 x 67 ms, RCOLL_IB_TIMEOUT=14, when every packet is dropped), every
    result is exact and both ranks exit 0. RCOLL_TEST_FAILOVER_TRIALS trials (default 1)."""
    ops = 10
    cut_op, other_ops = [], []
    for trial in range(int(os.environ.get("RCOLL_TEST_FAILOVER_TRIALS", "1"))):
        mark = tmp_path / f"cut{trial}"
        # Retry count 6: rxe retries without end at 7.
        envs = [dict(RCOLL_TRANSPORT="ib", RCOLL_IB_HCA=hca, RCOLL_IB_TIMEOUT="14", RCOLL_IB_RETRY_CNT="6",
                     RCOLL_TEST_MARK=str(mark), RCOLL_TEST_OPS=str(ops)) for hca in ("rxe0,rxe2", "rxe1,rxe3")]
        cut_commands, restore = CUTS[cut]
        outcomes = _cut_while_running(envs, FAILOVER_RANK, [(mark.with_suffix(".2"), "its third allreduce",
                                                              cut_commands)], restore)
        for rank, (code, out, err) in enumerate(outcomes):
            assert code == 0 and "Traceback" not in err, (trial, rank, code, out, err[-3000:])
            report = json.loads(out.strip().splitlines()[-1])
            assert report["ok"] and len(report["times"]) == ops, (trial, rank, report)
            mine, other = ("rxe2:1", 1) if rank == 0 else ("rxe3:1", 0)
            warnings = [line for line in err.splitlines() if "WARN" in line]
            assert len(warnings) == 1, (trial, rank, err[-3000:])
            assert f"the RDMA port {mine} to rank {other} failed" in warnings[0], warnings
            assert "its messages go on over rxe" in warnings[0], warnings
            slowest = max(range(2, 5), key=lambda i: report["times"][i])  # the cut comes during op 2
            cut_op.append(report["times"][slowest])
            other_ops += [t for i, t in enumerate(report["times"]) if i not in (0, slowest)]
        if cut == "link down":  # the port comes back for what runs next
            _wait_for_ports_back(("rxe2", "rxe3"))
    spread = " / ".join(f"{f(cut_op):.2f}" for f in (min, statistics.median, max))
    others = " / ".join(f"{f(other_ops):.2f}" for f in (min, statistics.median, max))
    print(f"{cut}: {len(cut_op) // 2} trial(s), the op the link failed in took {spread} s (min / median / max), "
          f"the others {others} s")


@pytest.mark.parametrize("when", ["in turn", "at once"])
def test_two_of_three_ports_fail_and_the_third_takes_their_messages(when, tmp_path):
    """Three ports each (rxe0, rxe2, rxe4 against rxe1, rxe3, rxe5; the side channels on loopback, so that
    only the ports' links fail). In turn: every packet on rxe2-rxe3 is dropped during the third of twelve
    allreduces, and its messages go on over rxe0-rxe1; then every packet on rxe0-rxe1 during the seventh, and
    the messages of both go on over rxe4-rxe5 (IPv6). At once: both during the third, each end seeing the
    two failures in its own order. Each rank warns once per failed port, every result is exact, both exit 0."""
    ops = 12
    mark = tmp_path / "cut"
    cut_at = {"in turn": (2, 6), "at once": (2,)}[when]
    # Acks awaited 268 ms (16), not 67 ms (14) as in the two-port tests: on a loaded CI machine the guest
    # stalls for tens of ms, three ports' measurements at set-up then saw writes sent again before their
    # acks came, and rdma_rxe (Debian's 6.1) failed one of them with "remote invalid request" (3 CI runs
    # of 6, never here). A cut then takes 7 x 268 ms to be seen.
    envs = [dict(RCOLL_TRANSPORT="ib", RCOLL_IB_HCA=hca, RCOLL_SOCKET_IFNAME="=lo", RCOLL_IB_TIMEOUT="16",
                 RCOLL_IB_RETRY_CNT="6", RCOLL_TEST_MARK=str(mark), RCOLL_TEST_OPS=str(ops),
                 RCOLL_TEST_CUT_AT=",".join(map(str, cut_at))) for hca in ("rxe0,rxe2,rxe4", "rxe1,rxe3,rxe5")]

    cuts = [(mark.with_suffix(".2"), "its third allreduce", _drop_every_packet("sr2")[0]),
            (mark.with_suffix(".6"), "its seventh allreduce", _drop_every_packet("sr0")[0])]
    if when == "at once":
        cuts = [(mark.with_suffix(".2"), "its third allreduce", _drop_every_packet("sr2", "sr0")[0])]
    restore = _drop_every_packet("sr0", "sr2")[1]
    outcomes = _cut_while_running(envs, FAILOVER_RANK, cuts, restore)
    for rank, (code, out, err) in enumerate(outcomes):
        assert code == 0 and "Traceback" not in err, (rank, code, out, err[-3000:])
        report = json.loads(out.strip().splitlines()[-1])
        assert report["ok"] and len(report["times"]) == ops, (rank, report)
        warnings = [line for line in err.splitlines() if "WARN" in line]
        assert len(warnings) == 2, (rank, err[-3000:])
        other = 1 - rank
        first, second, last = ("rxe2:1", "rxe0:1", "rxe4:1") if rank == 0 else ("rxe3:1", "rxe1:1", "rxe5:1")
        if when == "in turn":
            assert f"the RDMA port {first} to rank {other} failed" in warnings[0], warnings
            assert warnings[0].endswith(f"its messages go on over {second}"), warnings
            assert f"the RDMA port {second} to rank {other} failed" in warnings[1], warnings
        else:
            assert sorted(port for w in warnings for port in (first, second)
                          if f"the RDMA port {port} to rank {other} failed" in w) == sorted((first, second)), warnings
        assert warnings[1].endswith(f"its messages go on over {last}"), warnings


EVERY_PORT_CUT_RANK = r"""
import json, os, time
import numpy as np
import rcoll
comm = rcoll.init(timeout=120)
rank = comm.rank
x = np.ones(1 << 20, np.float32)
for i in range(2):
    comm.allreduce(x)
if rank == 0:
    open(os.environ["RCOLL_TEST_MARK"], "w").close()  # the test cuts every link now
start = time.monotonic()
try:
    while True:
        comm.allreduce(x)
except rcoll.RcollError as e:
    print(json.dumps({"error": type(e).__name__, "message": str(e), "seconds": time.monotonic() - start}))
"""


def test_with_every_port_cut_the_op_fails_with_a_peer_error(tmp_path):
    """Both ports' links drop every packet: the port that took the first one's messages fails in turn, and
    each rank's op fails with a PeerError naming the other, long before the op's timeout."""
    mark = tmp_path / "cut"
    envs = [dict(RCOLL_TRANSPORT="ib", RCOLL_IB_HCA=hca, RCOLL_IB_TIMEOUT="14", RCOLL_IB_RETRY_CNT="6",
                 RCOLL_TEST_MARK=str(mark)) for hca in ("rxe0,rxe2", "rxe1,rxe3")]
    cut, restore = _drop_every_packet("sr0", "sr2")
    outcomes = _cut_while_running(envs, EVERY_PORT_CUT_RANK, [(mark, "the end of its first allreduces", cut)], restore)
    for rank, (code, out, err) in enumerate(outcomes):
        assert code == 0 and "Traceback" not in err, (rank, code, out, err[-3000:])
        report = json.loads(out.strip().splitlines()[-1])
        assert report["error"] == "PeerError" and f"rank {1 - rank}" in report["message"], (rank, report)
        assert report["seconds"] < 60, (rank, report)  # the links' failures, not the 120 s timeout


FIRST_USE_RANK = r"""
import json, os, time
import numpy as np
import rcoll
comm = rcoll.init(timeout=120)
rank, ops = comm.rank, 4
mark = os.environ["RCOLL_TEST_MARK"]
# A word from rank 1 to rank 0: the pair's first message, dealt to rail 0, connects both rails. The rank
# named by RCOLL_TEST_FIRST posts its part first: the higher rank dials the lower; the lower asks the higher
# to dial it.
if rank != int(os.environ["RCOLL_TEST_FIRST"]):
    time.sleep(0.5)
word = np.full(4, rank, np.int32)
if rank == 1:
    comm.send(word, 0)
else:
    comm.recv(word, 1)
# Rank 0's first message to rank 1 is dealt to rail 0 too (each way has its own count).
base = np.arange(1 << 20, dtype=np.float32)
ok = bool((word == 1).all()) if rank == 0 else True
for i in range(ops):
    if rank == 0:
        if i == 0:
            open(mark, "w").close()  # the test cuts rail 0's link now ...
            while not os.path.exists(mark + ".cut"):  # ... and says when it has
                time.sleep(0.01)
        comm.send(base + i, 1)
    else:
        y = np.empty_like(base)
        comm.recv(y, 0)
        ok &= bool((y == base + i).all())
print(json.dumps({"ok": ok}))
comm.shutdown()
"""


@pytest.mark.parametrize("first", [1, 0], ids=["the higher rank first", "the lower rank first"])
def test_a_pair_connected_on_first_use_hands_its_first_messages_to_the_other_port(first, tmp_path):
    """Point-to-point messages go over queue pairs made on first use: the pair's first message (a word from
    rank 1 to rank 0) connects both ports, though it is dealt to rxe0-rxe1 alone. Then every packet on that
    link is dropped, and rank 0 sends its first messages to rank 1, dealt to the same link: its writes go
    unacknowledged, and the messages go on over rxe2-rxe3, which nothing had used, every result exact. Both
    ranks warn once and exit 0. Either rank may post the first message first."""
    mark = tmp_path / "cut"
    envs = [dict(RCOLL_TRANSPORT="ib", RCOLL_IB_HCA=hca, RCOLL_SOCKET_IFNAME="=lo", RCOLL_IB_TIMEOUT="14",
                 RCOLL_IB_RETRY_CNT="6", RCOLL_TEST_MARK=str(mark), RCOLL_TEST_FIRST=str(first))
            for hca in ("rxe0,rxe2", "rxe1,rxe3")]
    cut, restore = _drop_every_packet("sr0")
    outcomes = _cut_while_running(envs, FIRST_USE_RANK,
                                  [(mark, "its first send", cut + [["touch", f"{mark}.cut"]])], restore)
    for rank, (code, out, err) in enumerate(outcomes):
        assert code == 0 and "Traceback" not in err, (rank, code, out, err[-3000:])
        assert json.loads(out.strip().splitlines()[-1])["ok"], (rank, out)
        warnings = [line for line in err.splitlines() if "WARN" in line]
        mine, other = ("rxe0:1", 1) if rank == 0 else ("rxe1:1", 0)
        assert len(warnings) == 1 and f"the RDMA port {mine} to rank {other} failed" in warnings[0], err[-3000:]
        assert warnings[0].endswith("its messages go on over " + ("rxe2:1" if rank == 0 else "rxe3:1")), warnings


def _wait_for_ports_back(devices, seconds=30):
    """Until each device's port is ACTIVE again and has its RoCE v2 GIDs back, of an IPv4-mapped and of a
    2001:db8: address (the two come back apart, the port's state with the link, the GIDs from a work queue)."""
    def active(dev):
        try:
            return open(f"/sys/class/infiniband/{dev}/ports/1/state").read().split()[-1] == "ACTIVE"
        except (OSError, IndexError):
            return False

    def roce_v2_gids(dev):
        port = f"/sys/class/infiniband/{dev}/ports/1"
        gids = []
        for index in os.listdir(f"{port}/gids"):
            try:
                if open(f"{port}/gid_attrs/types/{index}").read().strip() == "RoCE v2":
                    gids.append(open(f"{port}/gids/{index}").read().strip())
            except OSError:  # an empty entry has no type
                pass
        return gids

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if all(active(dev) for dev in devices) and all(
                any(g.startswith("0000:0000:0000:0000:0000:ffff:") for g in gids) and
                any(g.startswith("2001:0db8:") for g in gids) for gids in map(roce_v2_gids, devices)):
            return
        time.sleep(0.2)
    raise AssertionError(f"{devices}: no ACTIVE port with RoCE v2 GIDs {seconds} s after the link came back")
