"""What encoder and decoder code one layer's K or V with, from one calibration: the stored
tensor, the prediction in the stored dtype's units (``mu``), the sigma codes, and the joint
model; computed where the tensors are (``kernels``), the same bits on every machine.

What is coded uses integer sigma codes (``coding``): torch's vectorised float32 sqrt is not
always correctly rounded, so the float sigmas ``measured`` returns (for ideal code lengths)
could differ by an ulp from machine to machine and never reach the coder.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _api
from ..predictors.calibration import Calibration
from .joint_models import JointModels, joint_layers
from .kernels import CUDA, HOST, CudaKernels, HostKernels, kernels_for
from .modes import MODES, joint_key
from .target import Target

# sigma floor: a channel the predictor got exactly right in calibration still needs a scale
SIGMA_FLOOR = 1e-6


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

    def kernels(self, t: torch.Tensor) -> HostKernels | CudaKernels:
        """Where ``t``'s parameters are computed (``kernels.kernels_for``)."""
        return kernels_for(t, self.device)

    def _fp8_scale(self, mode: str, layer: int, kv: int) -> float | None:
        return float(self.calibration.fp8_scales[layer, kv]) if mode == "fp8" else None

    def stored(self, mode: str, layer: int, kv: int, true: torch.Tensor, on_device: bool = False) -> torch.Tensor:
        """One layer's K or V as `mode` stores it, on the host (``on_device``: on its GPU)."""
        return self.kernels(true).stored(true, MODES[mode], self._fp8_scale(mode, layer, kv), on_device)

    def mu(
        self, mode: str, layer: int, kv: int, pred: torch.Tensor, joint: bool = False, on_device: bool = False
    ) -> torch.Tensor:
        """The prediction in the stored dtype's units, float32; with the joint model, times its
        per-channel gain. On a GPU the CUDA module computes the same bits and only the result
        crosses (``on_device``: it stays on the GPU, for the GPU coder)."""
        cal = self.calibration
        gain = None
        if joint and layer in self.joint_layers and "scale" in cal.joint[joint_key(mode)]:
            heads, dim = pred.shape[1], pred.shape[3]
            gain = cal.joint[joint_key(mode)]["scale"][layer, kv * heads * dim : (kv + 1) * heads * dim]
            gain = gain.reshape(heads, dim)
        return self.kernels(pred).mu(pred, self._fp8_scale(mode, layer, kv), gain, on_device)

    def sigma_parts(
        self, mode: str, layer: int, kv: int, joint: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-channel ``[heads, dim]`` sigma (floored) and relative sigma (None if none)."""
        cal = self.calibration
        sigma, rel = (cal.sigma_fp8, cal.sigma_rel_fp8) if mode == "fp8" else (cal.sigma, cal.sigma_rel)
        if joint and layer in self.joint_layers:
            # the conditional sigma given the channels coded before (JointFit)
            sigma = cal.joint[joint_key(mode)]["sigma"]
        r = rel[layer, kv].float() if rel is not None and bool(rel[layer, kv].any()) else None
        return sigma[layer, kv].clamp(min=SIGMA_FLOOR), r

    def measured(
        self, mode: str, layer: int, kv: int, true: torch.Tensor | None, pred: torch.Tensor, joint: bool = False
    ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """(stored tensor or None, mu, sigma as floats) of one layer's K or V in `mode`, for
        measuring (ideal code lengths); never what is coded (see the module docs)."""
        x = self.stored(mode, layer, kv, true) if true is not None else None
        mu = self.mu(mode, layer, kv, pred)
        s, r = self.sigma_parts(mode, layer, kv, joint)
        sigma = s[None, :, None, :]
        if r is not None:
            sigma = torch.sqrt(sigma * sigma + (r[None, :, None, :] * mu) ** 2)
        return x, mu, sigma

    def coding(
        self,
        mode: str,
        layer: int,
        kv: int,
        true: torch.Tensor | None,
        pred: torch.Tensor,
        joint: bool = False,
        on_device: bool = False,
    ) -> Target:
        """One layer's K or V in `mode` (``true``: None when decoding): exactly what encoder and
        decoder code with, on any machine. ``on_device``: all three stay on the GPU the cache
        and prediction are on (for the GPU coder)."""
        x = self.stored(mode, layer, kv, true, on_device) if true is not None else None
        mu = self.mu(mode, layer, kv, pred, joint, on_device)
        return Target(x, mu, self.sigma_codes(mode, layer, kv, mu, joint, on_device))

    def sigma_codes(
        self, mode: str, layer: int, kv: int, mu: torch.Tensor, joint: bool = False, on_device: bool = False
    ) -> Any:
        """Sigma codes: per channel (``[1, heads, 1, dim]``, to broadcast), or per scalar for a
        relative sigma, ``sqrt(s^2 + (r mu)^2)`` with correctly rounded float32 steps (the same
        codes on every machine). ``on_device``: a tensor where ``mu`` is (the per-scalar codes
        from the CUDA module's kernel for a GPU's ``mu``, the same integers)."""
        s, r = self.sigma_parts(mode, layer, kv, joint)
        if on_device and r is not None and mu.is_cuda:
            return CUDA.relative_codes(mu, s, r)
        if on_device:  # per channel; or a host mu (tests)
            return torch.from_numpy(self.sigma_codes(mode, layer, kv, mu, joint)).to(mu.device)
        if r is None:
            return _api.sigma_codes(s[None, :, None, :])
        return HOST.relative_codes(mu, s, r)

    def observed(self, mode: str, layer: int, which: int, stored: torch.Tensor) -> torch.Tensor:
        """What a layer-wise predictor observes of a stored tensor: its values in cache units
        (fp8 times its scale), float32. Encoder and decoder compute it from the same bits."""
        if mode == "fp8":
            return stored.float() * float(self.calibration.fp8_scales[layer, which])
        return stored.float()

    def joint_model(self, mode: str, which: int, tokens: int, outside: Any, layers: range) -> _api.Joint:
        """The joint model of a block's K (``which=0``) or V stream of ``layers``
        (``JointModels.model``), with the codec's token scale."""
        return self._joint_models.model(self.calibration, mode, which, tokens, outside, layers, self.token_scale)
