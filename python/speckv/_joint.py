"""The joint residual model as the core takes it: its arrays (``Joint``), its integer form
(``joint_integer``) and the adaptive token scale (``TokenScale``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _speckv

_EMPTY = np.zeros(0, np.float32)


@dataclass(frozen=True)
class TokenScale:
    """The adaptive token scale of a jointly coded stream (``rust/speckv/src/token_scale.rs``):
    channel ``i`` of a token is coded with its sigma times ``sqrt((prior + E) / (prior + i))``,
    ``E`` the sum over the token's channels coded before it of their squared standardised
    residuals, each at most ``clamp``. A token whose residuals run large gets wider
    distributions for its remaining channels. Both knobs are 1..255; the stream records them."""

    prior: int = 4
    clamp: int = 25

    def args(self) -> tuple[int, int]:
        for name, v in (("prior", self.prior), ("clamp", self.clamp)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 1 <= v <= 255:
                raise ValueError(f"token scale: {name} must be an int in 1..255, got {v!r}")
        return int(self.prior), int(self.clamp)


DEFAULT_TOKEN_SCALE = TokenScale()


@dataclass(frozen=True)
class Joint:
    """The joint residual model of one stream (the maths and its exactness rule are in
    ``rust/speckv/src/joint.rs``): the tensor is whole layers of ``channels`` x ``tokens``
    scalars, channel-major, and channel ``i`` of a token is coded against ``mu`` plus
    ``offset[i]`` plus ``coef[i]`` times the residuals coded before it (the ``outside``
    channels, then channels ``0..i``). Chunks must hold whole layers.

    ``coef``: ``[layers, channels, outside_channels + channels]``; ``offset``: ``[layers,
    channels]``; ``outside``: ``[layers, outside_channels, tokens]`` residuals (``residuals``)
    or None. ``token_scale``: how `encode` adapts each token's sigmas (`TokenScale`; None
    keeps the calibrated sigmas); the stream records it, so `decode` ignores this field.
    ``integer``: the same model's integer form (`joint_integer`), or None: `encode` then
    computes the sums in it (exact integers, ~3x faster than float32's) and the stream records
    that; `decode` follows the stream, and needs it for a stream coded so."""

    channels: int
    tokens: int
    coef: Any
    offset: Any
    outside: Any = None
    token_scale: TokenScale | None = DEFAULT_TOKEN_SCALE
    integer: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def args(self) -> tuple[Any, ...]:
        # no copies for C-contiguous float32 arrays (a decode builds one per layer and block)
        flat = [np.ascontiguousarray(a, dtype=np.float32).reshape(-1) for a in (self.coef, self.offset)]
        outside = _EMPTY if self.outside is None else np.asarray(self.outside, np.float32)
        width = np.shape(self.coef)[-1] if np.ndim(self.coef) else 0
        e = int(width) - int(self.channels)
        outside = np.ascontiguousarray(outside).reshape(-1)
        return (int(self.channels), int(self.tokens), e, outside, *flat, self._integer())

    def _integer(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """``integer`` as the core takes it (flat, contiguous), its types checked: what
        ``joint_integer`` returns, never silently converted."""
        if self.integer is None:
            return None
        if not isinstance(self.integer, tuple) or len(self.integer) != 3:
            raise TypeError("joint: integer: expected (scales, coefficients, units) as speckv.joint_integer returns")
        parts = []
        kinds = ((np.float32, "scales"), (np.int16, "coefficients"), (np.float32, "units"))
        for part, (want, name) in zip(self.integer, kinds):
            arr = np.asarray(part)
            if arr.dtype != want:
                raise TypeError(f"joint: integer {name}: expected {np.dtype(want).name}, got {arr.dtype}")
            parts.append(np.ascontiguousarray(arr).reshape(-1))
        return (parts[0], parts[1], parts[2])


def joint_integer(channels: int, coef: Any, sigma: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A joint model's integer form (``Joint.integer``; the rule is in
    ``rust/speckv/src/joint_integer.rs``): ``coef`` as ``Joint`` takes it (``[layers,
    channels, outside + channels]``) and each source channel's residual sigma (``[layers,
    outside + channels]``: the outside channels', then the stream's own) into flat arrays of
    residual scales, int16 coefficients and units."""
    width = int(np.shape(coef)[-1])
    return _speckv.joint_integer(
        int(channels),
        width - int(channels),
        np.ascontiguousarray(coef, dtype=np.float32).reshape(-1),
        np.ascontiguousarray(sigma, dtype=np.float32).reshape(-1),
    )


def token_scale_args(joint: Joint | None) -> tuple[int, int] | None:
    if joint is None or joint.token_scale is None:
        return None
    if not isinstance(joint.token_scale, TokenScale):
        raise TypeError(f"token_scale: expected speckv.TokenScale or None, got {type(joint.token_scale).__name__}")
    return joint.token_scale.args()
