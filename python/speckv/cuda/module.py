"""The CUDA module's loading: the kernels' sources compiled with NVRTC (cached on disk), loaded
into a device's primary context and launched on torch's current stream; what every kernel call
shares (`_module`, `_ptr`, `_f32`)."""

from __future__ import annotations

import hashlib
import os
import threading
from typing import Any

import numpy as np

from .. import _speckv
from .._cache_dir import cache_dir
from .._speckv import SpeckvError

#: threads per block of every kernel (grid-stride loops: any size works)
BLOCK = 256
#: at most this many blocks per launch; the loops stride over the rest
MAX_BLOCKS = 65535
#: threads per block of the per-chunk and per-lane kernels: one warp, so that a stream's few
#: dozen chunks spread over the multiprocessors instead of sharing one
CHUNK_BLOCK = 32
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


#: the programs and their kernels (one module per program, loaded on first use)
PROGRAMS: dict[str, tuple[str, ...]] = {
    "speckv_params.cu": (
        "speckv_sigma_codes",
        "speckv_relative_sigma_codes",
        "speckv_fp8_quantize",
        "speckv_coding_mu",
    ),
    "speckv_coder.cu": (
        "speckv_joint_params",
        "speckv_exact_symbols",
        "speckv_escapes",
        "speckv_code_lanes",
        "speckv_payload_lengths",
        "speckv_fingerprint_blocks",
        "speckv_fingerprints",
        "speckv_join_lanes",
    ),
    "speckv_stats.cu": ("speckv_channel_sums",),
}


def compile_kernels(arch: str = "compute_90", *, program: str = "speckv_params.cu", cache: bool = True) -> bytes:
    """``program`` (one of ``PROGRAMS``) compiled with NVRTC for ``arch``: PTX for a virtual
    architecture (``compute_XY``), a cubin for a real one (``sm_XY``), from the disk cache
    when present. Needs no GPU (the tests compile on CPU-only machines)."""
    cubin = arch.startswith("sm_")
    if not (cubin or arch.startswith("compute_")):
        raise ValueError(f"arch: expected 'compute_XY' or 'sm_XY', got {arch!r}")
    if program not in PROGRAMS:
        raise ValueError(f"program: expected one of {sorted(PROGRAMS)}, got {program!r}")
    folder = cache_dir() / "cuda"
    stem = program.removesuffix(".cu")
    path = folder / f"{stem}-{source_digest()}-{arch}.{'cubin' if cubin else 'ptx'}"
    if cache and path.exists():
        return path.read_bytes()
    nvrtc = _nvrtc()
    sources = _sources()
    headers = [n for n in sources if n.endswith(".cuh")]
    program_handle = _check(
        nvrtc.nvrtcCreateProgram(
            sources[program].encode(),
            program.encode(),
            len(headers),
            [sources[n].encode() for n in headers],
            [n.encode() for n in headers],
        ),
        "nvrtcCreateProgram",
    )
    try:
        options = [f"--gpu-architecture={arch}".encode(), *(o.encode() for o in _OPTIONS)]
        (status,) = nvrtc.nvrtcCompileProgram(program_handle, len(options), options)
        if int(status) != 0:
            size = _check(nvrtc.nvrtcGetProgramLogSize(program_handle), "nvrtcGetProgramLogSize")
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(program_handle, log)
            raise SpeckvError(f"NVRTC could not compile {program} for {arch}:\n{log.decode(errors='replace')}")
        get_size, get = (
            (nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN) if cubin else (nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX)
        )
        size = _check(get_size(program_handle), "nvrtcGet*Size")
        image = b" " * size
        _check(get(program_handle, image), "nvrtcGet*")
    finally:
        nvrtc.nvrtcDestroyProgram(program_handle)
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
            major, minor = torch.cuda.get_device_capability(device)
            _check(driver.cuInit(0), "cuInit")
            # torch's context is the device's primary one: the modules load into it, and
            # every launch makes it current first (`_bind`)
            self.context = _check(
                driver.cuDevicePrimaryCtxRetain(_check(driver.cuDeviceGet(device), "cuDeviceGet")),
                "cuDevicePrimaryCtxRetain",
            )
            self._bind()
            self.kernels: dict[str, Any] = {}
            for program, names in PROGRAMS.items():
                # a cubin for this GPU (no driver JIT, so no need for a driver as new as
                # NVRTC's PTX); PTX for the driver to compile if NVRTC does not know the
                # architecture
                try:
                    image = compile_kernels(f"sm_{major}{minor}", program=program)
                except SpeckvError:
                    image = compile_kernels(f"compute_{major}{minor}", program=program)
                module = _check(driver.cuModuleLoadData(image), "cuModuleLoadData")
                for name in names:
                    self.kernels[name] = _check(
                        driver.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction({name})"
                    )
        # per dtype: the exact model's tables on this device (see `_device_tables`)
        self.tables: dict[str, tuple[np.ndarray, list[Any]]] = {}

    def launch(self, name: str, n: int, args: list[np.ndarray], stream: int, block: int = BLOCK) -> None:
        """Runs kernel ``name`` over ``n`` items (scalars, or chunks with ``block=CHUNK_BLOCK``).
        ``args``: one numpy array per kernel parameter holding its value (device pointers as
        uint64, a struct as its bytes), in order."""
        if n == 0:
            return
        self._bind()
        blocks = min(MAX_BLOCKS, (n + block - 1) // block)
        pointers = np.array([a.ctypes.data for a in args], dtype=np.uint64)
        _check(
            self.driver.cuLaunchKernel(
                self.kernels[name],
                blocks,
                1,
                1,
                block,
                1,
                1,
                0,
                self.driver.CUstream(stream),
                pointers.ctypes.data,
                0,
            ),
            f"launching {name}",
        )

    def _bind(self) -> None:
        """Makes the module's context current on this thread: the driver API launches into
        the calling thread's current context, and a thread that has made no CUDA runtime call
        yet (a worker thread, say) has none, or another device's."""
        current = _check(self.driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if int(current) != int(self.context):
            _check(self.driver.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")


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
