"""rcoll: fast, safe collective communication for distributed training.

    import rcoll, numpy as np
    comm = rcoll.init()                 # rank/world size from torchrun, srun, mpirun or arguments
    x = np.ones(1 << 20, np.float32)
    comm.allreduce(x)                   # in place, sum over all ranks

With torch: torch.distributed.init_process_group(backend="rcoll"). torch 2.5 and
later load the backend through rcoll's entry point; torch 2.4 needs `import rcoll`
(before or after torch's), which registers it.

Errors are rcoll.RcollError subclasses: TimeoutError, PeerError, MismatchError,
ConfigError, InvalidArgumentError (also a ValueError) and AbortedError.
"""
from . import _core, _torch_entry
from ._core import (  # noqa: F401
    AbortedError,
    ConfigError,
    InvalidArgumentError,
    MismatchError,
    PeerError,
    RcollError,
    TimeoutError,
)

__version__ = "0.1.0"

_torch_entry.register_when_torch_loads()

DTYPES = tuple(_core.DTYPES)          # dtype names the core reduces and moves
REDUCE_OPS = tuple(_core.REDUCE_OPS)  # reduce op names

# The numpy API loads on first use, so that `import rcoll` (which torch's entry
# point triggers while torch itself is importing) stays cheap.
_LAZY = {"Communicator": "communicator", "Handle": "communicator", "init": "communicator",
         "dump_trace": "_trace", "trace": "_trace", "stats": "_stats"}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'rcoll' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"rcoll.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY))
