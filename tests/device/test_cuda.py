"""The CUDA reduction kernels (csrc/cuda, rcoll._cuda, rcoll.cuda).

Three groups:
  - everywhere: `import rcoll` never loads the CUDA module; the module is built
    and imports when nvcc is there, and reports "no GPU" without raising;
    argument errors are caught before any CUDA call; the C header is plain C.
  - with nvcc, no GPU needed: the kernels' loops and dtype x op table run on the
    CPU thread by thread and match the CPU kernels bit for bit
    (csrc/cuda/host_check/kernels_on_host.cu).
  - with a GPU (and a CUDA build of torch): every dtype x op x size x alignment
    against torch/numpy references, avg's division, streams, devices, errors.
    These skip, naming the reason, where no GPU is usable.
"""
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest
from support.common import skip_without_torch_gpu
from support.paths import ROOT

CSRC = os.path.join(ROOT, "csrc")

DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "uint8", "int32", "int64", "bool"]
FLOATS = ("float16", "bfloat16", "float32", "float64")
OPS = ["sum", "prod", "min", "max", "avg", "band", "bor", "bxor"]
SIZES = [0, 1, 7, 15, 16, 17, 33, 1000003]
# Element offsets of (dst, a, b) into their allocations; "a"/"b": dst is that input.
LAYOUTS = {
    "aligned": (0, 0, 0),            # 16-byte packs from the first element
    "same_offset": (1, 1, 1),        # scalar head, then packs
    "mixed_offsets": (0, 1, 2),      # no common alignment: scalar throughout
    "in_place": ("a", 3, 3),         # dst is a
    "dst_is_b": ("b", 0, 0),
}


def supported(dtype, op):
    if op in ("band", "bor", "bxor"):
        return dtype not in FLOATS
    if op == "avg":
        return dtype in FLOATS
    return True


def nvcc():
    return shutil.which("nvcc")


def cuda_build_disabled():
    """True when the build was told not to build the CUDA module."""
    for var in ("CMAKE_ARGS", "SKBUILD_CMAKE_ARGS", "SKBUILD_CMAKE_DEFINE"):
        text = os.environ.get(var, "").upper().replace(" ", "")
        if any(f"RCOLL_BUILD_CUDA={v}" in text for v in ("OFF", "0", "FALSE", "NO")):
            return True
    return False


def cuda_module():
    """rcoll._cuda, or a skip (or failure, when nvcc is here) if it was not built."""
    if importlib.util.find_spec("rcoll._cuda") is None:
        if nvcc() and not cuda_build_disabled():
            pytest.fail("nvcc is on PATH but rcoll._cuda was not built: rebuild rcoll (pip install .)")
        pytest.skip("rcoll was built without its CUDA module (no nvcc)")
    import rcoll._cuda

    return rcoll._cuda


# ---------------------------------------------------------------- everywhere


