"""The flight recorder, from Python: the last ops of every rcoll communicator
in this process (csrc/flight_recorder.h; docs/operations.md).

The dump is torch's flight-recorder format, so torch's analyzer reads a
job's dumps: ``python -m torch.distributed.flight_recorder <dir>``.
"""
from __future__ import annotations

import os
import pickle
from typing import Optional

from . import _core


def dump_trace(path: Optional[str] = None, reason: str = "rcoll.dump_trace()") -> Optional[str]:
    """Writes this process's flight recorder dump and returns the file's path.

    `path` None: ``RCOLL_TRACE_DIR/rcoll_trace_rank_<rank>``, or nothing (None
    returned) when RCOLL_TRACE_DIR is unset. A directory: its
    ``rcoll_trace_rank_<rank>`` file.
    """
    if path is not None and os.path.isdir(path):
        path = os.path.join(path, f"rcoll_trace_rank_{trace()['rank']}")
    written = _core.dump_trace(path or "", reason)
    return written or None


def trace(reason: str = "rcoll.trace()") -> dict:
    """The flight recorder's dump as a dict (what dump_trace writes, unpickled):
    ``entries`` (oldest first: record_id, process_group, collective_seq_id,
    profiling_name, input_sizes, state, times... and rcoll's rcoll_state,
    rcoll_op, rcoll_algorithm, rcoll_path, rcoll_error), ``pg_config``,
    ``pg_status``, ``rank`` and ``version``."""
    return pickle.loads(_core.trace_pickle(reason))
