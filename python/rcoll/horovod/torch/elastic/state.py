"""TorchState: a model, an optimizer, an ElasticSampler and plain objects,
committed to host memory, restored after a failure and synced from rank 0."""
from __future__ import annotations

import copy

import torch

from ...common.basics import rank
from ...common.elastic import ObjectState
from ..functions import broadcast_object, broadcast_optimizer_state, broadcast_parameters
from .sampler import ElasticSampler


class _Handler:
    """How one kind of object is saved, restored and synced."""

    def __init__(self, value):
        self.value = value
        self.save()

    def set_value(self, value):
        self.value = value
        self.save()

    def save(self):
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self):
        self.value.load_state_dict(self._saved)


class _Model(_Handler):
    def sync(self):
        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _Optimizer(_Handler):
    def sync(self):
        broadcast_optimizer_state(self.value, root_rank=0)


class _Sampler(_Handler):
    def sync(self):
        self.value.load_state_dict(broadcast_object(self.value.state_dict()))


_HANDLERS = [(torch.nn.Module, _Model), (torch.optim.Optimizer, _Optimizer), (ElasticSampler, _Sampler)]


class TorchState(ObjectState):
    """The state of a PyTorch training function for hvd.elastic.run: `model`,
    `optimizer` and any keyword arguments become attributes; modules,
    optimizers and ElasticSamplers are saved by their state_dict(), other
    values as they are (broadcast from rank 0 by sync())."""

    def __init__(self, model=None, optimizer=None, **kwargs):
        kwargs.update(model=model, optimizer=optimizer)
        handlers, plain = {}, {}
        for name, value in kwargs.items():
            handler = next((h(value) for kind, h in _HANDLERS if isinstance(value, kind)), None)
            if handler is None:
                plain[name] = value
            else:
                handlers[name] = handler
        object.__setattr__(self, "_handlers", handlers)
        for name, handler in handlers.items():
            object.__setattr__(self, name, handler.value)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **plain)

    def save(self):
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self):
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self):
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def __setattr__(self, name, value):
        handlers = self.__dict__.get("_handlers", {})
        if name in handlers:
            handlers[name].set_value(value)
        super().__setattr__(name, value)