def test_import_rcoll_does_not_load_the_cuda_module():
    code = (
        "import sys, rcoll\n"
        "assert 'rcoll._cuda' not in sys.modules and 'rcoll.cuda' not in sys.modules, sorted(sys.modules)\n"
        "import rcoll.cuda\n"
        "assert 'rcoll._cuda' not in sys.modules, 'rcoll.cuda loaded rcoll._cuda at import'\n"
        "assert 'torch' not in sys.modules, 'rcoll.cuda imported torch at import'\n"
        "try:\n"
        "    import torch  # its entry point imports rcoll for the backend\n"
        "except ImportError:\n"
        "    pass\n"
        "assert 'rcoll._cuda' not in sys.modules, 'import torch loaded rcoll._cuda'\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-4000:]


def test_cuda_module_is_built_and_imports_without_a_gpu():
    if not nvcc():
        pytest.skip("nvcc is not on PATH, so the CUDA module is optional here")
    module = cuda_module()  # fails if nvcc is here but the module is missing
    count = module.device_count()
    assert isinstance(count, int) and count >= 0
    probed, reason = module.probe()
    assert probed == count
    if count == 0:
        assert reason, "probe() must say why no device is usable"
    if not os.path.exists("/dev/nvidiactl"):  # no NVIDIA driver loaded on this machine
        assert count == 0, reason
    runtime, driver = module.versions()
    assert runtime >= 11000 and driver >= 0
    # The runtime is linked statically: the module must not need libcudart.so.
    readelf = shutil.which("readelf")
    if readelf:
        dynamic = subprocess.run([readelf, "-d", module.__file__], capture_output=True, text=True).stdout
        assert "libcudart" not in dynamic, dynamic


def test_available_never_raises_and_explains():
    import rcoll.cuda

    ok, reason = rcoll.cuda.available()
    assert isinstance(ok, bool) and isinstance(reason, str) and reason
    if importlib.util.find_spec("rcoll._cuda") is not None:
        import rcoll._cuda

        if rcoll._cuda.device_count() == 0:
            assert not ok and reason == rcoll._cuda.probe()[1]


def test_built_archs():
    module = cuda_module()
    archs = module.built_archs()
    assert archs, "built_archs() is empty"
    named = [a for a in archs if a.startswith(("sm_", "compute_"))]
    if len(named) == len(archs):  # a numeric arch list (not "native" or "all")
        assert any(a.startswith("sm_") for a in archs), archs
        assert any(a.startswith("compute_") for a in archs), f"no PTX for newer GPUs: {archs}"


def test_arch_compatibility_rule():
    from rcoll.cuda import _can_run

    built = ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "compute_90"]
    assert _can_run((8, 0), built) and _can_run((8, 7), built) and _can_run((9, 0), built)
    assert _can_run((10, 0), built) and _can_run((12, 0), built)  # through the PTX
    assert not _can_run((7, 0), built)
    assert not _can_run((8, 0), ["sm_86"]) and _can_run((8, 9), ["sm_86"])
    assert _can_run((9, 0), ["sm_90a"]) and not _can_run((10, 0), ["sm_90a"])
    assert _can_run((9, 0), ["native"])


def test_argument_errors_are_caught_before_any_cuda_call():
    """Refused before touching CUDA, so the same with or without a GPU: a
    misaligned or overlapping pointer would otherwise fault on the device."""
    from rcoll import _core

    module = cuda_module()
    for dtype in DTYPES:
        for op in OPS:
            d, o = module.DTYPES[dtype], module.REDUCE_OPS[op]
            reason = _core.reduce_unsupported_reason(d, o)
            assert (reason == "") == supported(dtype, op)
            if reason:
                with pytest.raises(ValueError) as info:
                    module.reduce(0, 0, 0, 0, d, o)
                assert str(info.value) == reason
            else:
                module.reduce(0, 0, 0, 0, d, o)  # count 0: nothing to do, no CUDA call
    f32, i32, total = module.DTYPES["float32"], module.DTYPES["int32"], module.REDUCE_OPS["sum"]
    cases = [
        ((0, 0, 0, 0, 99, total), "unknown dtype code 99"),
        ((0, 0, 0, 0, f32, 99), "unknown reduce op code 99"),
        ((0, 4096, 8192, 4, f32, total), "dst is null"),
        ((4098, 8192, 12288, 4, f32, total), "dst is not aligned to its 4-byte elements"),
        ((4096, 8194, 12288, 4, f32, total), "a is not aligned"),
        ((4096, 4100, 12288, 4, f32, total), "overlaps an input partially"),
        ((4096, 8192, 4092, 4, f32, total), "overlaps an input partially"),
        ((4096, 8192, 12288, 2**62, f32, total), "count is too large"),
    ]
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            module.reduce(*args)
    with pytest.raises(ValueError, match="needs a floating-point dtype, got int32"):
        module.scale_divide(4096, 4, i32, 2)
    with pytest.raises(ValueError, match="divisor is 0"):
        module.scale_divide(4096, 4, f32, 0)
    with pytest.raises(ValueError, match="not aligned"):
        module.scale_divide(4097, 4, f32, 2)


