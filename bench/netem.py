#!/usr/bin/env python3
"""Emulated multi-host benchmark: one network namespace per host, shaped links.

    sudo PYTHONPATH=python python3 bench/netem.py --worlds 2,4 --rates 10gbit,25gbit \\
        --backends rcoll,gloo --min-bytes 1M --max-bytes 64M [--delay 50us] [--json out.json]
    sudo PYTHONPATH=python python3 bench/netem.py --layouts AABB,ABAB,AAAABBBB --rates 1gbit \\
        --min-bytes 16M --max-bytes 64M

`--worlds W` puts one rank on each of W hosts; `--layouts` places several ranks
per host, one letter per rank naming its host (ABAB: ranks 0 and 2 on host A,
1 and 3 on host B). Ranks of one host share its namespace, so rcoll sees them as
one host (shared memory between them) and only traffic between hosts crosses
the shaped links.

Topology (created fresh for each run, everything named rcoll-bench-<pid>-*):

    namespace rcoll-bench-<pid>-r<i>  (one per host, i = 0..H-1)
        eth0  198.18.0.<i+1>/24      veth; its peer v<i> sits in the switch namespace
    namespace rcoll-bench-<pid>-sw
        br0   a bridge enslaving v0 .. v<W-1>   (the "top-of-rack switch")

Every link is shaped in both directions with a `tbf` qdisc at the link rate
(rank -> switch on eth0, switch -> rank on v<i>), so each rank has a full-duplex
port of that rate, as a host with one NIC in a rack would. With `--delay D` (default
50us) a `netem` qdisc adds D of one-way latency per hop, if the kernel has sch_netem;
if it does not (this project's Firecracker VMs do not), the script says so and runs
without the added delay.

Ranks are started with `ip netns exec <ns> python3 -m rcoll.bench.launched_rank`, i.e. the
same per-rank code as `python -m rcoll bench` (warm-up, barrier, timed iterations, then one
op checked element by element). Rank 0 hosts the rendezvous store (rcoll's, or
torch's TCPStore for gloo): MASTER_ADDR is 198.18.0.1, the address of rank 0's
namespace. RCOLL_SOCKET_IFNAME=eth0 and GLOO_SOCKET_IFNAME=eth0 make both backends
put their data sockets on the veth (there is nothing else but lo in a namespace).
The Open MPI backend (`mpi`; needs mpirun and mpi4py) is started by one
mpirun in rank 0's namespace, which reaches the other hosts' namespaces through a
remote-shell script in place of ssh (see mpi_command).
The bytes counted on each eth0 before and after are reported next to the bytes
the op must move, so that it is visible that the traffic crossed the shaped link.

Before the collectives, a plain TCP stream rank 1 -> rank 0 for `--link-seconds`
measures what the shaped link really carries ("link check"); busbw is reported as a
percentage of the nominal rate (and in the JSON, of the measured one).

Everything created is removed on exit: normal end, an exception, Ctrl-C, SIGTERM or
SIGHUP (rank processes are killed first, then the namespaces deleted, which deletes
their veths and the bridge). A run killed with SIGKILL cannot clean up: `--cleanup`
deletes every namespace whose name starts with rcoll-bench- and exits.

Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN for `ip netns`), iproute2 (`ip`, `tc`),
veth, bridge and tbf support in the kernel; refuses to run otherwise, saying why.
Note: on one machine every "host" still shares the same CPUs; with 2 cores the ranks
and the kernel's veth/bridge forwarding compete for them, so a rate that the CPUs
cannot move is not reached whatever the shaping (check the link-check line).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

try:  # what the emulated hosts share with the sweep (python -m rcoll bench)
    from rcoll.bench.combine import merge
    from rcoll.bench.machine import load_line, load_snapshot, machine_info
    from rcoll.bench.mpi_launch import mpi_missing
    from rcoll.bench.ops import DTYPES, OPS, bus_factor, parse_size
    from rcoll.bench.rank_files import LauncherFailed, collect_rank_files
    _SWEEP_IMPORT_ERROR = None
except ImportError as _exc:  # reported by main() after the root check
    _SWEEP_IMPORT_ERROR = _exc

PREFIX = "rcoll-bench-"
SUBNET = "198.18.0"  # 198.18.0.0/15 is reserved for benchmarking (RFC 2544); we use a /24 of it
# rcoll-ring: rcoll with RCOLL_ALGO=ring (the flat ring in host order, where rcoll
# would take the hierarchical allreduce), to compare the two in one run.
# mpi: Open MPI through mpi4py, started by one mpirun (see mpi_command) with its
# defaults (coll/tuned: flat algorithms in rank order). Its hierarchical coll/han
# (`--mca coll_han_priority 100`) is left out: in Open MPI 4.1.4 (Debian 12) it
# hands MPI_IN_PLACE to the reduce inside a host as a buffer and crashes across hosts.
BACKENDS = ("rcoll", "rcoll-ring", "gloo", "mpi")
BACKEND_ENV = {"rcoll-ring": {"RCOLL_ALGO": "ring"}}


def parse_rate(text: str) -> float:
    """'10gbit' -> bits per second (tc's units: kbit, mbit, gbit, decimal); 'none' -> 0 (unshaped)."""
    t = text.strip().lower()
    if t in ("none", "0", "unshaped"):
        return 0.0
    for unit, mult in (("tbit", 1e12), ("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3), ("bit", 1.0)):
        if t.endswith(unit):
            return float(t[: -len(unit)]) * mult
    raise ValueError(f"rate {text!r}: give it as tc does, e.g. 10gbit, 25gbit, 800mbit, or none")


def parse_time_us(text: str) -> float:
    t = text.strip().lower()
    for unit, mult in (("us", 1.0), ("ms", 1e3), ("s", 1e6)):
        if t.endswith(unit):
            return float(t[: -len(unit)]) * mult
    return float(t)


def sh(*cmd, check=True, quiet=False):
    """Runs a command (a list), returns its stdout; raises with its stderr on failure."""
    r = subprocess.run(list(cmd), capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed ({r.returncode}): {r.stderr.strip() or r.stdout.strip()}")
    if not quiet and os.environ.get("RCOLL_BENCH_VERBOSE"):
        print("+ " + " ".join(cmd), file=sys.stderr)
    return r.stdout


# ---------------------------------------------------------------------------------------------
# preflight: refuse clearly
# ---------------------------------------------------------------------------------------------
def preflight():
    """None if this can run, else why not."""
    if os.geteuid() != 0:
        return "needs root (ip netns, veth and tc need CAP_SYS_ADMIN and CAP_NET_ADMIN); run it as root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found: install iproute2"
    probe = f"{PREFIX}{os.getpid()}-probe"
    r = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if r.returncode != 0:
        return f"`ip netns add` does not work here: {r.stderr.strip()}"
    try:
        for cmd, what in ((["ip", "-n", probe, "link", "add", "a0", "type", "veth", "peer", "name", "b0"], "veth"),
                          (["ip", "-n", probe, "link", "add", "br0", "type", "bridge"], "bridge"),
                          (["tc", "-n", probe, "qdisc", "add", "dev", "a0", "root", "tbf", "rate", "1gbit",
                            "burst", "64kb", "latency", "1ms"], "the tbf qdisc")):
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                return f"the kernel lacks {what} support (`{' '.join(cmd)}`: {r.stderr.strip()})"
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


def netem_available():
    probe = f"{PREFIX}{os.getpid()}-probe"
    subprocess.run(["ip", "netns", "add", probe], capture_output=True, check=True)
    try:
        sh("ip", "-n", probe, "link", "add", "a0", "type", "veth", "peer", "name", "b0")
        r = subprocess.run(["tc", "-n", probe, "qdisc", "add", "dev", "a0", "root", "netem", "delay", "50us"],
                           capture_output=True, text=True)
        return r.returncode == 0, r.stderr.strip()
    finally:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)


def remove_namespace(ns):
    """Kills whatever still runs in network namespace `ns`, then deletes it, taking
    its veth ends and bridges with it (also tests/support/emulated_hosts.py's). Returns
    the number of processes killed and why it could not be deleted, or ""."""
    pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
    for pid in pids:
        try:
            os.kill(int(pid), signal.SIGKILL)
        except (OSError, ValueError):
            pass
    r = subprocess.run(["ip", "netns", "del", ns], capture_output=True, text=True)
    return len(pids), r.stderr.strip() if r.returncode != 0 else ""


def cleanup_leftovers():
    names = [line.split()[0] for line in sh("ip", "netns", "list").splitlines() if line.startswith(PREFIX)]
    for n in names:
        killed, _ = remove_namespace(n)
        print(f"deleted namespace {n}" + (f" (killed {killed} processes in it)" if killed else ""))
    if not names:
        print(f"no namespace named {PREFIX}* found")


# ---------------------------------------------------------------------------------------------
# the emulated cluster
# ---------------------------------------------------------------------------------------------
class Cluster:
    """H host namespaces, each with a veth port to a bridge in a switch namespace; removed by close().
    (`ranks` names the host namespaces: with --worlds each holds one rank.)"""

    def __init__(self, hosts, mtu, use_netem, links=1, extra_rate=None):
        """`links`: NICs per host, eth0 .. eth<links-1>, link j on bridge br<j> and
        subnet 198.18.<j>.0/24; links after the first are shaped to `extra_rate`
        (bits/s) when given, else to the run's rate."""
        self.mtu, self.use_netem = mtu, use_netem
        self.links, self.extra_rate = links, extra_rate
        self.tag = f"{PREFIX}{os.getpid()}"
        self.switch = f"{self.tag}-sw"
        self.ranks = [f"{self.tag}-r{i}" for i in range(hosts)]
        self.created = []
        self.procs = []

    def addr(self, i):
        return f"{SUBNET}.{i + 1}"

    def devices(self, i):
        """[(dev, switch port, link index)] of host i's links."""
        return [(f"eth{j}", f"v{i}" if j == 0 else f"v{i}l{j}", j) for j in range(self.links)]

    def create(self):
        sh("ip", "netns", "add", self.switch)
        self.created.append(self.switch)
        for j in range(self.links):
            sh("ip", "-n", self.switch, "link", "add", f"br{j}", "type", "bridge")
            sh("ip", "-n", self.switch, "link", "set", f"br{j}", "up")
        for i, ns in enumerate(self.ranks):
            sh("ip", "netns", "add", ns)
            self.created.append(ns)
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            for dev, port, j in self.devices(i):
                # created inside the rank's namespace, its peer moved straight to the switch's
                sh("ip", "-n", ns, "link", "add", dev, "mtu", str(self.mtu), "type", "veth",
                   "peer", "name", port, "mtu", str(self.mtu), "netns", self.switch)
                sh("ip", "-n", ns, "addr", "add", f"198.18.{j}.{i + 1}/24", "dev", dev)
                sh("ip", "-n", ns, "link", "set", dev, "up")
                sh("ip", "-n", self.switch, "link", "set", port, "master", f"br{j}")
                sh("ip", "-n", self.switch, "link", "set", port, "up")

    def shape(self, rate_bps, delay_us):
        """tbf at rate_bps on both ends of every link (+ netem delay if asked and available); 0 = unshaped.
        Links after eth0 take `extra_rate` when it was given."""
        for i, ns in enumerate(self.ranks):
            for dev_here, port, j in self.devices(i):
                rate = self.extra_rate if j > 0 and self.extra_rate else rate_bps
                for where, dev in ((ns, dev_here), (self.switch, port)):
                    self._shape_one(where, dev, rate, delay_us)

    def _shape_one(self, where, dev, rate_bps, delay_us):
        subprocess.run(["tc", "-n", where, "qdisc", "del", "dev", dev, "root"], capture_output=True)
        if not rate_bps and not (delay_us and self.use_netem):
            return
        parent = ["root"]
        if delay_us and self.use_netem:
            sh("tc", "-n", where, "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem",
               "delay", f"{delay_us:g}us", "limit", "100000")
            parent = ["parent", "1:1"]
        if rate_bps:
            # burst: ~200 us at the rate (at least 256 KiB: several 64 KiB GSO segments);
            # latency: the queue may hold 5 ms at the rate before tbf drops
            burst = max(256 << 10, int(rate_bps / 8 * 200e-6))
            sh("tc", "-n", where, "qdisc", "add", "dev", dev, *parent, "handle", "10:", "tbf",
               "rate", f"{int(rate_bps)}bit", "burst", str(burst), "latency", "5ms")

    def qdiscs(self):
        return {ns: sh("tc", "-n", ns, "qdisc", "show", "dev", "eth0").strip() for ns in self.ranks}

    def counters(self):
        """{host: (tx_bytes, rx_bytes, [tx_bytes per link])} of each host's links together."""
        out = {}
        for i, ns in enumerate(self.ranks):
            tx, rx, per_link = 0, 0, []
            for dev, _, _ in self.devices(i):
                doc = json.loads(sh("ip", "-n", ns, "-s", "-j", "link", "show", dev, quiet=True))[0]
                st = doc.get("stats64") or doc.get("stats")
                tx, rx = tx + st["tx"]["bytes"], rx + st["rx"]["bytes"]
                per_link.append(st["tx"]["bytes"])
            out[i] = (tx, rx, per_link)
        return out

    def popen(self, i, argv, env, **kw):
        p = subprocess.Popen(["ip", "netns", "exec", self.ranks[i]] + argv, env=env, start_new_session=True, **kw)
        self.procs.append(p)
        return p

    def remote_shell(self, directory):
        """A script that Open MPI's rsh launcher calls as `agent [options] HOST COMMAND` in
        place of ssh: it runs COMMAND (an orted) in HOST's namespace. Each host also gets
        a hostname of its own (a UTS namespace, see mpi_command): Open MPI names its
        shared-memory segments after the hostname, and ranks of different hosts must not
        meet there."""
        path = os.path.join(directory, "netns-rsh")
        cases = "".join(f"  {self.addr(i)}) ns={ns} ;;\n" for i, ns in enumerate(self.ranks))
        with open(path, "w") as f:
            f.write("#!/bin/sh\n"
                    "# written by bench/netem.py: Open MPI's remote shell between emulated hosts\n"
                    'while [ "${1#-}" != "$1" ]; do shift; done  # ssh options, if any\n'
                    'host=$1; shift\n'
                    f'case "$host" in\n{cases}  *) echo "netns-rsh: unknown host $host" >&2; exit 1 ;;\nesac\n'
                    'exec ip netns exec "$ns" unshare --uts /bin/sh -c "hostname $ns && $*"\n')
        os.chmod(path, 0o755)
        return path

    def kill_all(self):
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    pass
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.procs = []

    def close(self):
        self.kill_all()
        for ns in reversed(self.created):
            _, why = remove_namespace(ns)  # anything still inside (it should not be) is killed
            if why:
                print(f"warning: could not delete namespace {ns}: {why}", file=sys.stderr)
        self.created = []


# ---------------------------------------------------------------------------------------------
# a raw TCP stream across the shaped link: what the link really carries
# ---------------------------------------------------------------------------------------------
_SINK = r"""
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(1); s.settimeout(30)
print("ready", flush=True)
c, _ = s.accept(); c.settimeout(30)
buf = bytearray(4 << 20); mv = memoryview(buf); got = 0; t0 = None; tl = None
while True:
    n = c.recv_into(mv)
    if n == 0:
        break
    now = time.perf_counter()
    if t0 is None:
        t0 = now
    else:
        got += n
    tl = now
print(got / max(tl - t0, 1e-9) if t0 is not None else 0.0, flush=True)
"""
_SOURCE = r"""
import socket, sys, time
c = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=30)
buf = bytes(4 << 20); end = time.perf_counter() + float(sys.argv[3])
while time.perf_counter() < end:
    c.sendall(buf)
c.shutdown(socket.SHUT_WR); c.recv(1); c.close()
"""


def link_check(cluster, seconds, env):
    """Bytes/s of one TCP stream from rank 1's namespace to rank 0's (after the first read)."""
    port = "29499"
    sink = cluster.popen(0, [sys.executable, "-c", _SINK, cluster.addr(0), port], env,
                         stdout=subprocess.PIPE, text=True)
    try:
        if sink.stdout.readline().strip() != "ready":
            raise RuntimeError("link check: the receiver did not start")
        src = cluster.popen(1, [sys.executable, "-c", _SOURCE, cluster.addr(0), port, str(seconds)], env)
        src.wait(timeout=seconds + 60)
        out, _ = sink.communicate(timeout=60)
        return float(out.strip().splitlines()[-1])
    finally:
        cluster.kill_all()


# ---------------------------------------------------------------------------------------------
# one backend at one world size
# ---------------------------------------------------------------------------------------------
def run_backend(cluster, backend, layout, cfg, timeout, base_env, port):
    """Runs the sweep with rank r on host layout[r]; returns the merged rows and
    {host: (bytes sent, bytes received)} on each host's link."""
    world = len(layout)
    with tempfile.TemporaryDirectory(prefix="rcoll-netem-") as tmp:
        cfg_path = os.path.join(tmp, "cfg.json")
        with open(cfg_path, "w") as f:
            json.dump(cfg, f)
        before = cluster.counters()
        procs = []
        if backend == "mpi":
            # one mpirun in the first rank's namespace, under that host's own hostname
            cmd = mpi_command(cluster, layout, cfg_path, tmp)
            ns0 = cluster.ranks[layout[0]]
            procs.append(cluster.popen(layout[0], ["unshare", "--uts", "sh", "-c", f'hostname {ns0} && exec "$@"',
                                                   "sh"] + cmd, base_env))
        else:  # one process per rank, in its host's namespace, as torchrun would start it
            for r, host in enumerate(layout):
                env = dict(base_env, **BACKEND_ENV.get(backend, {}))
                env.update(RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(layout[:r].count(host)),
                           LOCAL_WORLD_SIZE=str(layout.count(host)), MASTER_ADDR=cluster.addr(layout[0]),
                           MASTER_PORT=str(port), RCOLL_SOCKET_IFNAME="eth", GLOO_SOCKET_IFNAME="eth0",
                           RCOLL_SOCKET_STRIPE="1" if cluster.links > 1 else "0")
                procs.append(cluster.popen(host, [sys.executable, "-m", "rcoll.bench.launched_rank", "--cfg", cfg_path,
                                               "--out", tmp, "--backend", backend.split("-")[0], "--launcher", "env"],
                                           env))
        deadline = time.monotonic() + timeout
        failed_at = None
        while any(p.poll() is None for p in procs):
            now = time.monotonic()
            if failed_at is None and any(p.poll() not in (None, 0) for p in procs):
                failed_at = now  # the others get 10 s to report their (usually consequential) errors
            if now > deadline or (failed_at is not None and now > failed_at + 10):
                break
            time.sleep(0.2)
        timed_out = any(p.poll() is None for p in procs)
        cluster.kill_all()
        after = cluster.counters()
        try:
            per_rank = collect_rank_files(tmp, world, f"{backend} world {world}")
        except LauncherFailed as exc:
            if timed_out and failed_at is None:
                raise LauncherFailed(
                    f"{backend} world {world} did not finish within {timeout} s\n{exc}") from None
            raise
    moved = {h: (after[h][0] - before[h][0], after[h][1] - before[h][1],
                 [a - b for a, b in zip(after[h][2], before[h][2])]) for h in sorted(set(layout))}
    return merge(per_rank, world), moved


def mpi_command(cluster, layout, cfg_path, out_dir):
    """mpirun for `layout`: one application context per rank (MPMD syntax), so that rank r
    runs on host layout[r] whatever the placement; orteds reach the other hosts through
    Cluster.remote_shell. Data and out-of-band traffic on eth0; between ranks of one host
    shared memory (vader), as on real hosts."""
    rank_argv = [sys.executable, "-m", "rcoll.bench.launched_rank", "--cfg", cfg_path, "--out", out_dir,
                 "--backend", "mpi", "--launcher", "mpi"]
    cmd = ["mpirun", "--allow-run-as-root", "--oversubscribe", "--bind-to", "none",
           "--mca", "plm_rsh_agent", cluster.remote_shell(out_dir), "--mca", "plm_rsh_no_tree_spawn", "1",
           "--mca", "oob_tcp_if_include", "eth0",
           "--mca", "btl_tcp_if_include", ",".join(dev for dev, _, _ in cluster.devices(0)),
           "--mca", "pml", "ob1", "--mca", "btl", "self,vader,tcp"]
    for r, host in enumerate(layout):
        cmd += ([":"] if r else []) + ["-np", "1", "--host", cluster.addr(host)] + rank_argv
    return cmd


def expected_wire_bytes(rows, world, hosts=None):
    """Payload bytes one rank must send (ring) for all the iterations of `rows` (timed + warm-up + check):
    also what each host's link must carry when the ring crosses it once per direction. With `hosts`
    (H hosts of equal size, at least two ranks each), an allreduce counts 2(H-1)/H of the buffer:
    what the hierarchical allreduce sends over each host link."""
    total = 0
    for r in rows:
        if "bytes" not in r or r.get("iters") is None:
            continue
        n_ops = r["iters"] + (r.get("warmup") or 0) + 1
        factor = bus_factor(r["op"], world)
        if hosts and r["op"] == "allreduce":
            factor = 2 * (hosts - 1) / hosts
        total += n_ops * r["bytes"] * factor
    return total


def hierarchical_hosts(layout, backend):
    """The number of hosts when `backend` runs the hierarchical allreduce on `layout`, else None."""
    counts = [layout.count(h) for h in sorted(set(layout))]
    fits = len(counts) > 1 and len(set(counts)) == 1 and counts[0] > 1
    return len(counts) if fits and backend == "rcoll" else None


# ---------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------
def fmt_rate(bps):
    return "unshaped" if not bps else (f"{bps / 1e9:g}gbit" if bps >= 1e9 else f"{bps / 1e6:g}mbit")


def print_table(records, backends):
    lines = ["# bench/netem.py: one network namespace per host, veth + bridge, tbf-shaped links; "
             "time = slowest rank; busbw GB/s (10^9 B/s); %link = busbw / nominal link rate"]
    head = f"{'link':>9} {'ranks':>8} {'op':>10} {'size(B)':>10}"
    for b in backends:
        head += f" | {b + ' us':>11} {'busbw':>6} {'%link':>5} {'#wrong':>6}"
    if "rcoll" in backends and len(backends) > 1:
        head += "".join(f" | {'rcoll/' + b:>10}" for b in backends if b != "rcoll")
    lines.append(head)
    for rec in records:
        link_GBps = rec["rate_bps"] / 8e9
        idx = {b: {(r["op"], r["bytes"]): r for r in rec["results"].get(b, [])} for b in backends}
        keys = sorted({k for b in backends for k in idx[b]}, key=lambda k: (OPS.index(k[0]), k[1]))
        for op, nbytes in keys:
            line = f"{fmt_rate(rec['rate_bps']):>9} {rec['label']:>8} {op:>10} {nbytes:>10}"
            for b in backends:
                r = idx[b].get((op, nbytes))
                if r is None or "busbw_GBps" not in r:
                    line += f" | {('error' if r else '-'):>11} {'-':>6} {'-':>5} {'-':>6}"
                else:
                    pct = f"{100 * r['busbw_GBps'] / link_GBps:.0f}" if link_GBps else "-"
                    line += f" | {r['time_us']:>11.0f} {r['busbw_GBps']:>6.3f} {pct:>5} {r['wrong']:>6}"
            for b in backends:
                if b == "rcoll" or "rcoll" not in backends:
                    continue
                a, c = idx["rcoll"].get((op, nbytes)), idx[b].get((op, nbytes))
                if a and c and a.get("busbw_GBps") and c.get("busbw_GBps"):
                    line += f" | {a['busbw_GBps'] / c['busbw_GBps']:>9.2f}x"
                else:
                    line += f" | {'-':>10}"
            lines.append(line)
    lines.append("# link check (one TCP stream host 1 -> host 0, GB/s) and the most bytes a host sent on its link "
                 "vs one ring edge's payload:")
    for rec in records:
        parts = [f"{fmt_rate(rec['rate_bps'])} {rec['label']}: stream "
                 + (f"{rec['link_check_GBps']:.3f}" if rec.get("link_check_GBps") is not None else "-")]
        for b in backends:
            m = rec.get("wire", {}).get(b)
            if m:
                what = "hierarchical" if hierarchical_hosts(rec["layout"], b) else "ring edge"
                per_link = ""
                moved = rec.get("per_host_wire_bytes", {}).get(b, {})
                busiest = max(moved.values(), key=lambda v: v[0], default=None)
                if busiest is not None and len(busiest) > 2 and len(busiest[2]) > 1:
                    per_link = " = " + " + ".join(f"eth{j} {n / 1e6:.0f}" for j, n in enumerate(busiest[2]))
                parts.append(f"{b} sent {m['sent_max'] / 1e6:.0f} MB/host{per_link} ({what} payload "
                             f"{m['payload'] / 1e6:.0f} MB)")
        lines.append("#   " + "; ".join(parts))
    for rec in records:
        for b, msg in rec["errors"].items():
            lines.append(f"# {fmt_rate(rec['rate_bps'])} {rec['label']} {b} FAILED: {msg.splitlines()[0]}")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--worlds", default="2,4", help="comma-separated world sizes (one namespace per rank, max 200)")
    p.add_argument("--layouts", default="",
                   help="comma-separated placements, one letter per rank naming its host (AABB, ABAB, AAAABBBB); "
                        "replaces --worlds")
    p.add_argument("--rates", default="10gbit,25gbit", help="link rates as tc writes them, or `none` for unshaped")
    p.add_argument("--delay", default="50us", help="one-way delay per hop with netem, if the kernel has it (0: none)")
    p.add_argument("--mtu", type=int, default=1500)
    p.add_argument("--links", type=int, default=1,
                   help="NICs per host (eth0.., each on a network of its own); rcoll (RCOLL_SOCKET_STRIPE=1) and "
                        "Open MPI use all of them, Gloo eth0 (it takes one)")
    p.add_argument("--extra-link-rate", default="", help="rate of the links after eth0 (default: the run's rate)")
    p.add_argument("--backends", default="rcoll,gloo")
    p.add_argument("--ops", default="allreduce", help="subset of allreduce,allgather,broadcast,reduce_scatter")
    p.add_argument("--min-bytes", default="1M")
    p.add_argument("--max-bytes", default="64M")
    p.add_argument("--factor", type=float, default=4.0)
    p.add_argument("--iters", type=int, default=0,
                   help="timed iterations (default: adaptive, as in python -m rcoll bench)")
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--dtype", default="float32", help="float32 (default), float64, float16, bfloat16, int32, int64")
    p.add_argument("--link-seconds", type=float, default=1.0, help="length of the link check (0: skip it)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one backend at one world size may take")
    p.add_argument("--op-timeout", type=float, default=120.0)
    p.add_argument("--json", help="write everything to this JSON file")
    p.add_argument("--cleanup", action="store_true",
                   help=f"delete leftover {PREFIX}* namespaces (of a run killed with SIGKILL) and exit")
    args = p.parse_args(argv)

    why = preflight()
    if why:
        print(f"error: bench/netem.py cannot run: {why}", file=sys.stderr)
        return 2
    if args.cleanup:
        cleanup_leftovers()
        return 0
    if _SWEEP_IMPORT_ERROR is not None:
        print(f"error: cannot import rcoll.bench ({_SWEEP_IMPORT_ERROR}); "
              "install rcoll or set PYTHONPATH=<checkout>/python",
              file=sys.stderr)
        return 2
    if args.dtype not in DTYPES:
        p.error(f"--dtype: choose from {', '.join(sorted(DTYPES))}")

    if args.layouts:
        placements = []
        for text in (t.strip() for t in args.layouts.split(",") if t.strip()):
            letters = sorted(set(text))
            if not text.isalpha() or len(letters) < 2 or len(text) > 200:
                p.error(f"--layouts {text}: one letter per rank naming its host, at least two hosts")
            placements.append((text, [letters.index(c) for c in text]))
    else:
        worlds = sorted({int(w) for w in args.worlds.split(",") if w.strip()})
        if not worlds or worlds[0] < 2 or worlds[-1] > 200:
            p.error("--worlds: sizes from 2 to 200")
        placements = [(f"{w}x1", list(range(w))) for w in worlds]
    try:
        rates = [parse_rate(r) for r in args.rates.split(",") if r.strip()]
    except ValueError as exc:
        p.error(str(exc))
    delay_us = parse_time_us(args.delay)
    backends = [b.strip() for b in args.backends.split(",") if b.strip()]
    if [b for b in backends if b not in BACKENDS]:
        p.error(f"--backends: choose from {', '.join(BACKENDS)}")
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    if [o for o in ops if o not in OPS]:
        p.error(f"--ops: choose from {', '.join(OPS)}")
    if "gloo" in backends:
        try:
            import torch.distributed as dist
            if not dist.is_available() or not dist.is_gloo_available():
                raise ImportError("no gloo in this torch build")
        except ImportError as exc:
            print(f"note: skipping the gloo backend: torch is not usable ({exc})", file=sys.stderr)
            backends.remove("gloo")
    if "mpi" in backends:
        why_not = mpi_missing()
        if why_not:
            print(f"note: skipping the mpi backend: {why_not}", file=sys.stderr)
            backends.remove("mpi")
    if not backends:
        print("error: no backend left to run", file=sys.stderr)
        return 2
    lo, hi = parse_size(args.min_bytes), parse_size(args.max_bytes)
    sizes, s = [], lo
    while s <= hi:
        sizes.append(int(s))
        s *= args.factor

    use_netem = False
    if delay_us > 0:
        use_netem, err = netem_available()
        if not use_netem:
            print(f"note: --delay {args.delay} is not applied: this kernel has no netem qdisc ({err}); "
                  f"links are rate-shaped with tbf only", file=sys.stderr)

    # A clean exit from SIGTERM / SIGHUP too, so that `finally` removes what was created.
    def _raise(signum, frame):
        raise SystemExit(128 + signum)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _raise)

    base_env = dict(os.environ)
    base_env.setdefault("RCOLL_CONNECT_TIMEOUT", "60")
    cfg = {"ops": ops, "sizes": sizes, "iters": args.iters, "warmup": args.warmup, "dtype": args.dtype,
           "async": False, "op_timeout": args.op_timeout}
    cluster = Cluster(max(max(layout) + 1 for _, layout in placements), args.mtu, use_netem, args.links,
                      parse_rate(args.extra_link_rate) if args.extra_link_rate else None)
    records = []
    port = 29600
    t_start = time.monotonic()
    load_before = load_snapshot()
    try:
        print(f"creating {len(cluster.ranks)} host namespaces {cluster.ranks[0]}.. and the switch {cluster.switch}",
              file=sys.stderr, flush=True)
        cluster.create()
        for rate in rates:
            cluster.shape(rate, delay_us)
            print(f"=== link {fmt_rate(rate)}" + (f", delay {delay_us:g} us per hop" if use_netem else "")
                  + f"; eth0 qdisc of rank 0: {cluster.qdiscs()[cluster.ranks[0]] or 'default'}",
                  file=sys.stderr, flush=True)
            check = None
            if args.link_seconds > 0:
                try:
                    check = link_check(cluster, args.link_seconds, base_env) / 1e9
                    print(f"link check: one TCP stream rank 1 -> rank 0 carries {check:.3f} GB/s "
                          f"(nominal {rate / 8e9:.3f} GB/s)" if rate else
                          f"link check: one TCP stream rank 1 -> rank 0 carries {check:.3f} GB/s (unshaped)",
                          file=sys.stderr, flush=True)
                except Exception as exc:
                    print(f"warning: link check failed: {exc}", file=sys.stderr)
            for label, layout in placements:
                world = len(layout)
                rec = {"rate_bps": rate, "world": world, "label": label, "layout": layout, "link_check_GBps": check,
                       "results": {}, "errors": {}, "wire": {}, "per_host_wire_bytes": {}}
                for b in backends:
                    port += 1
                    print(f"--- {b}, {label}, link {fmt_rate(rate)}", file=sys.stderr, flush=True)
                    try:
                        rows, moved = run_backend(cluster, b, layout, cfg, args.timeout, base_env, port)
                        rec["results"][b] = rows
                        rec["per_host_wire_bytes"][b] = moved
                        rec["wire"][b] = {"sent_max": max(v[0] for v in moved.values()),
                                          "payload": expected_wire_bytes(rows, world, hierarchical_hosts(layout, b))}
                    except Exception as exc:
                        rec["errors"][b] = f"{type(exc).__name__}: {exc}"
                        print(f"ERROR: {b} {label}: {exc}", file=sys.stderr, flush=True)
                records.append(rec)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        cluster.close()
        left = [n for n in sh("ip", "netns", "list").split() if n.startswith(cluster.tag)]
        print("removed the namespaces, veths and bridge" if not left else f"WARNING: left behind: {left}",
              file=sys.stderr, flush=True)

    load_after = load_snapshot()
    print(print_table(records, backends))
    print(load_line(load_before, load_after))
    if args.json:
        doc = {"args": vars(args), "sizes": sizes, "netem_delay_applied": use_netem, "records": records,
               "load_before": load_before, "load_after": load_after,
               "machine": machine_info(), "duration_s": time.monotonic() - t_start,
               "created": datetime.datetime.now().isoformat(timespec="seconds")}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"results written to {args.json}", file=sys.stderr)
    bad = any(rec["errors"] for rec in records) or any(
        r.get("wrong") for rec in records for rows in rec["results"].values() for r in rows)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
