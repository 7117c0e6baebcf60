"""Horovod's helpers over the collectives: parameters, optimizer state and
Python objects from one rank to all."""
from __future__ import annotations

import collections
import io

import torch

from ..common import basics as _basics
from ..common.process_sets import global_process_set
from .mpi_ops import allgather, broadcast_, broadcast_async_, synchronize

try:  # lambdas and local classes too, as Horovod does
    import cloudpickle as _pickle
except ImportError:  # pragma: no cover - cloudpickle ships with most training stacks
    import pickle as _pickle


def broadcast_parameters(params, root_rank):
    """Copies root_rank's parameters into every rank's, in place: `params` is a
    dict (a state_dict, broadcast in key order) or a list of tensors or of
    (name, tensor) pairs (named_parameters())."""
    if isinstance(params, dict):
        items = sorted(params.items())
    elif isinstance(params, (list, tuple)) or isinstance(params, collections.abc.Iterator):
        items = [p if isinstance(p, tuple) else (None, p) for p in params]
    else:
        raise ValueError(f"invalid params of type: {type(params)}")
    handles = []
    for _, p in items:
        if not torch.is_tensor(p):
            raise ValueError(f"broadcast_parameters: expected tensors, got {type(p).__name__}")
        tensor = p.data if isinstance(p, torch.nn.Parameter) else p
        handles.append(broadcast_async_(tensor, root_rank))
    for handle in handles:
        synchronize(handle)


def _dummy_step(optimizer, model):
    """An optimizer that has not stepped has no state yet: step once on zero
    gradients (sparse where the model's embeddings are) so that every rank has
    the state tensors the root broadcasts. The gradients stay zero, as in
    Horovod (after a reset in hvd.elastic they were a failed step's); the
    parameters are put back as they were (a zero-gradient step still moves
    them under weight decay)."""
    from . import optimizer as _optimizer

    sparse = {id(p) for m in (model.modules() if model is not None else ())
              if isinstance(m, torch.nn.Embedding) and m.sparse for p in m.parameters()}
    kept = []
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad:
                kept.append((p, p.data.clone()))
                p.grad = torch.zeros_like(p.data)
                if isinstance(optimizer, torch.optim.SparseAdam) or id(p) in sparse:
                    p.grad = p.grad.to_sparse()
    try:
        if type(optimizer).__module__ == _optimizer.__name__:
            super(optimizer.__class__, optimizer).step()  # the wrapped optimizer's step, no allreduce
        else:
            optimizer.step()
    finally:
        for p, data in kept:
            p.data.copy_(data)


def broadcast_optimizer_state(optimizer, root_rank, model=None):
    """Copies root_rank's optimizer state (state tensors, and every scalar
    option and state entry) into every rank's optimizer."""
    if isinstance(optimizer, torch.optim.LBFGS):
        raise ValueError("cannot broadcast torch.optim.LBFGS state")
    state_dict = optimizer.state_dict()
    if not state_dict["state"]:
        _dummy_step(optimizer, model)
        state_dict = optimizer.state_dict()
    if not state_dict["state"]:
        return
    tensors, scalars, setters = [], {}, {}
    seen = collections.defaultdict(int)
    for index, group in enumerate(state_dict["param_groups"]):
        for option, value in group.items():
            if option != "params":
                key = f"{option}.{index}"
                scalars[key] = value
                setters[key] = (lambda i, o: lambda v: optimizer.param_groups[i].__setitem__(o, v))(index, option)
        for pid in group["params"]:
            for name, value in state_dict["state"].get(pid, {}).items():
                seen[name] += 1
                key = f"{name}.{seen[name]}"
                if torch.is_tensor(value):
                    tensors.append((key, value))
                else:
                    scalars[key] = value
                    setters[key] = (lambda p, n: lambda v: state_dict["state"][p].__setitem__(n, v))(pid, name)
    # The state dict's tensors are the optimizer's own: broadcasting into them updates it.
    broadcast_parameters(tensors, root_rank)
    for key, value in broadcast_object(scalars, root_rank).items():
        setters[key](value)


def _to_bytes(obj) -> torch.Tensor:
    buffer = io.BytesIO()
    _pickle.dump(obj, buffer)
    return torch.frombuffer(bytearray(buffer.getvalue()), dtype=torch.uint8)


def _from_bytes(t: torch.Tensor):
    return _pickle.loads(t.numpy().tobytes())


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """root_rank's `obj` (anything cloudpickle can serialize) on every rank of the set."""
    # Named as Horovod names them, so that ranks match them by name.
    name = name if name is not None else type(obj).__name__
    root = _basics.rank() == root_rank
    payload = _to_bytes(obj) if root else None
    size = torch.tensor([payload.numel() if root else 0], dtype=torch.int64)
    broadcast_(size, root_rank, name=f"{name}.sz", process_set=process_set)
    if not root:
        payload = torch.empty(int(size[0]), dtype=torch.uint8)
    broadcast_(payload, root_rank, name=f"{name}.t", process_set=process_set)
    return obj if root else _from_bytes(payload)


def allgather_object(obj, name=None, process_set=global_process_set):
    """Every rank's `obj`, as a list in rank order."""
    name = name if name is not None else type(obj).__name__
    payload = _to_bytes(obj)
    sizes = allgather(torch.tensor([payload.numel()], dtype=torch.int64), name=f"{name}.sz",
                      process_set=process_set).tolist()
    gathered = allgather(payload, name=f"{name}.t", process_set=process_set)
    out, start = [], 0
    for n in sizes:
        out.append(_from_bytes(gathered[start:start + n]))
        start += n
    return out
