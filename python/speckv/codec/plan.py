"""The coding plan: what one container's layers are coded with, built once per container and
read by the encode and decode walks.

* ``CodingParams``: one calibration's parameters, with the codec's device, token scale and
  joint-model arrays; it makes plans, and the float sigmas that ``evaluate`` measures.
* ``LayerPlan``: one layer's K and V parameters that do not depend on the prediction (fp8
  scale, joint gain, floored and relative sigma, the per-channel sigma codes), built once per
  layer of a container.
* ``CodingPlan``: a container's choices (storage mode, joint model, residual model, threads,
  layer-wise walk, GPU coder) and its layers' plans; ``target`` turns a layer's prediction
  into exactly what is coded, on the host or on a GPU (``kernels``).

What is coded uses integer sigma codes: torch's vectorised float32 sqrt is not always
correctly rounded, so the float sigmas ``measured`` returns (for ideal code lengths) could
differ by an ulp from machine to machine and never reach the coder.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import numpy as np
import torch

from .. import _api
from .._speckv import CorruptStreamError
from ..container import Container
from ..predictors.calibration import Calibration
from .kernels import CudaKernels, HostKernels, kernels_for
from .modes import MODES, joint_key
from .target import SideParams, Target

# sigma floor: a channel the predictor got exactly right in calibration still needs a scale
SIGMA_FLOOR = 1e-6


def joint_layers(cal: Calibration) -> set[int]:
    """Layers the calibration has a joint residual model for."""
    if not cal.joint:
        return set()
    return {int(layer) for layer in cal.metadata.get("joint", {}).get("layers", [])}


# the joint model's integer form, per layer: residual scales, int16 coefficients, units
_Form = tuple[np.ndarray, np.ndarray, np.ndarray]


class JointModels:
    """Builds ``speckv.Joint`` models (the joint residual model as the core takes it: README,
    "Joint model") from one calibration at a time, with its arrays copied once (contiguous
    float32): a walk asks for one per block and group of layers."""

    def __init__(self) -> None:
        self._source: Calibration | None = None
        # per (mode, K or V): channels, coefficients, offsets, the integer form's arrays
        self._arrays: dict[tuple[str, int], tuple[int, np.ndarray, np.ndarray, _Form]] = {}

    def model(
        self,
        cal: Calibration,
        mode: str,
        which: int,
        tokens: int,
        outside: Any,
        layers: range,
        token_scale: _api.TokenScale | None,
        integer: bool,
    ) -> _api.Joint:
        """The joint model of a block's K (``which=0``) or V stream of ``layers``: the
        calibration's coefficients of those layers (zero for layers without one), V
        conditioned on the block's K residuals of the same layers ``outside`` (``[layers,
        channels, tokens]``); ``integer``: with its integer form (``speckv.joint_integer``,
        from each channel's calibrated sigma)."""
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
            # the integer form's scales from each source channel's sigma (K's, then V's own)
            sigma = np.ascontiguousarray(m["sigma"].reshape(len(coef), -1)[:, cols].numpy(), dtype=np.float32)
            scale, a, unit = _api.joint_integer(c, coef, sigma)
            form = (scale.reshape(len(coef), -1), a.reshape(len(coef), -1), unit.reshape(len(coef), -1))
            self._arrays[key] = (c, coef, offset, form)
        c, coef, offset, form = self._arrays[key]
        coef, offset = coef[layers.start : layers.stop], offset[layers.start : layers.stop]
        # each layer's rows of the integer form, flat (contiguous: whole layers of each array)
        span = slice(layers.start, layers.stop)
        ints = (form[0][span].reshape(-1), form[1][span].reshape(-1), form[2][span].reshape(-1)) if integer else None
        return _api.Joint(c, tokens, coef, offset, outside if which == 1 else None, token_scale, ints)


class LayerPlan(NamedTuple):
    """One layer's coding parameters (K then V), built once per layer of a container."""

    layer: int
    sides: tuple[SideParams, SideParams]


class CodingParams:
    """One calibration's coding parameters. ``device``: where those of CUDA tensors are
    computed (None: on the GPU where the CUDA module runs, else on the host; "cpu": always on
    the host; "cuda": on the GPU). ``token_scale``: the joint model's adaptive token scale.
    ``joint_models``: the codec's cache of joint-model arrays."""

    def __init__(
        self,
        calibration: Calibration,
        device: str | None,
        token_scale: _api.TokenScale | None,
        joint_models: JointModels,
    ) -> None:
        self.calibration = calibration
        self.device = device
        self.token_scale = token_scale
        self._joint_models = joint_models
        self.joint_layers = joint_layers(calibration)
        self._layers: dict[tuple[str, int, bool], LayerPlan] = {}

    def plan(
        self,
        mode: str,
        *,
        joint: bool,
        threads: int | None,
        model: _api.Model = "exact",
        layerwise: bool = False,
        reading: bool = False,
    ) -> CodingPlan:
        """The plan of a container in ``mode`` (``joint``: coded with the joint model, where
        the calibration has one; ``reading``: a decoder's, ``reading``)."""
        if mode not in MODES:
            raise ValueError(f"dtype: expected one of {sorted(MODES)}, got {mode!r}")
        joint = joint and bool(self.joint_layers)
        return CodingPlan(self, mode, joint, _api.resolve_threads(threads), model, layerwise, reading=reading)

    def reading(self, c: Container, threads: int | None, layerwise: bool) -> CodingPlan:
        """The plan a container was coded with, as its metadata says (the calibration, already
        checked to be the encoder's, must have the joint model if it was coded with one)."""
        joint = bool(c.metadata.get("joint"))
        if joint and not self.joint_layers:
            raise CorruptStreamError("cache container: joint coding without a joint calibration")
        return self.plan(c.metadata["mode"], joint=joint, threads=threads, layerwise=layerwise, reading=True)

    def layer(self, mode: str, layer: int, joint: bool) -> LayerPlan:
        """Layer ``layer``'s parameters in ``mode`` (``joint``: the joint model's gain and
        conditional sigma where the calibration has them for this layer), built once."""
        key = (mode, layer, joint)
        got = self._layers.get(key)
        if got is None:
            got = self._layers[key] = self._layer(mode, layer, joint)
        return got

    def _layer(self, mode: str, layer: int, joint: bool) -> LayerPlan:
        cal = self.calibration
        joint = joint and layer in self.joint_layers
        model = cal.joint.get(joint_key(mode), {}) if joint else {}
        sigma, rel = (cal.sigma_fp8, cal.sigma_rel_fp8) if mode == "fp8" else (cal.sigma, cal.sigma_rel)
        if joint:
            # the conditional sigma given the channels coded before (JointFit)
            sigma = model["sigma"]
        sides = []
        for kv in (0, 1):
            s = sigma[layer, kv].clamp(min=SIGMA_FLOOR)
            r = rel[layer, kv].float() if rel is not None and bool(rel[layer, kv].any()) else None
            codes = _api.sigma_codes(s[None, :, None, :]) if r is None else None
            scale = float(cal.fp8_scales[layer, kv]) if mode == "fp8" else None
            gain = None
            if "scale" in model:
                # this side's channels of the layer's K-then-V gains
                heads, dim = s.shape
                gain = model["scale"][layer, kv * heads * dim : (kv + 1) * heads * dim].reshape(heads, dim)
            sides.append(SideParams(scale, gain, s, r, codes))
        return LayerPlan(layer, (sides[0], sides[1]))

    def measured(
        self, mode: str, layer: int, kv: int, true: torch.Tensor | None, pred: torch.Tensor, joint: bool = False
    ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """(stored tensor or None, mu, sigma as floats) of one layer's K or V in `mode`, for
        measuring (ideal code lengths); never what is coded (see the module docs). ``mu`` is
        the prediction's, without the joint model's gain."""
        side = self.layer(mode, layer, joint).sides[kv]
        x = None
        if true is not None:
            x = kernels_for(true, self.device).stored(true, MODES[mode], side.fp8_scale, False)
        mu = kernels_for(pred, self.device).mu(pred, side.fp8_scale, None, False)
        sigma = side.sigma[None, :, None, :]
        if side.rel is not None:
            sigma = torch.sqrt(sigma * sigma + (side.rel[None, :, None, :] * mu) ** 2)
        return x, mu, sigma

    def joint_model(self, mode: str, which: int, tokens: int, outside: Any, layers: range, integer: bool) -> _api.Joint:
        """The joint model of a block's K (``which=0``) or V stream of ``layers``
        (``JointModels.model``), with the codec's token scale."""
        return self._joint_models.model(
            self.calibration, mode, which, tokens, outside, layers, self.token_scale, integer
        )


class ParamsCache:
    """A codec's ``CodingParams``: one object while the calibration, device and token scale
    stay, so each layer's parameters are built once per codec, not once per container (~5%
    of a restore), and the joint model's arrays copied once (``JointModels``)."""

    def __init__(self) -> None:
        self._made: CodingParams | None = None
        self._joint_models = JointModels()

    def get(self, cal: Calibration, device: str | None, token_scale: _api.TokenScale | None) -> CodingParams:
        made = self._made
        if made is None or made.calibration is not cal or (made.device, made.token_scale) != (device, token_scale):
            made = self._made = CodingParams(cal, device, token_scale, self._joint_models)
        return made


@dataclasses.dataclass
class CodingPlan:
    """What one container is coded with: made once (``CodingParams.plan`` to encode,
    ``CodingParams.reading`` to decode) and handed to the walks, which ask it for each layer's
    ``Target`` once and for each block's joint model."""

    params: CodingParams
    # the storage mode ("bf16", "fp16", "fp8")
    mode: str
    # coded with the joint model (the calibration has one)
    joint: bool
    # threads the coder runs on (resolved: the bytes never depend on it)
    threads: int
    # the residual model the encoder codes with (a decoder reads it from each stream)
    model: _api.Model = "exact"
    # the predictor walks the layers (a chunk per layer)
    layerwise: bool = False
    # the GPU coder codes this cache (``kernels.CudaKernels``): set by the encoder's walk
    on_device: bool = False
    # a decoder's plan (``CodingParams.reading``): each stream says how it was coded
    reading: bool = False
    _layers: dict[int, LayerPlan] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def joint_layers(self) -> set[int]:
        """Layers coded with the joint model."""
        return self.params.joint_layers if self.joint else set()

    def layer(self, layer: int) -> LayerPlan:
        """Layer ``layer``'s parameters, built on first use and kept for the container."""
        got = self._layers.get(layer)
        if got is None:
            got = self._layers[layer] = self.params.layer(self.mode, layer, self.joint)
        return got

    def _kernels(self, t: torch.Tensor) -> HostKernels | CudaKernels:
        return kernels_for(t, self.params.device)

    def stored(self, layer: int, which: int, true: torch.Tensor) -> torch.Tensor:
        """One layer's K (``which=0``) or V as the mode stores it, on the host (with
        ``on_device``: on its GPU)."""
        side = self.layer(layer).sides[which]
        return self._kernels(true).stored(true, MODES[self.mode], side.fp8_scale, self.on_device)

    def target(self, layer: int, which: int, pred: torch.Tensor, true: torch.Tensor | None = None) -> Target:
        """One layer's K or V (``true``: None when decoding) as the coder takes it: the stored
        tensor, ``mu`` (the prediction in the stored dtype's units, float32, times the joint
        model's gain; on a GPU the CUDA module computes the same bits) and the sigma codes
        (per channel, ``[1, heads, 1, dim]``; or per scalar for a relative sigma,
        ``sqrt(s^2 + (r mu)^2)`` with correctly rounded float32 steps). The same on any
        machine; with ``on_device`` all three stay on the GPU (for the GPU coder)."""
        side = self.layer(layer).sides[which]
        return self._kernels(pred).target(side, MODES[self.mode], pred, true, self.on_device)

    def observed(self, layer: int, which: int, stored: torch.Tensor) -> torch.Tensor:
        """What a layer-wise predictor observes of a stored tensor: its values in cache units
        (fp8 times its scale), float32. Encoder and decoder compute it from the same bits."""
        scale = self.layer(layer).sides[which].fp8_scale
        return stored.float() * scale if scale is not None else stored.float()

    def joint_model(self, which: int, tokens: int, outside: Any, layers: range) -> _api.Joint:
        """The joint model of a block's K (``which=0``) or V stream of ``layers``, V
        conditioned on the same block's K residuals ``outside``. With its integer form (the
        sums in exact integers, ~3x faster) where the bins model codes (the GPU coder, which
        codes the exact model, computes the float form's sums) and for a decoder (a stream
        says which form it was coded in)."""
        integer = self.reading or (self.model == "bins" and not self.on_device)
        return self.params.joint_model(self.mode, which, tokens, outside, layers, integer)
