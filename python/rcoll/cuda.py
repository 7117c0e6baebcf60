"""rcoll's CUDA reduction kernels on torch CUDA tensors.

    import rcoll.cuda
    ok, why = rcoll.cuda.available()       # (False, "no CUDA driver ...") on a CPU machine
    rcoll.cuda.reduce(out, a, b, "max")    # out = max(a, b) elementwise, on the current stream
    rcoll.cuda.scale_divide(out, world)    # avg = reduce(..., "sum"/"avg") then divide once

Nothing here is imported by `import rcoll`, and this module imports neither
torch nor the compiled rcoll._cuda until a function needs them, so CPU-only
installs never load the CUDA runtime. Semantics are those of the CPU kernels
(see the README): integers wrap, float16/bfloat16 are computed in float32 and
rounded once, min/max propagate NaN, bool sum/max are "or" and prod/min "and".
"""
from __future__ import annotations

import operator

_module = None


def _cuda():
    """The compiled module, imported on first use (ImportError if not built)."""
    global _module
    if _module is None:
        from . import _cuda as module

        _module = module
    return _module


def _invalid(message: str) -> Exception:
    from ._core import InvalidArgumentError

    return InvalidArgumentError(message)


def _can_run(capability, built) -> bool:
    """Whether a GPU of `capability` runs code built for `built` archs: machine
    code for the same major version and an equal or lower minor, or PTX for an
    equal or lower version (the driver JIT-compiles it)."""
    major, minor = capability
    for arch in built:
        kind, _, number = arch.partition("_")
        if kind not in ("sm", "compute"):
            return True  # "native", "all"...: cannot tell, let the launch say
        digits = number.rstrip("abcdefghijklmnopqrstuvwxyz")
        if not digits.isdigit() or len(digits) < 2:
            continue
        arch_major, arch_minor = int(digits[:-1]), int(digits[-1])
        if number != digits:  # sm_90a and the like run on exactly that GPU only
            if (arch_major, arch_minor) == (major, minor):
                return True
        elif kind == "sm" and arch_major == major and arch_minor <= minor:
            return True
        elif kind == "compute" and (arch_major, arch_minor) <= (major, minor):
            return True
    return False


def available() -> tuple:
    """(True, description) when the kernels can run here, else (False, reason).

    Never raises and never creates a CUDA context (no device memory is used).
    """
    try:
        module = _cuda()
    except ImportError as error:
        return False, (f"rcoll was built without its CUDA module (nvcc was not found at build time, "
                       f"or RCOLL_BUILD_CUDA=OFF): {error}")
    count, reason = module.probe()
    if count == 0:
        return False, reason or "no CUDA device is visible"
    built = module.built_archs()
    try:
        capability = module.device_capability(0)
    except RuntimeError as error:
        return False, str(error)
    if not _can_run(capability, built):
        return False, (f"GPU 0 has compute capability {capability[0]}.{capability[1]} but rcoll._cuda "
                       f"was built for {', '.join(built)}; rebuild with RCOLL_CUDA_ARCHS")
    return True, f"{count} CUDA device(s); kernels built for {', '.join(built)}"


def _dtype_code(tensor) -> int:
    from ._ops import DTYPES

    name = str(tensor.dtype).rpartition(".")[2]  # torch.float16 -> "float16"
    code = DTYPES.get(name)
    if code is None:
        raise _invalid(f"rcoll.cuda: dtype {tensor.dtype} is not supported (supported: {', '.join(DTYPES)})")
    return code


def _op_code(op) -> int:
    from ._ops import reduce_op_code

    return reduce_op_code(op, "rcoll.cuda", codes=True)  # names, codes, torch.distributed.ReduceOp-like enums


def _check_tensor(tensor, what: str, device=None) -> None:
    import torch

    if not isinstance(tensor, torch.Tensor):
        raise _invalid(f"rcoll.cuda: {what} must be a torch.Tensor, got {type(tensor).__name__}")
    if not tensor.is_cuda:
        raise _invalid(f"rcoll.cuda: {what} is on {tensor.device}, not on a CUDA device")
    if device is not None and tensor.device != device:
        raise _invalid(f"rcoll.cuda: {what} is on {tensor.device} but the output is on {device}")
    if not tensor.is_contiguous():
        raise _invalid(f"rcoll.cuda: {what} is not contiguous (shape {tuple(tensor.shape)}, "
                       f"strides {tensor.stride()}); pass tensor.contiguous()")


def _run(function, *args) -> None:
    try:
        function(*args)
    except ValueError as error:
        raise _invalid(str(error)) from None


def _on_device(device, function, *args) -> None:
    """Launches on `device`'s current stream. A launch goes to the thread's
    current device, which must own the stream: switch only when it is another
    (the context manager costs microseconds a call, as much as a short kernel)."""
    import torch

    if torch.cuda.current_device() == device.index:
        _run(function, *args, torch.cuda.current_stream(device).cuda_stream)
        return
    with torch.cuda.device(device):
        _run(function, *args, torch.cuda.current_stream(device).cuda_stream)


def reduce(dst, a, b, op="sum"):
    """dst = a (op) b elementwise, enqueued on dst's device's current stream.

    dst may be a or b itself (in place). All three must be contiguous CUDA
    tensors of one device, dtype and element count. "avg" reduces like "sum";
    divide once at the end with scale_divide(). Returns dst. Like any torch op,
    it is asynchronous: the caching allocator keeps the memory valid because
    the kernel runs on the current stream.
    """
    _check_tensor(dst, "dst")
    _check_tensor(a, "a", dst.device)
    _check_tensor(b, "b", dst.device)
    if a.dtype != dst.dtype or b.dtype != dst.dtype:
        raise _invalid(f"rcoll.cuda: dtypes differ (dst {dst.dtype}, a {a.dtype}, b {b.dtype})")
    if a.numel() != dst.numel() or b.numel() != dst.numel():
        raise _invalid(f"rcoll.cuda: element counts differ (dst {dst.numel()}, a {a.numel()}, b {b.numel()})")
    dtype, code = _dtype_code(dst), _op_code(op)
    _on_device(dst.device, _cuda().reduce, dst.data_ptr(), a.data_ptr(), b.data_ptr(), dst.numel(), dtype, code)
    return dst


def scale_divide(buf, divisor: int):
    """buf /= divisor in place (true division; float16/bfloat16 via float32,
    rounded once), the last step of avg. Floating-point tensors only. Returns buf."""
    _check_tensor(buf, "buf")
    try:
        count = operator.index(divisor)  # ints and numpy integers, not floats
    except TypeError:
        count = 0
    if isinstance(divisor, bool) or count <= 0:
        raise _invalid(f"rcoll.cuda: divisor must be a positive integer, got {divisor!r}")
    dtype = _dtype_code(buf)
    _on_device(buf.device, _cuda().scale_divide, buf.data_ptr(), buf.numel(), dtype, count)
    return buf
