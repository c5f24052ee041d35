"""``Target``: one layer's K or V as the coder sees it (the stored tensor, its prediction in
the stored dtype's units, the sigma codes), made from the layer's ``SideParams`` (what the
coding plan holds of it), and the cuts the container walks make of it: a block's tokens,
channel-major order for the joint model, several layers stacked."""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch


class SideParams(NamedTuple):
    """One layer's K or V parameters that do not depend on the prediction (``plan.LayerPlan``
    holds a layer's two), each ``[heads, dim]`` per channel."""

    # the fp8 mode's scale (cache units per fp8 unit), else None
    fp8_scale: float | None
    # the joint model's per-channel gain on mu, or None
    gain: torch.Tensor | None
    # sigma, floored (the joint model's conditional sigma where coded jointly)
    sigma: torch.Tensor
    # relative sigma, or None where the calibration has none
    rel: torch.Tensor | None
    # the per-channel sigma codes ``[1, heads, 1, dim]`` where there is no relative sigma
    codes: np.ndarray | None


class Target(NamedTuple):
    """One layer's K or V, ``[batch, heads, tokens, dim]``: exactly what encoder and decoder
    code with (``CodingPlan.target``)."""

    # the stored tensor (bf16 / fp16 / fp8 bits); None on the decoding side
    x: torch.Tensor | None
    # the prediction in the stored dtype's units, float32
    mu: torch.Tensor
    # int16 sigma codes, per channel (``[1, heads, 1, dim]``, broadcast) or per scalar: a numpy
    # array on the host, a tensor on the GPU (the GPU coder's)
    codes: Any


def cut_tokens(job: Target, start: int, stop: int) -> Target:
    """Tokens ``start:stop`` of one layer's target; per-channel codes (one token long) go to
    every block as they are."""
    x, mu, codes = job
    if start == 0 and stop >= mu.shape[2]:
        return job
    if start >= stop:
        start = stop = 0  # an empty run (a layer that holds none of a block's tokens)
    if codes.shape[2] != 1:
        codes = codes[:, :, start:stop]
    return Target((x[:, :, start:stop] if x is not None else None), mu[:, :, start:stop], codes)


def channel_major(job: Target) -> Target:
    """One layer's target ``[batch, heads, tokens, dim]`` as ``[batch, heads, dim, tokens]``:
    the joint model codes a channel's tokens one after another."""
    x, mu, codes = job
    x = x.transpose(-1, -2) if x is not None else None
    codes = codes.transpose(-1, -2) if isinstance(codes, torch.Tensor) else np.swapaxes(codes, -1, -2)
    return Target(x, mu.transpose(-1, -2), codes)


def block_of(targets: list[Target], start: int, stop: int, joint: bool) -> Target:
    """Tokens ``start:stop`` of layers' targets, stacked (``stack``); channel-major for the
    joint model (``joint``)."""
    part = [cut_tokens(t, start, stop) for t in targets]
    return stack([channel_major(t) for t in part] if joint else part)


def stack(targets: list[Target]) -> Target:
    """Per-layer targets stacked along a new leading layer dimension (codes per scalar where
    any layer's are)."""
    if len(targets) == 1:
        # views, not copies: a walk's step decodes one layer (the coder reads them contiguous
        # or copies them itself)
        x, mu, codes = targets[0]
        return Target(None if x is None else x[None], mu[None], codes[None])
    xs = [t.x for t in targets]
    x = torch.stack(xs) if xs[0] is not None else None  # type: ignore[arg-type]
    mu = torch.stack([t.mu for t in targets])
    codes = [t.codes for t in targets]
    if isinstance(codes[0], torch.Tensor):  # on the GPU (the GPU coder's)
        if any(c.shape != codes[0].shape for c in codes):
            codes = [c.expand(t.mu.shape) for c, t in zip(codes, targets)]
        return Target(x, mu, torch.stack(codes))
    if any(c.shape != codes[0].shape for c in codes):
        codes = [np.broadcast_to(c, tuple(t.mu.shape)) for c, t in zip(codes, targets)]
    return Target(x, mu, np.stack(codes))
