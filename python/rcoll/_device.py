"""Device (GPU) buffers for the numpy-level API and the torch backend.

Two jobs, no algorithm:
  - install the device runtime in the core on first use: rcoll._cuda's
    function table (csrc/device_api.h), handed over as a capsule so that
    rcoll._core never links or loads CUDA itself; RCOLL_DEVICE_RUNTIME names
    another module with the same device_api_capsule() (the tests' host-memory
    emulation, tests/device/emulated_device/);
  - turn an object exposing ``__cuda_array_interface__`` (version 3) into
    (address, element count, dtype code, device, stream), with every check a
    user can fail named by rank and op.

Nothing here imports torch or rcoll._cuda until a device buffer shows up.
"""
from __future__ import annotations

import importlib
import threading

import numpy as np

from . import _core

_lock = threading.Lock()


def ensure_runtime(rank: int, opname: str) -> str:
    """Installs the device runtime in the core if none is; returns its name."""
    with _lock:
        name = _core.device_api_name()
        if name is not None:
            return name
        module = _core.settings()["device_runtime"]
        try:
            runtime = importlib.import_module(module)
        except ImportError as error:
            built_without = ("rcoll was built without its CUDA module (nvcc was not found at build time)"
                             if module == "rcoll._cuda"
                             else "RCOLL_DEVICE_RUNTIME names a module that cannot be imported")
            raise _core.InvalidArgumentError(
                f"rank {rank}: {opname}: the buffer is in GPU memory but the device runtime {module} is not "
                f"available: {built_without}: {error}") from None
        _core.set_device_api(runtime.device_api_capsule())
        return _core.device_api_name()


def _torch_tensor(obj):
    """`obj` if it is a torch tensor (without importing torch), else None."""
    return obj if type(obj).__module__.startswith("torch") and hasattr(obj, "is_cuda") else None


def is_device_buffer(obj) -> bool:
    """True for objects that expose __cuda_array_interface__ (torch CPU tensors do not)."""
    if obj is None or isinstance(obj, np.ndarray):
        return False
    if _torch_tensor(obj) is not None:
        return bool(obj.is_cuda)
    try:
        return getattr(obj, "__cuda_array_interface__", None) is not None
    except Exception:  # noqa: BLE001 - e.g. torch raises for CPU tensors on some versions
        return False


class DeviceBuffer:
    """A checked view of one __cuda_array_interface__ object."""

    __slots__ = ("obj", "address", "size", "shape", "dtype_name", "code", "nbytes", "stream", "readonly")

    def __init__(self, obj, rank: int, opname: str, what: str, writable: bool):
        def invalid(message):
            return _core.InvalidArgumentError(f"rank {rank}: {opname}: {what} {message}")

        tensor = _torch_tensor(obj)
        # torch refuses the interface for tensors that require grad; the data is what matters here.
        cai = (tensor.detach() if tensor is not None else obj).__cuda_array_interface__
        version = cai.get("version", 0)
        if version < 2:
            raise invalid(f"has __cuda_array_interface__ version {version}; rcoll needs version 2 or later")
        if cai.get("mask") is not None:
            raise invalid("is a masked array (__cuda_array_interface__ 'mask'), which rcoll cannot reduce")
        self.obj = obj
        self.shape = tuple(int(n) for n in cai["shape"])
        self.size = int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1
        typestr = cai["typestr"]
        try:
            described = np.dtype(typestr)
        except TypeError:  # ml_dtypes' float8_e5m2 says '<f1', which numpy cannot parse
            described = None
        itemsize = described.itemsize if described is not None else int(typestr[2:])
        # bfloat16 and float8 have no typestr of their own ('<V2', '|V1', '<f1'):
        # the object's dtype names them.
        own = getattr(getattr(obj, "dtype", None), "name", None) or str(getattr(obj, "dtype", "")).rpartition(".")[2]
        name = own if own in _core.DTYPES and (described is None or described.kind == "V") else described.name
        if name not in _core.DTYPES:
            raise invalid(f"has dtype {typestr} ({name}), which is not supported "
                          f"(supported: {', '.join(sorted(_core.DTYPES))})")
        self.dtype_name = name
        self.code = _core.DTYPES[name]
        self.nbytes = self.size * itemsize
        strides = cai.get("strides")
        if strides is not None and self.size > 1:
            expected, step = [], itemsize
            for n in reversed(self.shape):
                expected.append(step)
                step *= n
            if any(s != e for s, e, n in zip(strides, reversed(expected), self.shape) if n > 1):
                raise invalid(f"is not C-contiguous (shape {self.shape}, strides {tuple(strides)}); "
                              f"pass a contiguous copy and copy the result back")
        self.address, self.readonly = int(cai["data"][0]), bool(cai["data"][1])
        if writable and self.readonly:
            raise invalid("is read-only but receives the result; pass a writable buffer or out=")
        # Version 3: the stream the producer wrote the data on (None: nothing to wait for).
        # 1 and 2 are CUDA's legacy and per-thread default streams; the value passes through.
        stream = cai.get("stream")
        if stream is not None and (not isinstance(stream, int) or stream == 0):
            raise invalid(f"names __cuda_array_interface__ stream {stream!r}, which is not a valid stream "
                          f"(0 is disallowed by the protocol)")
        self.stream = stream or 0
        if stream is None and tensor is not None:
            # torch exports version 2 (no stream): its data is ordered on the current stream.
            import torch

            self.stream = torch.cuda.current_stream(tensor.device).cuda_stream


def device_of(buffers, rank: int, opname: str) -> int:
    """The one device that owns every non-empty buffer."""
    devices = set()
    for b in buffers:
        if b is not None and b.size > 0 and b.address != 0:
            try:
                devices.add(_core.device_of_pointer(b.address))
            except _core.RcollError as error:
                raise type(error)(f"rank {rank}: {opname}: cannot tell which GPU holds the buffer: {error}") from None
    if len(devices) > 1:
        raise _core.InvalidArgumentError(
            f"rank {rank}: {opname}: the buffers are on different devices ({sorted(devices)}); pass buffers of "
            f"one device")
    return devices.pop() if devices else 0
