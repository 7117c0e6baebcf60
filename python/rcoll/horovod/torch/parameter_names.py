"""The names DistributedOptimizer gives its parameters' ops, checked as Horovod checks them."""
from __future__ import annotations


def checked_named_parameters(param_groups, named_parameters, default_name):
    """`named_parameters` as a list of (name, parameter), or every parameter of
    `param_groups` named `default_name(group index, index in group)` when it
    is None. ValueError, in Horovod's words, for entries that are not pairs,
    repeated names, or parameters left unnamed."""
    all_params = [p for group in param_groups for p in group["params"]]
    if named_parameters is not None:
        named_parameters = list(named_parameters)
    else:
        named_parameters = [(default_name(i, j), v) for i, group in enumerate(param_groups)
                            for j, v in enumerate(group["params"])]
    if any(not isinstance(p, tuple) for p in named_parameters):
        raise ValueError("named_parameters should be a sequence of tuples (name, parameter), usually produced "
                         "by model.named_parameters().")
    names = [k for k, _ in named_parameters]
    dups = sorted({k for k in names if names.count(k) > 1})
    if dups:
        raise ValueError(f"Parameter names in named_parameters must be unique. Found duplicates: {', '.join(dups)}")
    named_ids = {id(v) for _, v in named_parameters}
    unnamed = [id(p) for p in all_params if id(p) not in named_ids]
    if unnamed:
        raise ValueError("named_parameters was specified, but one or more model parameters were not named. "
                         f"Python object ids: {', '.join(str(i) for i in unnamed)}")
    return named_parameters
