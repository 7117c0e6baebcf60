"""hvd.elastic for PyTorch: `run`, `TorchState`, `ElasticSampler`
(docs/horovod.md, "Elastic training")."""
from ...common.elastic import run_fn
from .sampler import ElasticSampler
from .state import TorchState


def run(func):
    """Runs `func(state, ...)` until it returns; when a rank fails, the others
    restore `state`'s last commit, go on as the ranks that are left and call
    `func` again after syncing `state` from the new rank 0; when ranks wait
    to join, every rank's next `state.commit()` takes them in the same way."""
    return run_fn(func)


__all__ = ["ElasticSampler", "TorchState", "run"]
