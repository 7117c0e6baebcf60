"""Emulated hosts for the multi-host tests: network namespaces joined by veth
links shaped with tbf (this kernel has no sch_netem), addresses from
198.18.0.0/15, everything created and removed by the test. Ranks in one
namespace share memory (one host identity); ranks in different ones talk over
the shaped link."""
import os
import shutil
import subprocess

import pytest


def netns_unavailable():
    """Why namespaces cannot be made here, or None (CI is root)."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces"
    if shutil.which("ip") is None or shutil.which("tc") is None:
        return "iproute2 (`ip`, `tc`) is not installed"
    return None


def needs_netns():
    """A pytest mark: the test is skipped, saying why, where namespaces cannot be made."""
    why = netns_unavailable()
    return pytest.mark.skipif(why is not None, reason=why or "")


def sh(*cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"`{' '.join(cmd)}` failed: {r.stderr.strip()}"


class TwoHosts:
    """Two network namespaces joined by a veth pair (eth0 in each), each end
    shaped to `rate`; `addrs[i]` is host i's address."""

    def __init__(self, rate="1gbit", addrs=("198.18.7.1", "198.18.7.2"), tag="mn"):
        prefix = f"rcoll-{tag}-{os.getpid()}"
        self.spaces = [f"{prefix}-a", f"{prefix}-b"]
        self.addrs = list(addrs)
        self.rate = rate

    def __enter__(self):
        try:
            for ns in self.spaces:
                sh("ip", "netns", "add", ns)
                sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", self.spaces[0], "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns",
               self.spaces[1])
            for ns, addr in zip(self.spaces, self.addrs):
                sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
                sh("ip", "-n", ns, "link", "set", "eth0", "up")
                sh("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", "eth0", "root", "tbf", "rate",
                   self.rate, "burst", "256kb", "latency", "50ms")
        except BaseException:
            self.__exit__()
            raise
        return self

    def link(self, host, up):
        """Takes host `host`'s end of the link down (or up again): its packets stop both ways."""
        sh("ip", "-n", self.spaces[host], "link", "set", "eth0", "up" if up else "down")

    def __exit__(self, *exc):
        for ns in self.spaces:  # deleting a namespace deletes its end of the veth, and so the pair
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
