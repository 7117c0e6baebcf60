"""Emulated hosts for the multi-host tests: network namespaces joined by veth
links shaped with tbf (this kernel has no sch_netem), addresses from
198.18.0.0/15, everything created and removed by the test. Ranks in one
namespace share memory (one host identity); ranks in different ones talk over
the shaped link. TwoHosts joins two by one veth pair; Hosts(n) gives each of n
a link to a bridge (the switch) in a namespace of its own. Either can take a
host's link down (`link`) or keep it up and drop every packet (`drop`)."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from support import launch
from support.paths import ROOT


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


def _netem():
    """bench/netem.py as a module (its namespace helpers), loaded once."""
    import importlib.util
    import sys

    if "rcoll_bench_netem" not in sys.modules:
        path = os.path.join(ROOT, "bench", "netem.py")
        spec = importlib.util.spec_from_file_location("rcoll_bench_netem", path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["rcoll_bench_netem"] = module
    return sys.modules["rcoll_bench_netem"]


def sh(*cmd):
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, f"`{' '.join(cmd)}` failed: {r.stderr.strip()}"


def shape(ns, dev, rate):
    """tbf at `rate` on `dev`'s egress in namespace `ns`."""
    sh("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst", "256kb",
       "latency", "50ms")


class _Namespaces:
    """What the emulated topologies share: `spaces[i]` is host i's namespace,
    whose link is eth0; `made` lists every namespace created, removed (and
    whatever still runs inside killed) by __exit__."""

    spaces: list
    made: list

    def link(self, host, up, dev="eth0"):
        """Takes host `host`'s end of link `dev` down (or up again): its packets stop both ways."""
        sh("ip", "-n", self.spaces[host], "link", "set", dev, "up" if up else "down")

    def drop(self, host, on, dev="eth0"):
        """Host `host`'s link `dev` stays up, but every packet to or from it is dropped
        (or no longer): a vanished host, a black-holing switch. Dropped where it
        arrives: on the host's eth0 and on the link's far end (`far_end`), each
        ingress. Not on the host's egress: a packet its own qdisc drops is local
        congestion to TCP, which keeps the data unsent and does not time it out
        as it does a loss. This kernel has neither the matchall classifier nor
        the gact (drop) action: a match-all u32 filter redirects everything to
        an ifb device left down, which mirred drops."""
        for ns, end in ((self.spaces[host], dev), self.far_end(host, dev)):
            if not on:
                sh("tc", "-n", ns, "qdisc", "del", "dev", end, "ingress")
                continue
            if subprocess.run(["ip", "-n", ns, "link", "show", "blackhole"], capture_output=True).returncode != 0:
                sh("ip", "-n", ns, "link", "add", "blackhole", "type", "ifb")  # never set up
            sh("tc", "-n", ns, "qdisc", "add", "dev", end, "ingress")
            sh("tc", "-n", ns, "filter", "add", "dev", end, "parent", "ffff:", "protocol", "all", "u32", "match", "u32",
               "0", "0", "action", "mirred", "egress", "redirect", "dev", "blackhole")

    def _add(self, ns):
        sh("ip", "netns", "add", ns)
        self.made.append(ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")

    def _name_hosts(self):
        """Host i is called spaces[i], at addrs[i], in every host's /etc/hosts
        (`ip netns exec` mounts /etc/netns/<ns>/hosts over it), as on a real
        cluster: launchers that publish their host's name (torch 2.4's
        rendezvous gives the ranks socket.getfqdn() of node 0 as MASTER_ADDR)
        find it. A process takes its host's name with in_host()."""
        table = "127.0.0.1 localhost\n::1 localhost ip6-localhost\n"
        table += "".join(f"{addr} {name}\n" for name, addr in zip(self.spaces, self.addrs)
                         if not addr.lower().startswith("fe80:"))  # a link-local address needs its scope
        for ns in self.spaces:
            os.makedirs(f"/etc/netns/{ns}", exist_ok=True)
            with open(f"/etc/netns/{ns}/hosts", "w") as f:
                f.write(table)

    def in_host(self, host, cmd):
        """`cmd` run in host `host`'s namespace under its hostname (a UTS namespace of its own)."""
        ns = self.spaces[host]
        return ["ip", "netns", "exec", ns, "unshare", "--uts", "sh", "-c", 'hostname "$0" && exec "$@"', ns, *cmd]

    def __exit__(self, *exc):
        for ns in reversed(self.made):
            # A rank the test could not end would keep the namespace (and its veth) alive: killed.
            _netem().remove_namespace(ns)
            shutil.rmtree(f"/etc/netns/{ns}", ignore_errors=True)
        self.made = []


class Hosts(_Namespaces):
    """`n` network namespaces, each with a veth (eth0, address `addrs[i]`,
    f"{subnet}.{i + 1}") whose other end is a port of a bridge in a switch
    namespace of its own, each host's link shaped to `rate` both ways (tbf on
    eth0 and on its switch port): n hosts on one top-of-rack switch."""

    def __init__(self, n, rate="1gbit", subnet="198.18.12", tag="hosts", addresses=None, decoys=False,
                 more_links=()):
        """`addresses[i]`: host i's addresses on eth0 as CIDRs, IPv4 or IPv6
        (default f"{subnet}.{i + 1}/24"); no others are made (no automatic
        link-local one, no duplicate address detection to wait for). `decoys`:
        every host also gets what container hosts have and a job must never
        use: docker0 (172.17.0.1/16) and veth5e1f (10.88.0.1/24), the same
        addresses on every host, up but leading nowhere. `more_links`: a
        (subnet, rate) per further NIC: host i's eth1, eth2, ... at
        f"{subnet}.{i + 1}/24" on a bridge (a switch) of their own, shaped to
        that rate: hosts with several NICs on several networks."""
        prefix = f"rcoll-{tag}-{os.getpid()}"
        self.switch = f"{prefix}-sw"
        self.spaces = [f"{prefix}-{i}" for i in range(n)]
        self.cidrs = addresses or [[f"{subnet}.{i + 1}/24"] for i in range(n)]
        self.addrs = [cidrs[0].split("/")[0] for cidrs in self.cidrs]
        self.rate = rate
        self.decoys = decoys
        self.more_links = list(more_links)
        self.made = []

    def __enter__(self):
        try:
            self._add(self.switch)
            sh("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
            sh("ip", "-n", self.switch, "link", "set", "br0", "up")
            for i, (ns, cidrs) in enumerate(zip(self.spaces, self.cidrs)):
                self._add(ns)
                sh("ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=0",
                   "net.ipv6.conf.default.disable_ipv6=0")
                sh("ip", "-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{i}", "netns",
                   self.switch)
                sh("ip", "-n", ns, "link", "set", "eth0", "addrgenmode", "none")
                for cidr in cidrs:
                    sh("ip", "-n", ns, "addr", "add", cidr, "dev", "eth0", *(["nodad"] if ":" in cidr else []))
                sh("ip", "-n", ns, "link", "set", "eth0", "up")
                if self.decoys:  # a bridge with no ports; a veth pair with both ends in the host
                    sh("ip", "-n", ns, "link", "add", "docker0", "type", "bridge")
                    sh("ip", "-n", ns, "link", "add", "veth5e1f", "type", "veth", "peer", "name", "veth5e1fp")
                    for dev, cidr in (("docker0", "172.17.0.1/16"), ("veth5e1f", "10.88.0.1/24")):
                        sh("ip", "-n", ns, "addr", "add", cidr, "dev", dev)
                        sh("ip", "-n", ns, "link", "set", dev, "up")
                    sh("ip", "-n", ns, "link", "set", "veth5e1fp", "up")
                sh("ip", "-n", self.switch, "link", "set", f"p{i}", "master", "br0")
                sh("ip", "-n", self.switch, "link", "set", f"p{i}", "up")
                shape(ns, "eth0", self.rate)
                shape(self.switch, f"p{i}", self.rate)
                for j, (link_subnet, link_rate) in enumerate(self.more_links, 1):
                    dev, port, bridge = f"eth{j}", f"p{i}l{j}", f"br{j}"
                    if i == 0:
                        sh("ip", "-n", self.switch, "link", "add", bridge, "type", "bridge")
                        sh("ip", "-n", self.switch, "link", "set", bridge, "up")
                    sh("ip", "-n", ns, "link", "add", dev, "type", "veth", "peer", "name", port, "netns", self.switch)
                    sh("ip", "-n", ns, "link", "set", dev, "addrgenmode", "none")
                    sh("ip", "-n", ns, "addr", "add", f"{link_subnet}.{i + 1}/24", "dev", dev)
                    sh("ip", "-n", ns, "link", "set", dev, "up")
                    sh("ip", "-n", self.switch, "link", "set", port, "master", bridge)
                    sh("ip", "-n", self.switch, "link", "set", port, "up")
                    shape(ns, dev, link_rate)
                    shape(self.switch, port, link_rate)
            self._name_hosts()
        except BaseException:
            self.__exit__()
            raise
        return self

    def far_end(self, host, dev="eth0"):
        """(namespace, device) of the other end of host `host`'s link `dev`: its switch port."""
        return self.switch, f"p{host}" if dev == "eth0" else f"p{host}l{dev[3:]}"

    def sent_bytes(self, host, dev="eth0"):
        """Bytes host `host` has sent on `dev` so far (the kernel's counter)."""
        out = subprocess.run(["ip", "-n", self.spaces[host], "-s", "-j", "link", "show", dev], capture_output=True,
                             text=True, check=True).stdout
        doc = json.loads(out)[0]
        return (doc.get("stats64") or doc["stats"])["tx"]["bytes"]


class TwoHosts(_Namespaces):
    """Two network namespaces joined by a veth pair (eth0 in each), each end
    shaped to `rate`; `addrs[i]` is host i's address."""

    def __init__(self, rate="1gbit", addrs=("198.18.7.1", "198.18.7.2"), tag="mn"):
        prefix = f"rcoll-{tag}-{os.getpid()}"
        self.spaces = [f"{prefix}-a", f"{prefix}-b"]
        self.addrs = list(addrs)
        self.rate = rate
        self.made = []

    def __enter__(self):
        try:
            for ns in self.spaces:
                self._add(ns)
            sh("ip", "-n", self.spaces[0], "link", "add", "eth0", "type", "veth", "peer", "name", "eth0", "netns",
               self.spaces[1])
            for ns, addr in zip(self.spaces, self.addrs):
                sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", "eth0")
                sh("ip", "-n", ns, "link", "set", "eth0", "up")
                shape(ns, "eth0", self.rate)
            self._name_hosts()
        except BaseException:
            self.__exit__()
            raise
        return self

    def far_end(self, host, dev="eth0"):
        """(namespace, device) of the other end of host `host`'s link: the other host's eth0."""
        assert dev == "eth0", "two hosts have one link"
        return self.spaces[1 - host], "eth0"


def start_ranks(hosts, per_host, script, master_addr, env=None, per_host_env=None):
    """`script` as `per_host` ranks in each emulated host (RANK, WORLD_SIZE,
    LOCAL_RANK, MASTER_ADDR, MASTER_PORT set as a launcher would), `env` for
    all and `per_host_env[i]` for host i's on top; the processes in rank order."""
    port = str(launch.free_port())
    procs = []
    for host in range(len(hosts.spaces)):
        for local in range(per_host):
            rank = host * per_host + local
            rank_env = launch._clean_env({"RANK": str(rank), "WORLD_SIZE": str(per_host * len(hosts.spaces)),
                                          "LOCAL_RANK": str(local), "MASTER_ADDR": master_addr, "MASTER_PORT": port,
                                          **(env or {}), **((per_host_env or {}).get(host, {}))})
            procs.append(subprocess.Popen(hosts.in_host(host, [sys.executable, str(script)]), env=rank_env,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def finish_ranks(procs, timeout):
    """Waits for start_ranks()' processes (killing what is left past `timeout`);
    [(returncode, stdout, stderr)] in rank order."""
    try:
        deadline = time.monotonic() + timeout
        outputs = [p.communicate(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
        return [(p.returncode, out, err) for p, (out, err) in zip(procs, outputs)]
    finally:
        launch.kill_leftovers(procs)


def torchrun_on_hosts(hosts, script, log_dir, *, nproc, launcher_args=(), host_args=None, timeout=300, env=None):
    """Runs `script` as one multi-node torchrun job: an agent per emulated host
    (in its namespace, `nproc` ranks each), all meeting at the c10d rendezvous
    that host 0's agent hosts. `host_args[i]` (optional) are host i's own
    arguments to the script; host i's rank logs go under log_dir/node{i}; `env`
    adds variables. Returns [(exit code, stderr)] per agent; fails if one
    outlives `timeout` s."""
    port = launch.free_port()
    torchrun = os.path.join(os.path.dirname(sys.executable), "torchrun")
    env = launch._clean_env(env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(
        __import__("rcoll").__file__)), env.get("PYTHONPATH")) if p)
    agents = []
    try:
        endpoint = f"[{hosts.addrs[0]}]" if ":" in hosts.addrs[0] else hosts.addrs[0]  # IPv6: [addr]:port
        for node, addr in enumerate(hosts.addrs):
            cmd = hosts.in_host(node, [
                torchrun, "--nnodes", str(len(hosts.spaces)), "--nproc-per-node", str(nproc),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"{endpoint}:{port}", "--rdzv-id", f"rcoll-{port}",
                # The endpoint's address is on this namespace's eth0, which torch's
                # hostname check cannot see: say which node hosts the store.
                "--rdzv-conf", f"is_host={int(node == 0)}", "--local-addr", addr,
                "--log-dir", os.path.join(str(log_dir), f"node{node}"), "--redirects", "3", *launcher_args,
                str(script), *(host_args[node] if host_args else ())])
            agents.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        deadline = time.monotonic() + timeout
        outcomes = []
        for node, agent in enumerate(agents):
            try:
                _, err = agent.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for other in agents:
                    other.kill()
                said = "\n".join(f"--- node {i}'s agent:\n{a.communicate()[1][-2500:]}" for i, a in enumerate(agents))
                raise AssertionError(f"node {node}'s torchrun did not end within {timeout} s\n{said}") from None
            outcomes.append((agent.returncode, err))
        return outcomes
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()


def mpirun_on_hosts(hosts, argv, log_dir, *, slots, hostfile=None, env=None, timeout=300):
    """Runs `argv` as one Open MPI job, `slots` ranks on each emulated host, as
    a user runs `mpirun -H a:2,b:2` (or `--hostfile`, written to `hostfile`,
    `a slots=2` per line) across real hosts: mpirun in host 0's namespace
    starts an orted on each other host through a remote shell that enters its
    namespace (ssh's place; Open MPI's out-of-band traffic crosses the link).
    Each rank's output goes to log_dir/1/rank.N/{stdout,stderr} (Open MPI's
    --output-filename). `env` is passed with -x, as users pass MASTER_ADDR.
    Returns (mpirun's exit code, its stderr); fails if it outlives `timeout` s."""
    agent = Path(log_dir) / "netns-rsh"
    agent.write_text("#!/bin/sh\n"
                     "# Open MPI's remote shell between emulated hosts: a host's name is its namespace's.\n"
                     'while [ "${1#-}" != "$1" ]; do shift; done  # ssh options, if any\n'
                     'host=$1; shift\n'
                     'exec ip netns exec "$host" unshare --uts /bin/sh -c "hostname $host && $*"\n')
    agent.chmod(0o755)
    if hostfile is not None:
        Path(hostfile).write_text("".join(f"{name} slots={slots}\n" for name in hosts.spaces))
        placement = ["--hostfile", str(hostfile)]
    else:
        placement = ["-H", ",".join(f"{name}:{slots}" for name in hosts.spaces)]
    passed = [*(env or {}), "PYTHONPATH"]
    env = launch._clean_env(env)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(os.path.dirname(
        __import__("rcoll").__file__)), env.get("PYTHONPATH")) if p)
    cmd = ["mpirun", "--allow-run-as-root", "-np", str(slots * len(hosts.spaces)), *placement,
           "--mca", "plm_rsh_agent", str(agent), "--mca", "plm_rsh_no_tree_spawn", "1",
           "--mca", "oob_tcp_if_include", "eth0", "--output-filename", str(log_dir)]
    for name in passed:
        cmd += ["-x", name]
    proc = subprocess.Popen(hosts.in_host(0, cmd + list(argv)), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"mpirun did not end within {timeout} s\n{proc.communicate()[1][-3000:]}") from None
    return proc.returncode, err
