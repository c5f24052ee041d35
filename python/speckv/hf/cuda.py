"""The CUDA module: the codec's work done where the cache lives, on the GPU.

Two programs, each the same source the CPU tests build for the host and compare with the Rust
path bit for bit: ``cuda/speckv_params.cu`` computes the coding parameters (fp8 quantisation
of a cache, the coder's float32 ``mu`` from a prediction, sigma codes), exactly the arrays the
Rust coder reads; ``cuda/speckv_coder.cu`` codes a predicted stream's chunks (``encode``), so
that only coded bytes cross to the host: the stream ``speckv.encode`` writes, byte for byte.

Loading: the sources ship inside the extension (``_speckv.cuda_sources``); on first use they
are compiled just in time with NVRTC (``cuda.bindings``, which PyTorch's CUDA wheels install),
for the GPU's architecture, to PTX cached on disk (``$SPECKV_CACHE_DIR/cuda``), then loaded
with the CUDA driver into torch's current context and launched on torch's current stream.
Nothing here imports torch or CUDA packages until a function is called, and `available()`
says whether one can be.

>>> import speckv.hf.cuda
>>> isinstance(speckv.hf.cuda.available(), bool)
True
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from .. import _speckv
from .._speckv import SpeckvError

#: threads per block of every kernel (grid-stride loops: any size works)
BLOCK = 256
#: at most this many blocks per launch; the loops stride over the rest
MAX_BLOCKS = 65535
#: threads per block of the per-chunk and per-lane kernels: one warp, so that a stream's few
#: dozen chunks spread over the multiprocessors instead of sharing one
CHUNK_BLOCK = 32
#: scalars coded per round of `encode` (its scratch is ~25 bytes a scalar; the chunks of a
#: round run in parallel)
ROUND_SCALARS = 1 << 24
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
    folder = Path(os.environ.get("SPECKV_CACHE_DIR", Path.home() / ".cache" / "speckv")) / "cuda"
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
        raise TypeError("speckv.hf.cuda works on CUDA tensors; give CPU tensors to the CPU path")
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


class ExactTables(ctypes.Structure):
    """``speckv::ExactTables`` of ``cuda/speckv_coder.cuh``, field for field (C layout): the
    exact model's tables (device or host pointers) and numbers, as the coder kernels take
    them by value."""

    _fields_ = [
        ("nodes", ctypes.c_void_p),
        ("edges", ctypes.c_void_p),
        ("sigmas", ctypes.c_void_p),
        ("half_width", ctypes.c_double),
        ("last", ctypes.c_double),
        ("min_ordinal", ctypes.c_int64),
        ("max_ordinal", ctypes.c_int64),
        ("exponent_bias", ctypes.c_int64),
        ("n_edges", ctypes.c_uint32),
        ("g_max", ctypes.c_uint32),
        ("precision", ctypes.c_uint32),
        ("width", ctypes.c_uint32),
        ("mantissa_bits", ctypes.c_uint32),
        ("max_magnitude", ctypes.c_uint32),
        ("adapt_increment", ctypes.c_uint32),
        ("adapt_period", ctypes.c_uint32),
        ("adapt_shift", ctypes.c_uint32),
    ]


class JointModel(ctypes.Structure):
    """``speckv::JointModel`` of ``cuda/speckv_joint.cuh``, field for field (C layout): a
    stream's joint residual model and token scale, as the joint kernel takes it by value."""

    _fields_ = [
        ("coef", ctypes.c_void_p),
        ("offset", ctypes.c_void_p),
        ("outside", ctypes.c_void_p),
        ("plain", ctypes.c_void_p),
        ("values", ctypes.c_void_p),
        ("sigmas", ctypes.c_void_p),
        ("channels", ctypes.c_uint32),
        ("tokens", ctypes.c_uint32),
        ("outside_channels", ctypes.c_uint32),
        ("width", ctypes.c_uint32),
        ("prior", ctypes.c_uint32),
        ("clamp", ctypes.c_uint32),
    ]


def exact_tables(dtype_name: str, nodes: int, edges: int, sigmas: int) -> ExactTables:
    """The ``ExactTables`` of ``dtype_name`` (``"bfloat16"``, ``"float16"``,
    ``"float8_e4m3fn"``, ``"float8_e5m2"``) around the addresses where ``nodes``, ``edges`` and
    ``sigmas`` of ``_speckv.exact_tables(dtype_name)`` were copied."""
    t = _speckv.exact_tables(dtype_name)
    return ExactTables(
        nodes,
        edges,
        sigmas,
        t["half_width"],
        float(t["nodes"].size - 2),
        t["min_ordinal"],
        t["max_ordinal"],
        t["exponent_bias"],
        t["edges"].size,
        t["g_max"],
        t["precision"],
        t["width"],
        t["mantissa_bits"],
        t["max_magnitude"],
        t["adapt_increment"],
        t["adapt_period"],
        t["adapt_shift"],
    )


