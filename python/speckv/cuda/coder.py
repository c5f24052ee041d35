"""The GPU coder (``cuda/speckv_coder.cu``): a predicted stream's chunks coded where the cache
lives, so that only coded bytes cross to the host; the stream ``speckv.encode`` writes, byte for
byte."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from .. import _speckv
from .._api import Joint, token_scale_args
from . import module as loaded
from .module import _LOCK, CHUNK_BLOCK, _Module, _ptr

#: scalars coded per round of `encode` (its scratch is ~25 bytes a scalar; the chunks of a
#: round run in parallel)
ROUND_SCALARS = 1 << 24


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


def fingerprint_blocks(chunk: int) -> int:
    """Full XXH3 blocks of a chunk's fingerprint input, 6 bytes a scalar (``speckv_coder.cuh``:
    fingerprint_blocks)."""
    length = 6 * chunk
    return (length - 1) // 1024 if length > 240 else 0


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

    module, stream = loaded._module(x)
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
    scale = token_scale_args(joint) if joint is not None else None
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
        # the float form's sums (J1), the GPU coder's: no integer form
        joint_args = (c, t, e, np.zeros(0, np.float32), coef.reshape(-1), offset.reshape(-1), None)
    capacity = lane_capacity(-(-chunk // 8))
    per_chunk = fingerprint_blocks(chunk)
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
        # the fingerprints: a long chunk's 1 KiB blocks summed apart, then their scrambles
        # chained a chunk at a time (speckv_xxh3.cuh: block_sums)
        span = [_ptr(ms), _ptr(cs), np.array(stop - start, u64), np.array(chunk, u64), np.array(per_chunk, u64)]
        sums = torch.empty(max(1, k * per_chunk * 8), dtype=torch.int64, device=x.device)
        if per_chunk:
            args = [*span, _ptr(sums), np.array(k * per_chunk, u64)]
            module.launch("speckv_fingerprint_blocks", k * per_chunk, args, stream)
        args = [*span, _ptr(sums), _ptr(fingerprints[first:last]), np.array(k, u64)]
        module.launch("speckv_fingerprints", k, args, stream, CHUNK_BLOCK)
        sizes = part.to(torch.int64)
        offsets = torch.cumsum(sizes, 0) - sizes
        out = torch.empty(int(sizes.sum()), dtype=torch.uint8, device=x.device)
        # a thread a lane word (most of the capacity is never written: those return at once)
        args = [_ptr(lane_words), np.array(capacity, u32), _ptr(lane_bytes), _ptr(offsets), _ptr(out)]
        module.launch("speckv_join_lanes", 8 * k * capacity, [*args, np.array(8 * k * capacity, u64)], stream)
        payloads.append(out.cpu())
    payload = torch.cat(payloads).numpy() if payloads else np.zeros(0, np.uint8)
    chunks = (payload, lengths.cpu().numpy().view(np.uint32), fingerprints.cpu().numpy().view(np.uint64))
    data = _speckv.assemble_predicted(
        name, list(shape), chunk, chunks, torch_hint=True, joint=None if joint_args is None else (joint_args, scale)
    )
    return data, (own.reshape(shape) if own is not None else None)
