"""The CUDA module: the codec's coding parameters computed where the cache lives, on the GPU.

The kernels (``cuda/speckv_params.cu``) run the arithmetic of ``cuda/speckv_params.cuh``, the
same source the CPU tests build for the host and compare with the Rust path bit for bit:
fp8 quantisation of a cache, the coder's float32 ``mu`` from a prediction, and sigma codes.
Their outputs are exactly the arrays the Rust coder reads.

Loading: the sources ship inside the extension (``_speckv.cuda_sources``); on first use they
are compiled just in time with NVRTC (``cuda.bindings``, which PyTorch's CUDA wheels install),
for the GPU's architecture, to PTX cached on disk (``$SPECKV_CACHE_DIR/cuda``), then loaded
with the CUDA driver into torch's current context and launched on torch's current stream.
Nothing here imports torch or CUDA packages until a function is called, and `available()`
says whether one can be.

>>> import speckv.cuda
>>> isinstance(speckv.cuda.available(), bool)
True
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from . import _speckv
from ._speckv import SpeckvError

#: threads per block of every kernel (grid-stride loops: any size works)
BLOCK = 256
#: at most this many blocks per launch; the loops stride over the rest
MAX_BLOCKS = 65535
# NVRTC options: no contraction into fused multiply-adds (the sources spell every operation
# with a correctly rounded intrinsic anyway; this guards additions made later)
_OPTIONS = ("--fmad=false", "-std=c++17")


class CudaUnavailableError(SpeckvError):
    """The CUDA module cannot run here: no CUDA device, or no NVRTC / driver bindings (the
    message says which and what to install)."""


def _sources() -> dict[str, str]:
    return dict(_speckv.cuda_sources())


def source_digest() -> str:
    """Digest of the kernels' sources (what the on-disk cache is keyed by)."""
    h = hashlib.sha256()
    for name, text in sorted(_sources().items()):
        h.update(name.encode() + b"\0" + text.encode() + b"\0")
    return h.hexdigest()[:16]


def _nvrtc() -> Any:
    try:
        from cuda.bindings import nvrtc
    except ImportError as e:
        raise CudaUnavailableError(
            "the CUDA module compiles with NVRTC through the `cuda-bindings` package (installed with "
            f"PyTorch's CUDA wheels; `pip install cuda-bindings nvidia-cuda-nvrtc`): {e}"
        ) from None
    return nvrtc


def _check(result: Any, what: str) -> Any:
    """cuda.bindings calls return ``(status, *values)``: the values, or a typed error."""
    status, *values = result if isinstance(result, tuple) else (result,)
    if int(status) != 0:
        raise CudaUnavailableError(f"{what} failed: {status!r}")
    return values[0] if len(values) == 1 else values