def lane_capacity(scalars: int) -> int:
    """Words a lane of ``scalars`` scalars may write (``speckv_coder.cuh``: lane_capacity)."""
    return (scalars * 73 + 31) // 32 + 2


#: the dtypes the GPU coder takes (torch's names, which are the core's)
_CODED = ("bfloat16", "float16", "float8_e4m3fn", "float8_e5m2")


def _device_tables(module: _Module, dtype_name: str, device: Any) -> tuple[np.ndarray, Any, Any]:
    """The exact model's tables of ``dtype_name`` on the module's ``device``, once per
    process: the bytes of an ``ExactTables`` kernel argument, and the sigma and value tables
    (for the joint model)."""
    import torch

    # Built once under the lock and never replaced: the struct holds bare pointers to the
    # arrays, so a second thread's copy replacing the first would free tables that a kernel
    # launched by the first thread still reads (seen as wrong bytes from threads that coded
    # at once).
    with _LOCK:
        if dtype_name not in module.tables:
            t = _speckv.exact_tables(dtype_name)
            # uint32 nodes travel as int32: the kernels read the same bytes
            host = (t["nodes"].view(np.int32), t["edges"], t["sigmas"], t["values"])
            arrays = [torch.from_numpy(a).to(device) for a in host]
            struct = exact_tables(dtype_name, *(a.data_ptr() for a in arrays[:3]))
            module.tables[dtype_name] = (_as_struct(struct), arrays)
        raw, arrays = module.tables[dtype_name]
    return raw, arrays[2], arrays[3]


def _as_struct(struct: ctypes.Structure) -> np.ndarray:
    """A struct kernel argument as the bytes `launch` passes."""
    return np.frombuffer(bytes(struct), np.uint8).copy()


def encode(x: Any, mu: Any, codes: Any, *, chunk_size: int | None = None, joint: Any = None) -> bytes:
    """``speckv.encode(x, mu, sigma_codes=codes, chunk_size=chunk_size, joint=joint)`` of a
    CUDA tensor, coded on its GPU (``cuda/speckv_coder.cu``): the same bytes, but only the
    coded chunks, one length and one fingerprint per chunk cross to the host instead of x, mu
    and the codes.

    ``x``: bfloat16, float16 or float8 (e4m3fn, e5m2) on the GPU; ``mu``: floats of x's shape
    (rounded to float32 once, as the CPU path does); ``codes``: int16 sigma codes broadcastable
    to x's shape (``speckv.sigma_codes``; per channel usually). The exact model. ``joint``: a
    ``speckv.Joint`` (its ``outside`` residuals may be a tensor on the GPU, e.g. from
    `encode_joint` of the keys); see `encode_joint`."""
    return _encode(x, mu, codes, chunk_size, joint)[0]


def encode_joint(x: Any, mu: Any, codes: Any, joint: Any, *, chunk_size: int | None = None) -> tuple[bytes, Any]:
    """`encode` with the joint residual model ``joint`` (None: without), and the residuals
    ``value(x) - mu`` (float32, 0 where not finite; x's shape, on the GPU; None without the
    joint model): what a values stream conditions on when this one holds the keys
    (``speckv.residuals``, computed where the data is)."""
    return _encode(x, mu, codes, chunk_size, joint)


