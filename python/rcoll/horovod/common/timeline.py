"""Horovod's timeline: hvd.start_timeline(path) / HOROVOD_TIMELINE=path.

A Chrome trace (chrome://tracing, ui.perfetto.dev) written by rank 0, as
Horovod's coordinator writes it: every op name is a row (a trace "process"),
with NEGOTIATE_<KIND> from the round where a rank first offered it until
every rank had (an instant per rank as it offered it), then <KIND> from the
round that ran it until this rank learned it was done (synchronize()), and
CYCLE_START markers at every round when cycles are marked. rcoll's own
per-op timeline (RCOLL_TIMELINE) shows what the core did inside each op.
"""
from __future__ import annotations

import json
import threading
import time
from typing import Dict, Set


class Timeline:
    def __init__(self, path: str, mark_cycles: bool):
        self.mark_cycles = mark_cycles
        self._lock = threading.Lock()
        self._start = time.time()
        self._rows: Dict[str, int] = {}
        # Names inside a slice: an op the timeline started in the middle of
        # gets its slice from the first event it sees.
        self._negotiating: Set[str] = set()
        self._running: Set[str] = set()
        self._file = open(path, "w", encoding="utf-8")  # noqa: SIM115 - closed by close()
        self._file.write("[\n")
        self._put({"name": "process_name", "ph": "M", "pid": 0,
                   "args": {"start_time_since_epoch_in_micros": int(self._start * 1e6)}}, first=True)

    def _put(self, event: dict, first=False):
        # Flushed as written: the file can be read (by Chrome, which accepts
        # the missing bracket) while the job still runs.
        self._file.write(("" if first else ",\n") + json.dumps(event))
        self._file.flush()

    def _event(self, name: str, phase: str, label: str = "", args=None):
        ts = int((time.time() - self._start) * 1e6)
        with self._lock:
            if self._file is None:
                return
            row = self._rows.get(name)
            if row is None:
                row = self._rows[name] = len(self._rows) + 1
                self._put({"name": "process_name", "ph": "M", "pid": row, "args": {"name": name}})
                self._put({"name": "process_sort_index", "ph": "M", "pid": row, "args": {"sort_index": row}})
            event = {"ph": phase, "ts": ts, "pid": row}
            if label:
                event["name"] = label
            if phase == "X":
                event["dur"] = 0
            if args:
                event["args"] = args
            self._put(event)

    def negotiate_start(self, name: str, kind: str):
        if name not in self._negotiating:
            self._negotiating.add(name)
            self._event(name, "B", f"NEGOTIATE_{kind.upper()}")

    def negotiate_rank_ready(self, name: str, kind: str, rank: int):
        self.negotiate_start(name, kind)
        self._event(name, "X", str(rank))

    def negotiate_end(self, name: str):
        if name in self._negotiating:
            self._negotiating.discard(name)
            self._event(name, "E")

    def start(self, name: str, kind: str):
        self._running.add(name)
        self._event(name, "B", kind.upper())

    def end(self, name: str, meta: dict):
        if name in self._running:
            self._running.discard(name)
            tensors = meta.get("tensors") or []
            args = {"dtype": tensors[0][0], "shape": str(list(tensors[0][1]))} if tensors else None
            self._event(name, "E", args=args)

    def cycle(self):
        ts = int((time.time() - self._start) * 1e6)
        with self._lock:
            if self._file is not None:
                self._put({"name": "CYCLE_START", "ph": "i", "ts": ts, "pid": 0, "s": "g"})

    def close(self):
        with self._lock:
            if self._file is not None:
                self._file.write("\n]\n")
                self._file.close()
                self._file = None