def compile_kernels(arch: str = "compute_90", *, cache: bool = True) -> bytes:
    """The kernels compiled with NVRTC for ``arch``: PTX for a virtual architecture
    (``compute_XY``), a cubin for a real one (``sm_XY``), from the disk cache when present.
    Needs no GPU (the tests compile on CPU-only machines)."""
    cubin = arch.startswith("sm_")
    if not (cubin or arch.startswith("compute_")):
        raise ValueError(f"arch: expected 'compute_XY' or 'sm_XY', got {arch!r}")
    folder = Path(os.environ.get("SPECKV_CACHE_DIR", Path.home() / ".cache" / "speckv")) / "cuda"
    path = folder / f"speckv_params-{source_digest()}-{arch}.{'cubin' if cubin else 'ptx'}"
    if cache and path.exists():
        return path.read_bytes()
    nvrtc = _nvrtc()
    sources = _sources()
    headers = [n for n in sources if n.endswith(".cuh")]
    program = _check(
        nvrtc.nvrtcCreateProgram(
            sources["speckv_params.cu"].encode(),
            b"speckv_params.cu",
            len(headers),
            [sources[n].encode() for n in headers],
            [n.encode() for n in headers],
        ),
        "nvrtcCreateProgram",
    )
    try:
        options = [f"--gpu-architecture={arch}".encode(), *(o.encode() for o in _OPTIONS)]
        (status,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
        if int(status) != 0:
            size = _check(nvrtc.nvrtcGetProgramLogSize(program), "nvrtcGetProgramLogSize")
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(program, log)
            raise SpeckvError(f"NVRTC could not compile the CUDA module for {arch}:\n{log.decode(errors='replace')}")
        get_size, get = (
            (nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN) if cubin else (nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX)
        )
        size = _check(get_size(program), "nvrtcGet*Size")
        image = b" " * size
        _check(get(program, image), "nvrtcGet*")
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    if cache:
        folder.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(f".{os.getpid()}.tmp")
        partial.write_bytes(image)
        os.replace(partial, path)  # readers never see a half-written file
    return image


def available() -> bool:
    """Whether the kernels can run here: torch sees a CUDA device and the NVRTC and driver
    bindings import. Cheap, and imports nothing heavy when torch is absent."""
    try:
        import torch
    except ImportError:
        return False
    if not torch.cuda.is_available():
        return False
    try:
        from cuda.bindings import driver, nvrtc  # noqa: F401
    except ImportError:
        return False
    return True


class _Module:
    """The kernels loaded into one device's primary context."""

    def __init__(self, device: int) -> None:
        import torch
        from cuda.bindings import driver

        self.driver = driver
        torch.cuda.init()
        with torch.cuda.device(device):
            torch.cuda.current_stream()  # makes torch's (primary) context current here
            major, minor = torch.cuda.get_device_capability(device)
            # a cubin for this GPU (no driver JIT, so no need for a driver as new as NVRTC's
            # PTX); PTX for the driver to compile if NVRTC does not know the architecture
            try:
                image = compile_kernels(f"sm_{major}{minor}")
            except SpeckvError:
                image = compile_kernels(f"compute_{major}{minor}")
            _check(driver.cuInit(0), "cuInit")
            module = _check(driver.cuModuleLoadData(image), "cuModuleLoadData")
        self.module = module
        self.kernels = {
            name: _check(driver.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction({name})")
            for name in ("speckv_sigma_codes", "speckv_relative_sigma_codes", "speckv_fp8_quantize", "speckv_coding_mu")
        }

    def launch(self, name: str, n: int, args: list[np.ndarray], stream: int) -> None:
        """Runs kernel ``name`` over ``n`` scalars. ``args``: one numpy scalar array per kernel
        parameter holding its value (device pointers as uint64), in order."""
        if n == 0:
            return
        blocks = min(MAX_BLOCKS, (n + BLOCK - 1) // BLOCK)
        pointers = np.array([a.ctypes.data for a in args], dtype=np.uint64)
        _check(
            self.driver.cuLaunchKernel(
                self.kernels[name],
                blocks,
                1,
                1,
                BLOCK,
                1,
                1,
                0,
                self.driver.CUstream(stream),
                pointers.ctypes.data,
                0,
            ),
            f"launching {name}",
        )


_MODULES: dict[int, _Module] = {}
_LOCK = threading.Lock()


def _module(tensor: Any) -> tuple[_Module, int]:
    import torch

    if not isinstance(tensor, torch.Tensor) or not tensor.is_cuda:
        raise TypeError("speckv.cuda works on CUDA tensors; give CPU tensors to the CPU path")
    if not available():
        raise CudaUnavailableError("no CUDA device, or the cuda-bindings package is missing")
    device = tensor.device.index if tensor.device.index is not None else torch.cuda.current_device()
    with _LOCK:
        if device not in _MODULES:
            _MODULES[device] = _Module(device)
    return _MODULES[device], int(torch.cuda.current_stream(device).cuda_stream)


def _ptr(t: Any) -> np.ndarray:
    return np.array(t.data_ptr(), dtype=np.uint64)


def _f32(t: Any) -> Any:
    import torch

    if not t.is_floating_point():
        raise TypeError(f"expected a floating-point tensor, got {t.dtype}")
    return t.to(torch.float32).contiguous()  # bf16 / fp16 -> f32 is exact


def fp8_quantize(x: Any, scale: float) -> Any:
    """``x / scale`` saturated to +-448 and rounded to float8_e4m3fn, on x's GPU: the fp8
    mode's stored cache, bit for bit what ``speckv.hf.calibration.fp8_quantize`` makes."""
    import torch

    module, stream = _module(x)
    src = _f32(x)
    out = torch.empty(src.shape, dtype=torch.uint8, device=src.device)
    n = src.numel()
    args = [_ptr(src), np.array(scale, np.float32), _ptr(out), np.array(n, np.uint64)]
    module.launch("speckv_fp8_quantize", n, args, stream)
    return out.view(torch.float8_e4m3fn)


def coding_mu(pred: Any, fp8_scale: float | None = None, gain: Any = None) -> Any:
    """The coder's float32 ``mu`` from a prediction on the GPU: divided by ``fp8_scale`` for
    the fp8 mode (None: other modes), times ``gain`` per channel (last dimension; the joint
    model's gain; None: 1)."""
    import torch

    module, stream = _module(pred)
    src = _f32(pred)
    channels = src.shape[-1] if src.dim() else 1
    g = torch.ones(channels, dtype=torch.float32, device=src.device) if gain is None else _f32(gain).reshape(-1)
    if g.numel() != channels:
        raise ValueError(f"gain: {g.numel()} values for {channels} channels")
    out = torch.empty_like(src)
    n = src.numel()
    fp8 = fp8_scale is not None
    args = [
        _ptr(src),
        np.array(fp8_scale if fp8 else 1.0, np.float32),
        np.array(int(fp8), np.int32),
        _ptr(g.to(src.device)),
        np.array(channels, np.uint64),
        _ptr(out),
        np.array(n, np.uint64),
    ]
    module.launch("speckv_coding_mu", n, args, stream)
    return out


def sigma_codes(sigma: Any) -> Any:
    """``speckv.sigma_codes`` on the GPU: int16 codes, same shape (raises for a sigma that is
    not positive and finite, as the CPU path does)."""
    import torch

    module, stream = _module(sigma)
    src = _f32(sigma)
    out = torch.empty(src.shape, dtype=torch.int16, device=src.device)
    n = src.numel()
    module.launch("speckv_sigma_codes", n, [_ptr(src), _ptr(out), np.array(n, np.uint64)], stream)
    if n and bool((out == np.iinfo(np.int16).min).any()):
        raise SpeckvError("sigma must be positive and finite")
    return out


def relative_sigma_codes(mu: Any, s: Any, r: Any) -> Any:
    """Per-scalar codes of ``sqrt(s^2 + (r mu)^2)`` on the GPU; ``mu`` ``[..., dim]``, ``s``
    and ``r`` ``[dim]`` (one head's channels), as ``_speckv.relative_sigma_codes`` computes
    them for that head."""
    import torch

    module, stream = _module(mu)
    m, sv, rv = _f32(mu), _f32(s).reshape(-1), _f32(r).reshape(-1)
    dim = m.shape[-1]
    if sv.numel() != dim or rv.numel() != dim:
        raise ValueError(f"s and r: {sv.numel()} and {rv.numel()} values for {dim} channels")
    out = torch.empty(m.shape, dtype=torch.int16, device=m.device)
    rows = m.numel() // dim if dim else 0
    args = [_ptr(m), _ptr(sv), _ptr(rv), _ptr(out), np.array(rows, np.uint64), np.array(dim, np.uint64)]
    module.launch("speckv_relative_sigma_codes", rows * dim, args, stream)
    if m.numel() and bool((out == np.iinfo(np.int16).min).any()):
        raise SpeckvError("sigma must be positive and finite")
    return out


__all__ = [
    "CudaUnavailableError",
    "available",
    "coding_mu",
    "compile_kernels",
    "fp8_quantize",
    "relative_sigma_codes",
    "sigma_codes",
    "source_digest",
]
