"""The coding parameters computed on the GPU (``cuda/speckv_params.cu``, ``cuda/speckv_stats.cu``):
fp8 quantisation, the coder's ``mu``, sigma codes, and the calibration's channel sums, bit for
bit what the Rust path computes on the host."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._speckv import SpeckvError
from . import module as loaded
from .module import _f32, _ptr


def fp8_quantize(x: Any, scale: float) -> Any:
    """``x / scale`` saturated to +-448 and rounded to float8_e4m3fn, on x's GPU: the fp8
    mode's stored cache, bit for bit what ``speckv.predictors.calibration.fp8_quantize`` makes."""
    import torch

    module, stream = loaded._module(x)
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

    module, stream = loaded._module(pred)
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

    module, stream = loaded._module(sigma)
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

    module, stream = loaded._module(mu)
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


#: rows (batch x tokens) one thread of the statistics kernel sums before its atomic adds
STATS_ROWS = 64


def channel_sums(t: Any, p: Any, p8: Any, q: Any, scale: float) -> np.ndarray:
    """Exact per-channel calibration sums of a cache ``t`` ``[..., heads, tokens, dim]`` on the
    GPU (``cuda/speckv_stats.cuh``), with the predictions ``p`` (bf16 mode) and ``p8`` (fp8
    mode, cache units), ``q`` the cache quantised to fp8 (fp8 units) and the fp8 scale:
    ``_speckv.channel_sums``' limbs bit for bit, ``uint64 [3, heads * dim, 3]`` on the host."""
    import torch

    module, stream = loaded._module(t)
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
