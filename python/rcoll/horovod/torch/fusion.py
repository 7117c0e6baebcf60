"""Tensor fusion for DistributedOptimizer: gradients reduced as buckets, each
one allreduce over a flat copy, as Horovod's fusion buffer does.

Horovod fuses whatever gradients its ranks agree are ready within one cycle,
after a negotiation round. rcoll runs ops in the order they are issued, so the
buckets are fixed up front, the same on every rank: the parameters in reverse
order (the order backward usually produces their gradients), grouped by dtype
and device, each bucket up to HOROVOD_FUSION_THRESHOLD bytes (0: one tensor
per op), or the caller's groups. A bucket is issued once all of its gradients
are ready and every bucket before it has been issued, so the ranks' ops line
up while communication still overlaps the rest of backward.
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional

import torch

# Horovod's default fusion threshold (HOROVOD_FUSION_THRESHOLD, bytes).
DEFAULT_FUSION_THRESHOLD = 64 * 1024 * 1024


def fusion_threshold() -> int:
    value = os.environ.get("HOROVOD_FUSION_THRESHOLD")
    if value in (None, ""):
        return DEFAULT_FUSION_THRESHOLD
    try:
        threshold = int(value)
    except ValueError:
        raise ValueError(f"HOROVOD_FUSION_THRESHOLD={value!r} is not a number of bytes") from None
    if threshold < 0:
        raise ValueError(f"HOROVOD_FUSION_THRESHOLD={value!r} is negative")
    return threshold


def plan_buckets(params: List[torch.Tensor], threshold: int,
                 groups: Optional[List[List[torch.Tensor]]] = None) -> List[List[torch.Tensor]]:
    """The buckets, in issue order. `params` in registration order; with
    `groups`, each group is one bucket and every other parameter its own."""
    if groups is not None:
        grouped = {id(p) for g in groups for p in g}
        by_id = {id(p) for p in params}
        buckets = [[p for p in g if id(p) in by_id] for g in groups]
        buckets = [b for b in buckets if b]
        buckets += [[p] for p in params if id(p) not in grouped]
        return buckets
    buckets: List[List[torch.Tensor]] = []
    open_buckets: Dict[tuple, List[torch.Tensor]] = {}
    sizes: Dict[tuple, int] = {}
    for p in reversed(params):
        key = (p.dtype, p.device)
        nbytes = p.numel() * p.element_size()
        bucket = open_buckets.get(key)
        if bucket is None or threshold == 0 or sizes[key] + nbytes > threshold:
            bucket = []
            buckets.append(bucket)
            open_buckets[key], sizes[key] = bucket, 0
        bucket.append(p)
        sizes[key] += nbytes
    return buckets


def split_groups(params: List[torch.Tensor], num_groups: int) -> List[List[torch.Tensor]]:
    """`params` cut into `num_groups` runs of (nearly) equal length, as Horovod's num_groups."""
    base, extra = divmod(len(params), num_groups)
    out, start = [], 0
    for g in range(num_groups):
        n = base + (1 if g < extra else 0)
        if n:
            out.append(params[start:start + n])
        start += n
    return out
