"""--plot: busbw against size, one panel per op, a line per backend (matplotlib)."""
from __future__ import annotations

import sys

from .ops import OPS


def plot(path, results, backends, world, ceiling):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"--plot {path}: matplotlib is not installed (pip install matplotlib); no plot written",
              file=sys.stderr)
        return
    ops = [op for op in OPS if any(r["op"] == op for b in backends for r in results.get(b, []))]
    fig, axes = plt.subplots(1, len(ops), figsize=(4.5 * len(ops), 4), squeeze=False)
    for ax, op in zip(axes[0], ops):
        for b in backends:
            rows = [r for r in results.get(b, []) if r["op"] == op and "busbw_GBps" in r]
            if rows:
                ax.plot([r["bytes"] for r in rows], [r["busbw_GBps"] for r in rows], marker="o", label=b)
        if ceiling:
            ax.axhline(ceiling["per_direction_GBps"], color="gray", linestyle="--", label="socket ceiling")
        ax.set_xscale("log", base=2)
        ax.set_title(f"{op}, world {world}")
        ax.set_xlabel("size (bytes)")
        ax.set_ylabel("busbw (GB/s)")
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"plot written to {path}", file=sys.stderr)
