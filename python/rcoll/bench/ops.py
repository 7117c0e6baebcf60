"""What the sweep measures: the ops, the dtypes, how a size becomes each rank's
buffers, and the factor from algorithm bandwidth to bus bandwidth.

Sizes follow nccl-tests: "size" is the per-rank buffer for allreduce and broadcast,
the gathered (output) size for allgather and the input size for reduce_scatter.
busbw = algbw * factor with factor 2(n-1)/n for allreduce, (n-1)/n for allgather
and reduce_scatter, 1 for broadcast.
"""
from __future__ import annotations

OPS = ("allreduce", "allgather", "broadcast", "reduce_scatter")
DTYPES = {  # name -> element size
    "float32": 4, "float64": 8, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8,
}


def bus_factor(op: str, world: int) -> float:
    if op == "allreduce":
        return 2.0 * (world - 1) / world
    if op in ("allgather", "reduce_scatter"):
        return (world - 1) / world
    return 1.0


def parse_size(text: str) -> int:
    """'4K' -> 4096, '64M' -> 67108864, '1G', or plain bytes (1024-based, like nccl-tests)."""
    t = text.strip().upper().rstrip("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(t[-1:], 1)
    if mult != 1:
        t = t[:-1]
    return int(float(t) * mult)


def layout(op: str, size: int, world: int, esize: int):
    """(size actually used in bytes, elements per rank input, elements of output)."""
    if op in ("allgather", "reduce_scatter"):
        per = size // (world * esize)
        size = per * world * esize
        return size, (per if op == "allgather" else per * world), (per * world if op == "allgather" else per)
    n = size // esize
    return n * esize, n, n
