"""The buffers of asynchronous ops, kept alive until the core is done with them:
the one buffer-lifetime helper of the front ends (the numpy API's arrays, the
torch backend's tensors).

A Handle (or torch Work) holds its op's buffers, but a caller may drop it
before the op ends (an exception unwinds past it, or the result is not
wanted): the core would then read or write freed memory, or a GPU tensor's
memory would go back to torch's allocator while rcoll's streams still use it.
So every async op's buffers are held here too, until the op has completed.
When a numpy Communicator goes away with ops still running, it aborts them
first and lets go of their arrays only once they are over (torch's
ProcessGroups keep their tensors in the work queue for the same reason).
"""
from __future__ import annotations

import collections
import os
import sys
import threading
import time

# Arrays of ops that did not end after their communicator aborted them: never
# freed (a leak, which a warning reports, rather than memory the core may still touch).
_ABANDONED = []


class InFlight:
    def __init__(self):
        self._lock = threading.Lock()
        self._ops = collections.deque()  # (work, arrays), mostly in completion order

    def hold(self, work, arrays):
        with self._lock:
            self._prune()
            if arrays is not None and not work.is_completed():
                self._ops.append((work, arrays))

    def _prune(self):
        ops = self._ops
        while ops and ops[0][0].is_completed():
            ops.popleft()
        if len(ops) > 64:  # one long op at the front must not pin everything behind it
            self._ops = collections.deque(op for op in ops if not op[0].is_completed())

    def running(self) -> bool:
        with self._lock:
            self._prune()
            return bool(self._ops)

    def settle(self, wait_s: float, what: str):
        """After the communicator aborted: waits up to `wait_s` for its ops to end,
        then drops the arrays of those that did and keeps the rest forever."""
        deadline = time.monotonic() + wait_s
        with self._lock:
            ops, self._ops = list(self._ops), collections.deque()
        for work, _ in ops:
            try:
                work.wait(max(0.0, deadline - time.monotonic()))
            except Exception:  # noqa: BLE001 - the op's own error: it ended, which is all this waits for
                pass
        stuck = [(work, arrays) for work, arrays in ops if not work.is_completed()]
        if stuck:
            _ABANDONED.extend(stuck)
            sys.stderr.write(f"[rcoll {os.getpid()}] WARN: {what}: {len(stuck)} ops did not end {wait_s} s after "
                             f"the abort; their arrays are kept (never freed), so the core cannot touch freed memory\n")
