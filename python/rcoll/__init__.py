"""rcoll: fast, safe collective communication for distributed training.

    import rcoll, numpy as np
    comm = rcoll.init()                 # rank/world size from torchrun, srun, mpirun or arguments
    x = np.ones(1 << 20, np.float32)
    comm.allreduce(x)                   # in place, sum over all ranks

Errors are rcoll.RcollError subclasses: TimeoutError, PeerError, MismatchError,
ConfigError, InvalidArgumentError (also a ValueError) and AbortedError.
"""
from ._core import (  # noqa: F401
    AbortedError,
    ConfigError,
    InvalidArgumentError,
    MismatchError,
    PeerError,
    RcollError,
    TimeoutError,
)
from .communicator import Communicator, Handle, init  # noqa: F401

__version__ = "0.1.0"

from . import _core

DTYPES = tuple(_core.DTYPES)          # dtype names the core reduces and moves
REDUCE_OPS = tuple(_core.REDUCE_OPS)  # reduce op names
