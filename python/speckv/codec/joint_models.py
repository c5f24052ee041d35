"""The joint residual model as the core takes it (``speckv.Joint``): from a calibration's
coefficients, per storage mode, K or V, the layers of a stream and a block's tokens, V
conditioned on the same block's K residuals (README, "Joint model")."""

from __future__ import annotations

from typing import Any

import numpy as np

from .. import _api
from ..predictors.calibration import Calibration
from .modes import joint_key


def joint_layers(cal: Calibration) -> set[int]:
    """Layers the calibration has a joint residual model for."""
    if not cal.joint:
        return set()
    return {int(layer) for layer in cal.metadata.get("joint", {}).get("layers", [])}


class JointModels:
    """Builds ``speckv.Joint`` models from one calibration at a time, with its arrays copied
    once (contiguous float32): a decode asks for them per layer and block."""

    def __init__(self) -> None:
        self._source: Calibration | None = None
        self._arrays: dict[tuple[str, int], tuple[int, np.ndarray, np.ndarray]] = {}

    def model(
        self,
        cal: Calibration,
        mode: str,
        which: int,
        tokens: int,
        outside: Any,
        layers: range,
        token_scale: _api.TokenScale | None,
    ) -> _api.Joint:
        """The joint model of a block's K (``which=0``) or V stream of ``layers``: the
        calibration's coefficients of those layers (zero for layers without one), V
        conditioned on the block's K residuals of the same layers ``outside`` (``[layers,
        channels, tokens]``)."""
        if self._source is not cal:
            # another calibration (holding it keeps its id from being reused by a new one)
            self._source, self._arrays = cal, {}
        key = (joint_key(mode), which)
        if key not in self._arrays:
            m = cal.joint[joint_key(mode)]
            c = m["coef"].shape[1] // 2
            rows = slice(0, c) if which == 0 else slice(c, 2 * c)
            cols = slice(0, c) if which == 0 else slice(0, 2 * c)
            coef = np.ascontiguousarray(m["coef"][:, rows, cols].numpy(), dtype=np.float32)
            offset = np.ascontiguousarray(m["offset"][:, rows].numpy(), dtype=np.float32)
            self._arrays[key] = (c, coef, offset)
        c, coef, offset = self._arrays[key]
        coef, offset = coef[layers.start : layers.stop], offset[layers.start : layers.stop]
        return _api.Joint(c, tokens, coef, offset, outside if which == 1 else None, token_scale)
