"""The torch.distributed backends of the sweep, inside one rank: Gloo, and
rcoll's torch backend through the same calls (what its users see)."""
from __future__ import annotations

import datetime

from .check import pattern


class GlooRank:
    """torch.distributed on CPU tensors: Gloo, or rcoll's torch backend (TorchRcollRank)."""
    name = "gloo"

    def __init__(self, timeout):
        import torch
        import torch.distributed as dist
        self.torch, self.dist = torch, dist
        if self.name == "torch-rcoll":
            import rcoll.torch_backend  # noqa: F401 - registers the backend (the entry point does it too)
        dist.init_process_group(self.name.replace("torch-", ""), init_method="env://",
                                timeout=datetime.timedelta(seconds=timeout))
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        # the non-deprecated names in recent torch, the older ones otherwise
        self._ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

    def setup(self, op, dtype, n_in, n_out):
        torch, dist = self.torch, self.dist
        tdt = getattr(torch, dtype)
        src = torch.empty(n_in, dtype=tdt)
        dst = src if op in ("allreduce", "broadcast") else torch.empty(n_out, dtype=tdt)
        if op == "allreduce":
            call = lambda a: dist.all_reduce(src, dist.ReduceOp.SUM, async_op=a)  # noqa: E731
        elif op == "broadcast":
            call = lambda a: dist.broadcast(src, 0, async_op=a)  # noqa: E731
        elif op == "allgather":
            call = lambda a: self._ag(dst, src, async_op=a)  # noqa: E731
        else:
            call = lambda a: self._rs(dst, src, dist.ReduceOp.SUM, async_op=a)  # noqa: E731

        def fill():
            src.copy_(torch.from_numpy(pattern(self.rank, n_in)).to(tdt))
            if dst is not src:
                dst.zero_()
        return call, fill, lambda: dst.to(torch.float64).numpy()

    def run(self, call, iters, use_async):
        if use_async:
            works = [call(True) for _ in range(iters)]
            for w in works:
                w.wait()
        else:
            for _ in range(iters):
                call(False)

    def barrier(self):
        self.dist.barrier()

    def close(self):
        self.dist.destroy_process_group()


class TorchRcollRank(GlooRank):
    """The same torch.distributed calls with backend="rcoll": what users of the torch backend see."""
    name = "torch-rcoll"
