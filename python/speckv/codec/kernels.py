"""The seam between the host and the GPU: the few steps that turn a cache and its prediction
into coded bytes (quantise to fp8, the coder's ``mu``, per-scalar sigma codes, the coder
itself), each with the same bits on either side (``cuda/README.md``).

``HostKernels`` runs them on the CPU; ``CudaKernels`` on the GPU a tensor is on, through
``speckv.cuda``, handing back host tensors unless told to keep them where they are (for the
GPU coder). ``kernels_for`` picks one from a tensor and the codec's ``device`` setting; the
codec's walks call the seam and never branch on the device themselves.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .. import _api, _speckv
from .. import cuda as speckv_cuda
from ..predictors.calibration import fp8_quantize
from .target import SideParams, Target


class HostKernels:
    """The steps on the host (tensors on a GPU are copied over first)."""

    on_gpu = False

    def target(
        self, side: SideParams, dtype: torch.dtype, pred: torch.Tensor, true: torch.Tensor | None, keep: bool
    ) -> Target:
        """One layer's K or V as the coder takes it (``CodingPlan.target``): ``true`` stored
        (None when decoding), ``pred`` as ``mu`` and the sigma codes, from the layer's
        ``side``."""
        return _target(self, side, dtype, pred, true, keep)

    def stored(self, true: torch.Tensor, dtype: torch.dtype, fp8_scale: float | None, keep: bool) -> torch.Tensor:
        """``true`` as ``dtype`` stores it (``fp8_scale``: the fp8 mode's scale, else None)."""
        true = true.cpu()
        if true.dtype == dtype:
            # stored already (an engine's fp8 cache, with the calibration's scale): its bits
            return true
        if fp8_scale is not None:
            return fp8_quantize(true, fp8_scale)
        return true.to(dtype)

    def mu(self, pred: torch.Tensor, fp8_scale: float | None, gain: torch.Tensor | None, keep: bool) -> torch.Tensor:
        """The prediction in the stored dtype's units, float32, times the joint model's
        per-channel ``gain`` (``[heads, dim]``) where there is one: one correctly rounded
        float32 product per scalar, the same on every machine."""
        pred = pred.cpu()
        mu = pred.float() / fp8_scale if fp8_scale is not None else pred.float()
        if gain is not None:
            mu = mu * gain[None, :, None, :]
        return mu

    def relative_codes(self, mu: torch.Tensor, s: torch.Tensor, r: torch.Tensor) -> np.ndarray:
        """Per-scalar codes of ``sqrt(s^2 + (r mu)^2)`` (``s``, ``r``: ``[heads, dim]``),
        computed in Rust with correctly rounded float32 steps."""
        _, h, t, d = mu.shape
        m, sf, rf = (np.ascontiguousarray(a.numpy()).reshape(-1) for a in (mu, s, r))
        return _speckv.relative_sigma_codes(m, sf, rf, h, t, d).reshape(mu.shape)

    def encode(
        self,
        job: Target,
        joint: _api.Joint | None,
        chunk_size: int,
        threads: int | None,
        model: _api.Model,
        residuals: bool,
    ) -> tuple[bytes, Any]:
        """One stream of a stacked target (``speckv.encode``), and with ``residuals`` its
        residuals ``[layers, channels, tokens]`` (what a jointly coded V is conditioned on)."""
        x, mu, codes = job
        given = _api.residuals(x, mu).reshape(mu.shape[0], -1, mu.shape[-1]) if residuals else None
        data = _api.encode(x, mu, sigma_codes=codes, threads=threads, chunk_size=chunk_size, model=model, joint=joint)
        return data, given


class CudaKernels:
    """The steps on the GPU the tensors are on (``speckv.cuda``): the same bits as the
    host's; only results cross to the host, and with ``keep`` not even those."""

    on_gpu = True

    def target(
        self, side: SideParams, dtype: torch.dtype, pred: torch.Tensor, true: torch.Tensor | None, keep: bool
    ) -> Target:
        """``HostKernels.target`` on the GPU; with ``keep``, all three stay there (for the GPU
        coder)."""
        return _target(self, side, dtype, pred, true, keep)

    def stored(self, true: torch.Tensor, dtype: torch.dtype, fp8_scale: float | None, keep: bool) -> torch.Tensor:
        if fp8_scale is not None:
            stored = speckv_cuda.fp8_quantize(true, fp8_scale)
        else:
            stored = true.to(dtype)  # bf16 / fp16 from their own dtype: exact
        return stored if keep else stored.cpu()

    def mu(self, pred: torch.Tensor, fp8_scale: float | None, gain: torch.Tensor | None, keep: bool) -> torch.Tensor:
        if gain is None:
            mu = speckv_cuda.coding_mu(pred, fp8_scale)
            return mu if keep else mu.cpu()
        g = gain.to(pred.device)
        per_head = [speckv_cuda.coding_mu(pred[:, h : h + 1], fp8_scale, g[h]) for h in range(pred.shape[1])]
        mu = torch.cat(per_head, dim=1)
        return mu if keep else mu.cpu()

    def relative_codes(self, mu: torch.Tensor, s: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        parts = [
            speckv_cuda.relative_sigma_codes(mu[:, h : h + 1], s[h].to(mu.device), r[h].to(mu.device))
            for h in range(mu.shape[1])
        ]
        return torch.cat(parts, dim=1)

    def encode(
        self,
        job: Target,
        joint: _api.Joint | None,
        chunk_size: int,
        threads: int | None,
        model: _api.Model,
        residuals: bool,
    ) -> tuple[bytes, Any]:
        """The GPU coder (the exact model), the host's bytes; the residuals stay on the GPU."""
        x, mu, codes = job
        data, given = speckv_cuda.encode_joint(x, mu, codes, joint, chunk_size=chunk_size)
        return data, (given.reshape(mu.shape[0], -1, mu.shape[-1]) if residuals else None)


HOST = HostKernels()
CUDA = CudaKernels()


def _target(
    k: HostKernels | CudaKernels,
    side: SideParams,
    dtype: torch.dtype,
    pred: torch.Tensor,
    true: torch.Tensor | None,
    keep: bool,
) -> Target:
    """``target`` on either side: the stored tensor, ``mu`` and the sigma codes (per channel
    from the plan, or per scalar for a relative sigma: on the GPU where ``mu`` stays there,
    else on the host), each where ``mu`` is with ``keep``."""
    x = k.stored(true, dtype, side.fp8_scale, keep) if true is not None else None
    mu = k.mu(pred, side.fp8_scale, side.gain, keep)
    codes: Any
    if side.rel is None:
        assert side.codes is not None
        codes = side.codes
    elif keep and mu.is_cuda:
        return Target(x, mu, k.relative_codes(mu, side.sigma, side.rel))
    else:
        codes = HOST.relative_codes(mu.cpu(), side.sigma, side.rel)
    return Target(x, mu, torch.from_numpy(codes).to(mu.device) if keep else codes)


def kernels_for(t: torch.Tensor, device: str | None) -> HostKernels | CudaKernels:
    """Where ``t``'s coding parameters are computed, given the codec's ``device``: None uses
    the GPU when ``t`` is on one and the CUDA module runs, "cpu" always the host, "cuda" insists
    on the GPU for CUDA tensors."""
    if not t.is_cuda or device == "cpu":
        return HOST
    return CUDA if device == "cuda" or speckv_cuda.available() else HOST


def codes_on_gpu(kv: Any, prediction: Any, device: str | None) -> bool:
    """Whether the GPU coder (``speckv.cuda.encode``) codes this cache: it and its
    prediction (per layer ``(K, V)``) are on one GPU the CUDA module runs on (``device``: as
    ``kernels_for`` takes it)."""
    tensors = [t for pair in (*kv, *prediction) for t in pair]
    same_gpu = all(t.is_cuda and t.device == tensors[0].device for t in tensors)
    return same_gpu and kernels_for(tensors[0], device).on_gpu