def test_without_a_gpu_launches_fail_cleanly():
    module = cuda_module()
    if module.device_count() > 0:
        pytest.skip("a GPU is present (these fake addresses would be launched on it)")
    reason = module.probe()[1]
    f32, total = module.DTYPES["float32"], module.REDUCE_OPS["sum"]
    with pytest.raises(RuntimeError) as info:
        module.reduce(4096, 8192, 12288, 4, f32, total)
    assert reason.split(": ", 1)[1] in str(info.value)
    with pytest.raises(RuntimeError):
        module.scale_divide(4096, 4, f32, 2)
    with pytest.raises(RuntimeError):
        module.device_capability(0)


def test_core_does_not_link_cuda():
    """The device data path reaches CUDA only through rcoll._cuda's table (csrc/device_api.h)."""
    import rcoll._core

    readelf = shutil.which("readelf")
    if readelf is None:
        pytest.skip("readelf is not installed")
    dynamic = subprocess.run([readelf, "-d", rcoll._core.__file__], capture_output=True, text=True).stdout
    assert "NEEDED" in dynamic, dynamic
    assert "libcuda" not in dynamic, dynamic


def test_device_api_table_without_a_gpu_fails_device_ops_cleanly(emulated_device_runtime):
    """rcoll._cuda's table installs in the core; without a GPU a collective on a
    (fake) GPU buffer fails before any transfer, naming the rank, op and reason."""
    module = cuda_module()
    if module.device_count() > 0:
        pytest.skip("a GPU is present (tests/device/test_cuda_collectives.py covers it)")
    code = (
        "import rcoll, rcoll._core as core, rcoll._cuda as cu\n"
        "core.set_device_api(cu.device_api_capsule())\n"
        "assert core.device_api_name() == 'cuda', core.device_api_name()\n"
        "try:\n"
        "    import rcoll_emulated_device as emulated\n"
        "    core.set_device_api(emulated.device_api_capsule())\n"
        "    raise SystemExit('a second device runtime was accepted')\n"
        "except rcoll.ConfigError as e:\n"
        "    assert 'already installed' in str(e), e\n"
        "class Fake:\n"
        "    __cuda_array_interface__ = {'version': 3, 'shape': (4,), 'typestr': '<f4', 'data': (4096, False),\n"
        "                                'strides': None, 'stream': None}\n"
        "comm = rcoll.init(rank=0, world_size=1, master_port=int(__import__('sys').argv[1]))\n"
        "try:\n"
        "    comm.allreduce(Fake())\n"
        "    raise SystemExit('a device op ran without a GPU')\n"
        "except rcoll.RcollError as e:\n"
        "    print(e)\n"
        "    assert str(e).startswith('rank 0: ') and 'allreduce' in str(e), e\n"
        "comm.allreduce(__import__('numpy').ones(3))  # host ops are unaffected\n"
        "comm.shutdown()\n"
    )
    from rcoll import spawn

    run = subprocess.run([sys.executable, "-c", code, str(spawn.free_port())], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-4000:]


def test_cpu_tensors_are_refused_without_loading_cuda():
    torch = pytest.importorskip("torch")
    import rcoll
    import rcoll.cuda

    x = torch.zeros(4)
    with pytest.raises(rcoll.InvalidArgumentError, match="not on a CUDA device"):
        rcoll.cuda.reduce(x, x, x, "sum")
    with pytest.raises(rcoll.InvalidArgumentError, match="must be a torch.Tensor"):
        rcoll.cuda.reduce([0.0], x, x, "sum")
    with pytest.raises(rcoll.InvalidArgumentError, match="not on a CUDA device"):
        rcoll.cuda.scale_divide(x, 2)


