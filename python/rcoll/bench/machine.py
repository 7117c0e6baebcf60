"""What the figures depend on: the machine (CPU, versions, RCOLL_/GLOO_/OMP_
environment) and its load before and after a run."""
from __future__ import annotations

import datetime
import os
import platform
import socket
import sys

import numpy as np


def load_snapshot():
    """The 1/5/15-min load averages and how many qemu-system processes run (other work on this host)."""
    qemu = 0
    for pid in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/comm") as f:
                    qemu += f.read().startswith("qemu-system")
            except OSError:
                pass
    load = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    return {"loadavg": load, "qemu_processes": qemu, "time": datetime.datetime.now().isoformat(timespec="seconds")}


def load_line(before, after):
    """'# host load: ...' for the end of a table (the figures depend on what else ran)."""
    def one(s):
        la = "/".join(f"{x:.1f}" for x in s["loadavg"]) if s.get("loadavg") else "?"
        return f"load avg {la}, {s['qemu_processes']} qemu-system"
    return f"# host load before: {one(before)}; after: {one(after)} (on {os.cpu_count()} cpus)"


def machine_info():
    info = {
        "nproc": os.cpu_count(),
        "usable_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "hostname": socket.gethostname(),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(("RCOLL_", "GLOO_", "OMP_"))},
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        import rcoll
        info["rcoll"] = getattr(rcoll, "__version__", "?")
        info["rcoll_path"] = os.path.dirname(rcoll.__file__)
    except Exception as exc:
        info["rcoll"] = f"import failed: {exc}"
    try:
        import torch
        info["torch"] = torch.__version__
    except Exception:
        info["torch"] = None
    return info
