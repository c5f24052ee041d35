"""Calibration: how far the predictor usually is from the truth, per (layer, K/V, kv-head,
channel), and the fp8 scales of the cache, measured on calibration text and saved with
safetensors."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from .._speckv import PredictionMismatchError
from .cache import KV, prefill
from .predictors import FP8_MAX, Predictor, describe

CALIBRATION_FORMAT = 1


class CalibrationMismatchError(PredictionMismatchError):
    """A calibration (or a stream) was made for another model, predictor or calibration."""


def _config_dict(model: Any) -> dict[str, Any]:
    config = model.config.to_dict()
    for volatile in ("_name_or_path", "transformers_version", "torch_dtype", "dtype", "_commit_hash", "name_or_path"):
        config.pop(volatile, None)
    return config


def model_fingerprint(model: Any) -> str:
    """BLAKE2b of the model's config and of every parameter's bytes (so the same weights in
    another dtype, or other weights, give another fingerprint)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps(_config_dict(model), sort_keys=True, default=str).encode())
    for name, p in model.named_parameters():
        t = p.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def fp8_quantize(x: torch.Tensor, scale: float) -> torch.Tensor:
    """The cache as vLLM stores it in fp8: ``x / scale`` rounded to float8_e4m3fn, saturated."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


@dataclass
class Calibration:
    """Per-channel statistics of the prediction error.

    ``sigma[l, kv, h, d]``: RMS of ``true - predicted`` in cache units (bf16/fp16 modes).
    ``sigma_fp8[l, kv, h, d]``: RMS of ``fp8(true / s) - predicted / s`` in fp8 units.
    ``fp8_scales[l, kv]``: ``s``, the per-layer, per-K/V scale (absmax / 448).
    ``means[l, kv, h, d]``: mean of the true cache (the channel-stats predictor's guess).
    """

    sigma: torch.Tensor
    sigma_fp8: torch.Tensor
    fp8_scales: torch.Tensor
    means: torch.Tensor
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def n_layers(self) -> int:
        return int(self.sigma.shape[0])

    def digest(self) -> str:
        h = hashlib.blake2b(digest_size=16)
        for t in (self.sigma, self.sigma_fp8, self.fp8_scales, self.means):
            h.update(t.float().contiguous().numpy().tobytes())
        h.update(json.dumps(self.metadata, sort_keys=True).encode())
        return h.hexdigest()

    def save(self, path: str) -> None:
        from safetensors.torch import save_file

        tensors = {
            "sigma": self.sigma.float().contiguous(),
            "sigma_fp8": self.sigma_fp8.float().contiguous(),
            "fp8_scales": self.fp8_scales.float().contiguous(),
            "means": self.means.float().contiguous(),
        }
        save_file(tensors, path, metadata={"speckv": json.dumps(self.metadata, sort_keys=True)})

    @classmethod
    def load(cls, path: str, model: Any = None, predictor: Predictor | None = None) -> Calibration:
        """Loads a calibration; with ``model`` (and ``predictor``), refuses one made for others."""
        from safetensors import safe_open
        from safetensors.torch import load_file

        tensors = load_file(path)
        with safe_open(path, framework="pt") as f:
            meta = json.loads((f.metadata() or {}).get("speckv", "{}"))
        if meta.get("format") != CALIBRATION_FORMAT:
            raise CalibrationMismatchError(f"{path}: not a speckv calibration (format {meta.get('format')!r})")
        cal = cls(tensors["sigma"], tensors["sigma_fp8"], tensors["fp8_scales"], tensors["means"], meta)
        if model is not None:
            cal.check(model_fingerprint(model), predictor)
        return cal

    def check(self, fingerprint: str, predictor: Predictor | None = None) -> None:
        if self.metadata.get("model_fingerprint") != fingerprint:
            raise CalibrationMismatchError(
                "calibration was made for another model "
                f"(fingerprint {self.metadata.get('model_fingerprint')}, this model {fingerprint})"
            )
        if predictor is not None and self.metadata.get("predictor") != describe(predictor):
            raise CalibrationMismatchError(
                f"calibration was made with predictor {self.metadata.get('predictor')}, not {describe(predictor)}"
            )


def calibrate(
    model: Any,
    predictor: Predictor,
    samples: Iterable[torch.Tensor],
    *,
    fingerprint: str,
    source: str = "",
    progress: bool = False,
) -> Calibration:
    """Measures a Calibration from prompts (``input_ids`` tensors of shape ``[1, seq]``)."""
    from .. import __version__

    samples = list(samples)
    if not samples:
        raise ValueError("samples: at least one calibration prompt is needed")
    iterator: Iterable[torch.Tensor] = samples
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(samples, desc="calibrating", unit="prompt")
    pairs: list[tuple[KV, KV]] = []
    tokens = 0
    with torch.no_grad():
        for ids in iterator:
            true = prefill(model, ids)
            pairs.append((true, predictor.predict(ids)))
            tokens += ids.numel()
    n_layers = len(pairs[0][0])
    heads, dim = pairs[0][0][0][0].shape[1], pairs[0][0][0][0].shape[3]
    sq = torch.zeros(n_layers, 2, heads, dim, dtype=torch.float64)
    total = torch.zeros_like(sq)
    amax = torch.zeros(n_layers, 2, dtype=torch.float64)
    count = 0
    for true, pred in pairs:
        count += true[0][0].shape[0] * true[0][0].shape[2]
        for layer, ((tk, tv), (pk, pv)) in enumerate(zip(true, pred)):
            for kv, (t, p) in enumerate(((tk, pk), (tv, pv))):
                t64 = t.double()
                sq[layer, kv] += ((t64 - p.double()) ** 2).sum(dim=(0, 2))
                total[layer, kv] += t64.sum(dim=(0, 2))
                amax[layer, kv] = max(amax[layer, kv], t64.abs().max())
    scales = (amax / FP8_MAX).clamp(min=1e-12).float()
    sq8 = torch.zeros_like(sq)
    for true, pred in pairs:
        for layer, ((tk, tv), (pk, pv)) in enumerate(zip(true, pred)):
            for kv, (t, p) in enumerate(((tk, pk), (tv, pv))):
                s = float(scales[layer, kv])
                q = fp8_quantize(t, s).double()
                sq8[layer, kv] += ((q - p.double() / s) ** 2).sum(dim=(0, 2))
    metadata = {
        "format": CALIBRATION_FORMAT,
        "model_fingerprint": fingerprint,
        "predictor": describe(predictor),
        "speckv_version": __version__,
        "samples": len(samples),
        "tokens": tokens,
        "source": source,
    }
    return Calibration(
        sigma=(sq / count).sqrt().float(),
        sigma_fp8=(sq8 / count).sqrt().float(),
        fp8_scales=scales,
        means=(total / count).float(),
        metadata=metadata,
    )
