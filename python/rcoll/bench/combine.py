"""From the rows of every rank to one row per (op, size), and from several
runs of a backend (--repeats) to their median."""
from __future__ import annotations

from .ops import bus_factor


def merge(per_rank_rows, world):
    """One row per (op, size): the slowest rank's time, the sum of #wrong."""
    merged = []
    for rows in zip(*per_rank_rows):
        first = rows[0]
        row = {k: first[k] for k in ("op", "bytes", "count", "dtype") if k in first}
        row["iters"], row["warmup"] = first.get("iters"), first.get("warmup")
        errors = [f"rank {r['rank']}: {r['error']}" for r in rows if "error" in r]
        if errors:
            row["error"] = "; ".join(errors)
        else:
            times = [r["time_us"] for r in rows]
            row["time_us"] = max(times)
            row["time_us_per_rank"] = times
            row["wrong"] = sum(r["wrong"] for r in rows)
            algbw = row["bytes"] / (row["time_us"] * 1e-6) / 1e9
            row["algbw_GBps"] = algbw
            row["busbw_GBps"] = algbw * bus_factor(row["op"], world)
        merged.append(row)
    return merged


def median_of_repeats(runs, world):
    """One row per (op, size) from several merged runs of a backend: the median
    of the runs' (slowest-rank) times, every run's time kept, #wrong summed."""
    combined = []
    for rows in zip(*runs):
        row = dict(rows[0])
        failed = [r for r in rows if "error" in r]
        if failed:
            combined.append(dict(failed[0]))
            continue
        times = sorted(r["time_us"] for r in rows)
        mid = len(times) // 2
        row["time_us"] = times[mid] if len(times) % 2 else (times[mid - 1] + times[mid]) / 2
        row["time_us_repeats"] = [r["time_us"] for r in rows]
        row["time_us_per_rank"] = [r["time_us_per_rank"] for r in rows]
        row["wrong"] = sum(r["wrong"] for r in rows)
        row["algbw_GBps"] = row["bytes"] / (row["time_us"] * 1e-6) / 1e9
        row["busbw_GBps"] = row["algbw_GBps"] * bus_factor(row["op"], world)
        combined.append(row)
    return combined