def test_c_header_needs_no_cuda_headers(tmp_path):
    header = os.path.join(CSRC, "cuda", "cuda_reduce.h")
    with open(header) as f:
        text = f.read()
    assert "#include <cuda" not in text and "#include \"cuda_runtime" not in text
    checked = 0
    for compiler, lang, std in (("cc", "c", "-std=c99"), ("c++", "c++", "-std=c++17")):
        path = shutil.which(compiler)
        if path is None:
            continue
        source = tmp_path / ("use." + ("c" if lang == "c" else "cc"))
        source.write_text(
            '#include "cuda_reduce.h"\n'
            "int use(void* s) { return rcollCudaReduce(0, 0, 0, 0, 2, 0, s) + RCOLL_CUDA_SUCCESS; }\n")
        run = subprocess.run([path, std, "-Wall", "-Wextra", "-Werror", "-pedantic", "-fsyntax-only",
                              "-I" + os.path.join(CSRC, "cuda"), str(source)], capture_output=True, text=True)
        assert run.returncode == 0, run.stderr
        checked += 1
    if not checked:
        pytest.skip("no C or C++ compiler")


# ------------------------------------------------------- with nvcc, no GPU


@pytest.mark.skipif(nvcc() is None, reason="nvcc is not on PATH")
def test_kernels_emulated_on_the_cpu_match_the_cpu_kernels(tmp_path):
    exe = tmp_path / "kernels_on_host"
    sources = [os.path.join(CSRC, "cuda", "host_check", "kernels_on_host.cu")] + [
        os.path.join(CSRC, name) for name in ("reduce_kernels.cc", "dtype.cc", "error.cc")]
    build = subprocess.run(
        [nvcc(), "-std=c++17", "-O1", "-Xcompiler=-Wall,-Wextra", "-Werror=all-warnings", "-Xcompiler=-Werror",
         "-I" + CSRC, "-I" + os.path.join(CSRC, "cuda"), *sources, "-o", str(exe)],
        capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stderr[-4000:]
    run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert " 0 failures" in run.stdout


# ------------------------------------------------------------- with a GPU


@pytest.fixture(scope="module")
def torch_gpu():
    """torch, when it and rcoll's kernels can use a GPU; a skip naming why not."""
    skip_without_torch_gpu(cuda_module)  # a GPU and torch.cuda but no rcoll._cuda: fail or skip as above
    import torch

    return torch


SPECIALS = ["nan", "inf", "-inf", "0.0", "-0.0", "max", "-max", "subnormal", "1.0", "-1.0", "2.0"]


def make_input(torch, dtype, n, seed):
    """n elements on the CPU: random values salted with the edge cases (NaN,
    infinities, signed zeros, extremes, subnormals; integer extremes; bool
    bytes other than 0 and 1)."""
    g = torch.Generator().manual_seed(seed)
    if dtype == "bool":
        choices = torch.tensor([0, 1, 2, 255], dtype=torch.uint8)
        return choices[torch.randint(0, 4, (n,), generator=g)].view(torch.bool)
    t = getattr(torch, dtype)
    salt = torch.rand(n, generator=g) < 0.15
    if dtype in FLOATS:
        info = torch.finfo(t)
        named = {"max": info.max, "-max": -info.max, "subnormal": info.tiny / 2}
        specials = torch.tensor([named.get(s) or float(s) for s in SPECIALS], dtype=torch.float64)
        x = torch.randn(n, generator=g, dtype=torch.float64) * 100
    else:
        info = torch.iinfo(t)
        specials = torch.tensor([info.min, info.max, -1 if info.min < 0 else 255, 0, 1], dtype=torch.int64)
        x = torch.randint(info.min, info.max, (n,), generator=g, dtype=torch.int64)
    picks = specials[torch.randint(0, len(specials), (n,), generator=g)]
    return torch.where(salt, picks, x).to(t)


def reference(torch, dtype, op, a, b):
    """The expected result on the CPU, with rcoll's semantics (README)."""
    import numpy as np

    if dtype == "bool":
        x, y = a.view(torch.uint8) != 0, b.view(torch.uint8) != 0
        r = {"sum": x | y, "max": x | y, "bor": x | y, "prod": x & y, "min": x & y, "band": x & y,
             "bxor": x ^ y}[op]
        return r.to(torch.uint8)  # compared with the result's bytes: must be exactly 0/1
    if dtype in FLOATS:
        x, y = (a.float(), b.float()) if dtype in ("float16", "bfloat16") else (a, b)  # rounded once
        r = {"sum": torch.add, "avg": torch.add, "prod": torch.mul, "min": torch.minimum,
             "max": torch.maximum}[op](x, y)
        return r.to(a.dtype)
    x, y = a.numpy(), b.numpy()  # numpy integer arithmetic wraps, as rcoll's does
    r = {"sum": np.add, "prod": np.multiply, "min": np.minimum, "max": np.maximum, "band": np.bitwise_and,
         "bor": np.bitwise_or, "bxor": np.bitwise_xor}[op](x, y)
    return torch.from_numpy(np.ascontiguousarray(r))


def assert_same(torch, dtype, got, want, context):
    """Equal elementwise; for floats NaN where NaN is expected (payloads and the
    sign of zero are not compared)."""
    if dtype == "bool":
        got = got.view(torch.uint8)
    if dtype in FLOATS:
        g, w = got.double(), want.double()
        gn, wn = torch.isnan(g), torch.isnan(w)
        bad = (gn != wn) | (~gn & ~wn & (g != w))
    else:
        bad = got != want
    if bool(bad.any()):
        i = int(bad.nonzero()[0])
        raise AssertionError(f"{context}: {int(bad.sum())} wrong elements; first at {i}: "
                             f"got {got[i].item()!r}, want {want[i].item()!r}")


GUARD = 0xA5


def placed(torch, data, offset, device):
    """(allocation, view): a copy of `data` `offset` elements into a fresh
    allocation whose other bytes hold GUARD, to catch writes out of bounds."""
    base = torch.empty(data.numel() + offset + 16, dtype=data.dtype, device=device)
    base.view(torch.uint8).fill_(GUARD)
    view = base[offset:offset + data.numel()]
    if data.dtype == torch.bool:  # as bytes, so that bool bytes 2 and 255 arrive unchanged
        view.view(torch.uint8).copy_(data.view(torch.uint8))
    else:
        view.copy_(data)
    return base, view


def assert_guard_intact(torch, base, offset, n, context):
    before = base[:offset].view(torch.uint8).cpu()
    after = base[offset + n:].view(torch.uint8).cpu()
    assert bool((before == GUARD).all()) and bool((after == GUARD).all()), f"{context}: wrote out of bounds"


def zeros_like_bytes(torch, dtype, n):
    t = getattr(torch, dtype)
    return torch.zeros(n, dtype=torch.uint8).view(torch.bool) if dtype == "bool" else torch.zeros(n, dtype=t)


@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_matches_reference(torch_gpu, dtype, op):
    torch = torch_gpu
    import rcoll
    import rcoll.cuda

    device = torch.device("cuda", torch.cuda.current_device())
    if not supported(dtype, op):
        a = torch.zeros(4, dtype=getattr(torch, dtype), device=device)
        with pytest.raises(rcoll.InvalidArgumentError):
            rcoll.cuda.reduce(a, a, a, op)
        return
    for n in SIZES:
        a_cpu = make_input(torch, dtype, n, seed=2 * n + 1)
        b_cpu = make_input(torch, dtype, n, seed=2 * n + 2)
        want = reference(torch, dtype, op, a_cpu, b_cpu)
        for layout, (dst_at, a_at, b_at) in LAYOUTS.items():
            context = f"{dtype} {op} n={n} {layout}"
            _, a = placed(torch, a_cpu, a_at, device)
            _, b = placed(torch, b_cpu, b_at, device)
            if dst_at == "a":
                dst = a
            elif dst_at == "b":
                dst = b
            else:
                dst_base, dst = placed(torch, zeros_like_bytes(torch, dtype, n), dst_at, device)
            assert rcoll.cuda.reduce(dst, a, b, op) is dst
            torch.cuda.synchronize()
            assert_same(torch, dtype, dst.cpu(), want, context)
            if not isinstance(dst_at, str):
                assert_guard_intact(torch, dst_base, dst_at, n, context)


@pytest.mark.parametrize("dtype", FLOATS)
def test_scale_divide_matches_reference(torch_gpu, dtype):
    torch = torch_gpu
    import rcoll.cuda

    device = torch.device("cuda", torch.cuda.current_device())
    for n in SIZES:
        data = make_input(torch, dtype, n, seed=n + 7)
        for divisor in (1, 2, 3, 7, 1000):
            x = data.float() if dtype in ("float16", "bfloat16") else data  # divided in float32, rounded once
            want = (x / divisor).to(data.dtype)
            for offset in (0, 1, 3):
                base, buf = placed(torch, data, offset, device)
                assert rcoll.cuda.scale_divide(buf, divisor) is buf
                torch.cuda.synchronize()
                context = f"{dtype} / {divisor} n={n} offset={offset}"
                assert_same(torch, dtype, buf.cpu(), want, context)
                assert_guard_intact(torch, base, offset, n, context)


@pytest.mark.parametrize("dtype", FLOATS)
def test_avg_is_a_sum_then_one_division(torch_gpu, dtype):
    torch = torch_gpu
    import rcoll.cuda

    t = getattr(torch, dtype)
    a = torch.tensor([1.0, 2.0, 3.0, -4.0, 0.5], device="cuda").to(t)
    b = torch.tensor([2.0, 2.0, 3.5, 4.0, 0.25], device="cuda").to(t)
    out = torch.empty_like(a)
    rcoll.cuda.reduce(out, a, b, "avg")
    assert torch.equal(out.cpu(), (a.cpu().double() + b.cpu().double()).to(t))
    rcoll.cuda.scale_divide(out, 2)
    assert torch.equal(out.cpu().double(), torch.tensor([1.5, 2.0, 3.25, 0.0, 0.375], dtype=torch.float64))


def test_runs_on_the_current_stream(torch_gpu):
    """The kernel is ordered after earlier work on the caller's stream: if it ran
    on another stream it would read `a` before the slow fill lands."""
    torch = torch_gpu
    import rcoll.cuda

    if not hasattr(torch.cuda, "_sleep"):
        pytest.skip("torch.cuda._sleep is not available")
    n = 1 << 22
    a = torch.zeros(n, device="cuda")
    b = torch.ones(n, device="cuda")
    out = torch.empty(n, device="cuda")
    torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        torch.cuda._sleep(100_000_000)  # about 0.1 s of GPU cycles
        a.fill_(2.0)
        rcoll.cuda.reduce(out, a, b, "sum")
    stream.synchronize()
    assert bool((out == 3.0).all())


def test_on_another_device(torch_gpu):
    torch = torch_gpu
    import rcoll.cuda

    if torch.cuda.device_count() < 2:
        pytest.skip("needs 2 GPUs")
    with torch.cuda.device(0):
        a = torch.arange(1000, dtype=torch.float32, device="cuda:1")
        out = torch.empty_like(a)
        rcoll.cuda.reduce(out, a, a, "sum")
    torch.cuda.synchronize(1)
    assert torch.equal(out.cpu(), 2 * torch.arange(1000, dtype=torch.float32))


def test_tensor_errors(torch_gpu):
    torch = torch_gpu
    import rcoll
    import rcoll.cuda

    a = torch.zeros(8, device="cuda")
    cases = [
        ((torch.zeros(8), a, a, "sum"), "not on a CUDA device"),
        ((a, a.double(), a, "sum"), "dtypes differ"),
        ((a, a[:4], a[:4], "sum"), "element counts differ"),
        ((a[::2], a[:4], a[:4], "sum"), "not contiguous"),
        ((a, a, a, "mean"), "unknown reduce op"),
        ((a[1:5], a[:4], a[2:6], "sum"), "overlaps an input partially"),
        ((a.to(torch.complex64), a.to(torch.complex64), a.to(torch.complex64), "sum"), "not supported"),
    ]
    for args, message in cases:
        with pytest.raises(rcoll.InvalidArgumentError, match=message):
            rcoll.cuda.reduce(*args)
    with pytest.raises(rcoll.InvalidArgumentError, match="positive integer"):
        rcoll.cuda.scale_divide(a, 0)
    with pytest.raises(rcoll.InvalidArgumentError, match="floating-point"):
        rcoll.cuda.scale_divide(torch.zeros(4, dtype=torch.int32, device="cuda"), 2)
