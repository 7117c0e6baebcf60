"""The nccl-tests style table on stdout: a column group per backend, busbw ratios
between backends, peak busbw per op against the socket ceiling, errors and wrong
results."""
from __future__ import annotations

import os

from .ops import OPS


def ratio_pairs(backends):
    """(a, b) for each busbw-ratio column: rcoll against every other backend (else the first against the rest)."""
    first = "rcoll" if "rcoll" in backends else (backends[0] if backends else None)
    pairs = [(first, b) for b in backends if b != first]
    if first != "torch-rcoll" and "torch-rcoll" in backends and "gloo" in backends:
        pairs.append(("torch-rcoll", "gloo"))  # the torch backend against torch's own, same API
    return pairs


def fmt_table(results, backends, world, args, ceiling):
    lines = []
    lines.append(f"# python -m rcoll bench  world {world}  dtype {args.dtype}  "
                 f"{'async' if args.async_ops else 'blocking'} ops  "
                 f"iters {'adaptive' if not args.iters else args.iters}  cpus {os.cpu_count()}"
                 + ("  (OVERSUBSCRIBED: more ranks than cores)" if world > (os.cpu_count() or 1) else ""))
    if ceiling:
        lines.append(f"# socket ceiling (TCP 127.0.0.1, 2 processes): both directions at once "
                     f"{ceiling['per_direction_GBps']:.2f} GB/s per direction "
                     f"({ceiling['both_directions_GBps']:.2f} GB/s total); one direction only "
                     f"{ceiling['one_direction_GBps']:.2f} GB/s")
    repeats = getattr(args, "repeats", 1)
    lines.append("# time = slowest rank's mean time per op"
                 + (f", median of {repeats} runs (backends taking turns)" if repeats > 1 else "")
                 + "; busbw factor: allreduce 2(n-1)/n, allgather/reduce_scatter (n-1)/n, broadcast 1")
    head = f"{'size(B)':>10} {'count':>10} {'type':>8} {'op':>14}"
    sub = " " * len(head)
    for b in backends:
        cols = f" |{'time(us)':>10} {'algbw':>7} {'busbw':>7} {'#wrong':>6}"
        head += cols
        sub += f" |{b:^33}"
    pairs = ratio_pairs(backends)
    for a, c in pairs:
        w = max(11, len(a) + 1 + len(c))
        head += f" | {a + '/' + c:>{w}}"
        sub += f" | {'busbw ratio':>{w}}"
    lines.append(sub.rstrip())
    lines.append(head + "   (algbw, busbw in GB/s)")
    index = {b: {(r["op"], r["bytes"]): r for r in results.get(b, [])} for b in backends}
    keys = []
    for b in backends:
        for r in results.get(b, []):
            if (r["op"], r["bytes"]) not in keys:
                keys.append((r["op"], r["bytes"]))
    keys.sort(key=lambda k: (list(OPS).index(k[0]) if k[0] in OPS else 99, k[1]))
    for op, nbytes in keys:
        some = next(index[b][(op, nbytes)] for b in backends if (op, nbytes) in index[b])
        line = f"{nbytes:>10} {some['count']:>10} {some['dtype']:>8} {op:>14}"
        for b in backends:
            r = index[b].get((op, nbytes))
            if r is None:
                line += f" |{'-':>10} {'-':>7} {'-':>7} {'-':>6}"
            elif "error" in r:
                line += f" |{'error':>10} {'-':>7} {'-':>7} {'-':>6}"
            else:
                line += (f" |{r['time_us']:>10.1f} {r['algbw_GBps']:>7.3f} {r['busbw_GBps']:>7.3f} "
                         f"{r['wrong']:>6}")
        for an, cn in pairs:
            w = max(11, len(an) + 1 + len(cn))
            a, c = index[an].get((op, nbytes)), index[cn].get((op, nbytes))
            if a and c and "busbw_GBps" in a and "busbw_GBps" in c and c["busbw_GBps"] > 0:
                line += f" | {a['busbw_GBps'] / c['busbw_GBps']:>{w - 1}.2f}x"
            else:
                line += f" | {'-':>{w}}"
        lines.append(line)
    # peak busbw per op and backend, as a fraction of the socket ceiling
    lines.append("# peak busbw per op (GB/s)"
                 + (" and (% of the socket ceiling both ways at once per direction / % of one way)" if ceiling else ""))
    for op in OPS:
        parts = []
        for b in backends:
            vals = [r["busbw_GBps"] for r in results.get(b, []) if r["op"] == op and "busbw_GBps" in r]
            if vals:
                txt = f"{b} {max(vals):.3f}"
                if ceiling:
                    txt += (f" ({100 * max(vals) / ceiling['per_direction_GBps']:.0f}% / "
                            f"{100 * max(vals) / ceiling['one_direction_GBps']:.0f}%)")
                parts.append(txt)
        if parts:
            lines.append(f"#   {op:<14} " + ", ".join(parts))
    for b in backends:
        for r in results.get(b, []):
            if "error" in r:
                lines.append(f"# {b} {r['op']} {r['bytes']} B: {r['error']}")
        wrong = sum(r.get("wrong", 0) for r in results.get(b, []))
        if wrong:
            lines.append(f"# WARNING: {b} returned {wrong} wrong elements in total")
    return "\n".join(lines)
