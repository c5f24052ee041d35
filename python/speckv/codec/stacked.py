"""A stacked container's decode call for one token block's K or V of a few layers: the call's
arguments (the stream cut to those layers, ``mu``, the sigma codes, the joint model) and the
tensors from its words; what the whole-prompt and layer-wise walks share."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from .. import _api, container
from .._speckv import CorruptStreamError
from .plan import CodingPlan
from .target import Target, block_of


def _stacked_job(
    plan: CodingPlan,
    c: container.Container,
    b: int,
    which: int,
    first: int,
    targets: list[Target],
    outside: dict[int, np.ndarray],
    offset: int = 0,
) -> tuple[Any, torch.Tensor, Any, Any]:
    """``decode_stacked``'s decode call before it is made: the stream's bytes, ``mu``, the
    sigma codes and the joint model (``offset``: the targets' first token, in the prompt)."""
    stop = first + len(targets)
    lo, hi = c.token_range(b)
    _, mu, codes = block_of(targets, lo - offset, hi - offset, plan.joint)
    data, shape = c.layers_of(b, first, stop, which)
    if shape != list(mu.shape):
        raise CorruptStreamError(
            f"cache container: block {b}'s stream does not hold layers {first}..{stop - 1} in whole chunks"
        )
    model = plan.joint_model(which, hi - lo, outside.get(b), range(first, stop)) if plan.joint else None
    return data, mu, codes, model


def _stacked_result(
    plan: CodingPlan,
    got: torch.Tensor,
    mu: torch.Tensor,
    b: int,
    which: int,
    layers: int,
    outside: dict[int, np.ndarray],
) -> list[torch.Tensor]:
    """``decode_stacked``'s tensors from its decode call's words (a jointly coded K leaves its
    residuals in ``outside[b]``)."""
    if plan.joint:
        if which == 0:
            outside[b] = _api.residuals(got, mu).reshape(layers, -1, got.shape[-1])
        got = got.transpose(-1, -2)
    return list(got)
