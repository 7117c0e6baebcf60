"""torch tensors as the core takes them: a dtype code, and where the op runs.

Shared by every torch front end (the torch.distributed backend and
rcoll.horovod.torch), so a dtype or device rule is written once.
"""
from __future__ import annotations

import torch

from . import _core, _device

# torch dtype -> core dtype code: the core's names are torch's (float16, ...,
# float8_e4m3fn), so the table is read off the core's, never written twice.
DTYPE_CODES = {getattr(torch, name): code for name, code in _core.DTYPES.items()
               if isinstance(getattr(torch, name, None), torch.dtype)}
# element size -> the code of the unsigned integer type of that width: how a
# dtype the core does not know moves as bytes (check_tensor's moves_only).
_SAME_WIDTH_CODES = {size: _core.DTYPES[f"uint{8 * size}"] for size in (1, 2, 4, 8)}
HOST = (-1, 0)  # (device, stream) of an op on CPU tensors


def check_tensor(t: torch.Tensor, rank: int, opname: str, moves_only: bool = False) -> int:
    """The tensor's core dtype code. `moves_only`: the op moves bytes without
    reducing them (broadcast, gathers, scatter, alltoall, send/recv), so a dtype
    the core has no code for (complex64, float8_e4m3fnuz, ...) travels as the
    unsigned integer type of its width: same address, same element count."""
    if not isinstance(t, torch.Tensor):
        raise _core.InvalidArgumentError(f"rank {rank}: {opname}: expected a tensor, got {type(t).__name__}")
    if t.layout is not torch.strided:
        raise _core.InvalidArgumentError(f"rank {rank}: {opname}: {t.layout} tensors are not supported")
    if not (t.is_cpu or t.is_cuda):
        raise _core.InvalidArgumentError(
            f"rank {rank}: {opname}: {t.device.type} tensors are not supported (CPU and CUDA tensors are)")
    code = DTYPE_CODES.get(t.dtype)
    if code is None and moves_only:
        code = _SAME_WIDTH_CODES.get(t.element_size())
    if code is None:
        supported = ", ".join(str(d).replace("torch.", "") for d in DTYPE_CODES)
        raise _core.InvalidArgumentError(f"rank {rank}: {opname}: dtype {t.dtype} is not supported ({supported})")
    return code


def placement(rank: int, *tensors):
    """Where an op on `tensors` runs: HOST for CPU tensors, else (the CUDA
    device of every tensor of the op, that device's current stream)."""
    for t in tensors:
        if t is not None and t.is_cuda:
            break
    else:
        return HOST  # the CPU path: nothing else to decide
    devices = {t.device for t in tensors if t is not None}
    if len(devices) > 1:
        raise _core.InvalidArgumentError(
            f"rank {rank}: the tensors of one call are on different devices "
            f"({', '.join(sorted(str(d) for d in devices))})")
    device = devices.pop()
    _device.ensure_runtime(rank, "collective on CUDA tensors")
    index = device.index if device.index is not None else torch.cuda.current_device()
    return index, torch.cuda.current_stream(torch.device("cuda", index)).cuda_stream
