"""The files through which ranks started by an outside launcher (mpirun,
ip netns exec) report to the parent: DIR/rank<r>.json, {"rank", "rows"} or
{"rank", "error"} with the traceback."""
from __future__ import annotations

import json
import os


class LauncherFailed(RuntimeError):
    """Ranks started by an outside launcher (mpirun, ip netns exec) failed or did not report."""


def write_rank_file(out_dir, rank, doc):
    """Writes `doc` to DIR/rank<r>.json in one step (a temporary file, renamed), so that
    the parent never reads half a file; a rank that failed before it knew its rank
    writes a file of its own that collect_rank_files counts as missing."""
    name = f"rank{rank}.json" if rank >= 0 else f"rank-unknown-{os.getpid()}.json"
    tmp = os.path.join(out_dir, name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f)
    os.replace(tmp, os.path.join(out_dir, name))


def collect_rank_files(out_dir, world, what):
    """Per-rank rows from DIR/rank<r>.json (written by launched_rank); raises on missing or failed ranks."""
    per_rank, failures = [], []
    for r in range(world):
        path = os.path.join(out_dir, f"rank{r}.json")
        try:
            with open(path) as f:
                doc = json.load(f)
        except (OSError, ValueError) as exc:
            failures.append(f"--- rank {r}: no result ({exc})")
            continue
        if "error" in doc:
            failures.append(f"--- rank {r}:\n{doc['error']}")
        else:
            per_rank.append(doc["rows"])
    if failures:
        raise LauncherFailed(f"{len(failures)} of {world} ranks of {what} failed:\n" + "\n".join(failures))
    return per_rank