def _encode(x: Any, mu: Any, codes: Any, chunk_size: int | None, joint: Any) -> tuple[bytes, Any]:
    import torch

    from .._api import Joint, _token_scale

    module, stream = _module(x)
    name = str(x.dtype).removeprefix("torch.")
    if name not in _CODED:
        raise TypeError(f"x: the GPU coder codes {sorted(_CODED)}, got {x.dtype}")
    shape = tuple(int(d) for d in x.shape)
    mu = torch.as_tensor(mu, device=x.device)
    if tuple(mu.shape) != shape:
        raise ValueError(f"mu: shape {tuple(mu.shape)}, x has {shape}")
    codes = torch.as_tensor(codes, device=x.device)
    if codes.dtype != torch.int16:
        raise TypeError(f"codes: expected int16 sigma codes (speckv.sigma_codes), got {codes.dtype}")
    try:
        codes = codes.expand(shape).contiguous().reshape(-1)
    except RuntimeError:
        raise ValueError(f"codes: shape {tuple(codes.shape)} does not broadcast to x's shape {shape}") from None
    chunk = _speckv.DEFAULT_CHUNK_SCALARS if chunk_size is None else int(chunk_size)
    if not 1 <= chunk <= 1 << 24:
        raise ValueError(f"chunk_size: expected 1..=2**24, got {chunk}")
    if joint is not None and not isinstance(joint, Joint):
        raise TypeError(f"joint: expected speckv.Joint or None, got {type(joint).__name__}")
    words = x.contiguous().reshape(-1).view(torch.uint8 if x.element_size() == 1 else torch.int16)
    m = mu.to(torch.float32).contiguous().reshape(-1)
    n = words.numel()
    chunks = -(-n // chunk)
    tables, sigmas, values = _device_tables(module, name, x.device)
    u64, u32 = np.uint64, np.uint32
    coded_mu, coded_codes, own = m, codes, None
    layer_scalars, runs = 0, torch.zeros(1, dtype=torch.int32, device=x.device)
    joint_args = None
    scale = _token_scale(joint) if joint is not None else None
    if joint is not None:
        # invariant J1/J3 parameters of every scalar, then coded like any other (runs per channel)
        c, t = int(joint.channels), int(joint.tokens)
        layer_scalars = c * t
        if c < 1 or t < 1 or n % layer_scalars or chunk % layer_scalars:
            raise ValueError(f"joint: {n} scalars in chunks of {chunk} are not whole layers of {c} x {t}")
        layers = n // layer_scalars
        coef = np.ascontiguousarray(joint.coef, np.float32).reshape(layers, c, -1)
        offset = np.ascontiguousarray(joint.offset, np.float32).reshape(layers, c)
        e = coef.shape[-1] - c
        plain = ~(coef.reshape(layers, -1).any(axis=1) | offset.any(axis=1))  # J2
        outside = torch.zeros(1, dtype=torch.float32, device=x.device)
        if e:
            outside = torch.as_tensor(joint.outside, dtype=torch.float32, device=x.device).contiguous().reshape(-1)
            if outside.numel() != layers * e * t:
                raise ValueError(f"joint: {outside.numel()} outside residuals, {layers * e * t} expected")
        prior, clamp = scale if scale is not None else (0, 0)
        coef_d, offset_d, plain_d = (torch.from_numpy(a).to(x.device) for a in (coef, offset, plain.astype(np.uint8)))
        model = JointModel(
            coef_d.data_ptr(),
            offset_d.data_ptr(),
            outside.data_ptr(),
            plain_d.data_ptr(),
            values.data_ptr(),
            sigmas.data_ptr(),
            c,
            t,
            e,
            8 * x.element_size(),
            prior,
            clamp,
        )
        model_bytes = _as_struct(model)
        coded_mu = torch.empty_like(m)
        coded_codes = torch.empty_like(codes)
        own = torch.empty_like(m)
        args = [model_bytes, _ptr(words), _ptr(m), _ptr(codes), _ptr(coded_mu), _ptr(coded_codes), _ptr(own)]
        module.launch("speckv_joint_params", layers * t, [*args, np.array(layers * t, u64)], stream)
        run = np.where(plain, layer_scalars, t).astype(np.int32)
        runs = torch.from_numpy(run).to(x.device)
        joint_args = (c, t, e, np.zeros(0, np.float32), coef.reshape(-1), offset.reshape(-1))
    capacity = lane_capacity(-(-chunk // 8))
    lengths = torch.empty(chunks, dtype=torch.int32, device=x.device)
    fingerprints = torch.empty(chunks, dtype=torch.int64, device=x.device)
    payloads = []
    per_round = max(1, ROUND_SCALARS // chunk)
    for first in range(0, chunks, per_round):
        # a round of chunks: scratch for its symbols and lanes, its payload made contiguous
        last = min(chunks, first + per_round)
        start, stop = first * chunk, min(n, last * chunk)
        k = last - first
        xs, ms, cs = words[start:stop], m[start:stop], codes[start:stop]
        symbols = torch.empty(stop - start, dtype=torch.int64, device=x.device)
        args = [tables, _ptr(xs), _ptr(coded_mu[start:stop]), _ptr(coded_codes[start:stop]), _ptr(symbols)]
        module.launch("speckv_exact_symbols", stop - start, [*args, np.array(stop - start, u64)], stream)
        lane_words = torch.empty(k * 8 * capacity, dtype=torch.int32, device=x.device)
        lane_bytes = torch.empty(k * 8, dtype=torch.int32, device=x.device)
        part = lengths[first:last]
        round_runs = runs[start // layer_scalars :] if layer_scalars else runs
        # the escapes (SYMBOL_RAW, the sign bit), each chunk's found by bisection; the escape
        # model walks them (a chunk's one serial step), then eight lanes a chunk code
        positions = (symbols < 0).nonzero().reshape(-1)
        edges = torch.arange(k + 1, dtype=torch.int64, device=x.device) * chunk
        bounds = torch.searchsorted(positions, edges)
        escapes = torch.empty(stop - start, dtype=torch.int64, device=x.device)
        args = [tables, _ptr(xs), _ptr(positions), _ptr(bounds), _ptr(escapes), np.array(k, u64)]
        module.launch("speckv_escapes", k, args, stream, CHUNK_BLOCK)
        span = [np.array(stop - start, u64), np.array(chunk, u64)]
        args = [tables, _ptr(xs), _ptr(symbols), _ptr(escapes), *span]
        args += [_ptr(lane_words), np.array(capacity, u32), _ptr(lane_bytes)]
        args += [np.array(layer_scalars, u32), _ptr(round_runs), np.array(8 * k, u64)]
        module.launch("speckv_code_lanes", 8 * k, args, stream, CHUNK_BLOCK)
        module.launch(
            "speckv_payload_lengths", k, [_ptr(lane_bytes), _ptr(part), np.array(k, u64)], stream, CHUNK_BLOCK
        )
        args = [_ptr(ms), _ptr(cs), np.array(stop - start, u64), np.array(chunk, u64)]
        args += [_ptr(fingerprints[first:last]), np.array(k, u64)]
        module.launch("speckv_fingerprints", k, args, stream, CHUNK_BLOCK)
        sizes = part.to(torch.int64)
        offsets = torch.cumsum(sizes, 0) - sizes
        out = torch.empty(int(sizes.sum()), dtype=torch.uint8, device=x.device)
        args = [_ptr(lane_words), np.array(capacity, u32), _ptr(lane_bytes), _ptr(offsets), _ptr(out)]
        module.launch("speckv_join_lanes", k, [*args, np.array(k, u64)], stream, CHUNK_BLOCK)
        payloads.append(out.cpu())
    payload = torch.cat(payloads).numpy() if payloads else np.zeros(0, np.uint8)
    data = _speckv.assemble_predicted(
        name,
        list(shape),
        chunk,
        payload,
        lengths.cpu().numpy().view(np.uint32),
        fingerprints.cpu().numpy().view(np.uint64),
        torch_hint=True,
        joint=joint_args,
        token_scale=scale,
    )
    return data, (own.reshape(shape) if own is not None else None)


#: rows (batch x tokens) one thread of the statistics kernel sums before its atomic adds
STATS_ROWS = 64


def channel_sums(t: Any, p: Any, p8: Any, q: Any, scale: float) -> np.ndarray:
    """Exact per-channel calibration sums of a cache ``t`` ``[..., heads, tokens, dim]`` on the
    GPU (``cuda/speckv_stats.cuh``), with the predictions ``p`` (bf16 mode) and ``p8`` (fp8
    mode, cache units), ``q`` the cache quantised to fp8 (fp8 units) and the fp8 scale:
    ``_speckv.channel_sums``' limbs bit for bit, ``uint64 [3, heads * dim, 3]`` on the host."""
    import torch

    module, stream = _module(t)
    arrays = [_f32(a).reshape(-1) for a in (t, p, p8, q)]
    if any(a.numel() != arrays[0].numel() for a in arrays):
        raise ValueError("channel_sums: t, p, p8 and q must have one shape")
    heads, tokens, dim = (int(d) for d in t.shape[-3:])
    batch = t.numel() // max(1, heads * tokens * dim)
    channels = heads * dim
    sums = torch.zeros(3 * channels * 3, dtype=torch.int64, device=t.device)
    items = channels * -(-(batch * tokens) // STATS_ROWS)
    u64 = np.uint64
    args = [*(_ptr(a) for a in arrays), np.array(scale, np.float64)]
    args += [np.array(v, u64) for v in (batch, heads, tokens, dim, STATS_ROWS)]
    module.launch("speckv_channel_sums", items, [*args, _ptr(sums), np.array(items, u64)], stream)
    return sums.cpu().numpy().view(np.uint64).reshape(3, channels, 3)


__all__ = [
    "CudaUnavailableError",
    "available",
    "channel_sums",
    "coding_mu",
    "compile_kernels",
    "encode",
    "encode_joint",
    "fp8_quantize",
    "relative_sigma_codes",
    "sigma_codes",
    "source_digest",
]
