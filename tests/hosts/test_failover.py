"""A NIC that fails mid-job (docs/network.md): two emulated hosts with two
links each (eth0, eth1, each on a network and a switch of its own, 1 Gbit/s),
two ranks per host, RCOLL_SOCKET_STRIPE=1 so that every pair of ranks on
different hosts has a socket on each network. While the ranks run 64 MiB
allreduces back to back, one host's eth1 goes down or starts dropping every
packet: the sockets on it fail after RCOLL_PEER_TIMEOUT, their messages go
again over eth0, every result stays exact, every rank exits 0, and the
ranks that lost a socket say so in one WARN naming the rank, the peer and
the interface. With both links gone the op fails with a PeerError.

RCOLL_TEST_FAILOVER_TRIALS (default 2) sets the trials per way of failing."""
import json
import os
import random
import re
import time
from pathlib import Path

import pytest
from support import launch
from support.emulated_hosts import Hosts, finish_ranks, needs_netns, start_ranks

RANK_SCRIPT = Path(__file__).parent / "failover_rank.py"
TRIALS = int(os.environ.get("RCOLL_TEST_FAILOVER_TRIALS", "2"))
INFO = r"\[rcoll \d+ rank \d+\] INFO: "
WARN = (r"\[rcoll \d+ rank (\d+)\] WARN: rank \1: the socket to rank (\d+) over eth1 198\.18\.51\.\d+ -> "
        r"198\.18\.51\.\d+:\d+ failed \((.*)\); its messages go on over the other 1 socket\(s\)")
# Rank 0's health watch (docs/operations.md) may name an edge through the failed link: with one socket
# left it carries a fraction of what the others do for a while, which is true.
SLOW_LINK = (r"\[rcoll \d+ rank 0\] WARN: the link from rank \d+ \(host [^)]*\) to rank \d+ \(host [^)]*\) over "
             r"tcp carries [\d.]+ MB/s, ")
ENV = {"RCOLL_SOCKET_STRIPE": "1", "RCOLL_PEER_TIMEOUT": "2", "RCOLL_DEBUG": "WARN", "RCOLL_CONNECT_TIMEOUT": "30"}


def _run_and_break(tmp_path, brk, ops=8, extra_env=None):
    """failover_rank.py at 2x2 with `brk(hosts)` called a moment into the second op."""
    mark = tmp_path / f"mark-{os.urandom(4).hex()}"
    with Hosts(2, tag="failover", subnet="198.18.50", more_links=[("198.18.51", "1gbit")]) as hosts:
        procs = start_ranks(hosts, 2, RANK_SCRIPT, hosts.addrs[0],
                            env={**ENV, "FAILOVER_MARK": str(mark), "FAILOVER_OPS": str(ops), **(extra_env or {})})
        deadline = time.monotonic() + 60
        while not mark.exists() and time.monotonic() < deadline and all(p.poll() is None for p in procs):
            time.sleep(0.01)
        time.sleep(random.uniform(0.0, 0.3))  # somewhere in the middle of an op
        broken_at = time.monotonic()
        brk(hosts)
        outcomes = finish_ranks(procs, timeout=120)
        return outcomes, time.monotonic() - broken_at


def _check(outcomes, label):
    """Every rank exited 0 with exact results, and each socket that failed was
    reported in one WARN at both of its ends, naming a rank on the other host."""
    warned = set()
    for rank, (code, out, err) in enumerate(outcomes):
        assert code == 0, f"{label}: rank {rank} exited {code}\n{out[-2000:]}\n{err[-3000:]}"
        launch.check_rank_output(f"rank {rank}", out, err, allow=(INFO, WARN, SLOW_LINK))
        report = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
        assert report["failures"] == [], (label, report)
        said = re.findall(WARN, err)
        lines = [m.group(0) for m in re.finditer(WARN, err)]
        # One WARN per socket lost (the collectives' and point-to-point's), each naming a rank on the other host.
        assert len(lines) == len(set(lines)), err[-3000:]
        peers = [int(peer) for _, peer, _ in said]
        assert all(peer // 2 != rank // 2 for peer in peers), err[-3000:]
        warned.update((rank, peer) for peer in peers)
        print(f"{label}, rank {rank}: op seconds {report['seconds']}, {[why for _, _, why in said]}")
    assert warned and all((peer, rank) in warned for rank, peer in warned), warned


def _break(how):
    def brk(hosts):
        if how == "link down":
            hosts.link(1, up=False, dev="eth1")
        else:
            hosts.drop(1, on=True, dev="eth1")
    return brk


@needs_netns()
@pytest.mark.timeout(200 + 100 * TRIALS)
@pytest.mark.parametrize("how", ["link down", "every packet dropped"])
def test_a_failed_link_hands_its_messages_to_the_other(tmp_path, how):
    for trial in range(TRIALS):
        outcomes, _ = _run_and_break(tmp_path, _break(how))
        _check(outcomes, f"{how}, trial {trial}")


@needs_netns()
@pytest.mark.timeout(200 + 100 * TRIALS)
def test_messages_sent_again_behind_more_than_the_stash_holds_arrive(tmp_path):
    """Point-to-point streams of 48 x 4 MiB, posted at once and received one by
    one, while eth1 drops every packet: in the seconds before the sockets on
    it are declared failed the receiver's stash fills with the messages that
    came on eth0 (64 MiB), and the messages of eth1 sent again come behind
    more on eth0's socket than that. They arrive all the same, exact."""
    for trial in range(TRIALS):
        outcomes, _ = _run_and_break(tmp_path, _break("every packet dropped"), ops=4,
                                     extra_env={"FAILOVER_STREAM": "48"})
        _check(outcomes, f"stream, trial {trial}")


@needs_netns()
@pytest.mark.timeout(200)
def test_with_every_link_gone_the_op_fails_with_a_peer_error(tmp_path):
    def brk(hosts):
        hosts.link(1, up=False, dev="eth1")
        hosts.link(1, up=False, dev="eth0")

    outcomes, took = _run_and_break(tmp_path, brk, ops=200, extra_env={"RCOLL_DEBUG": "ERROR"})
    for rank, (code, out, err) in enumerate(outcomes):
        assert code != 0, f"rank {rank} finished although its host was cut off\n{out[-2000:]}"
        assert "rcoll.PeerError" in err and f"rank {rank}" in err, err[-3000:]
    assert took < 100, took
