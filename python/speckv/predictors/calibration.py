"""Calibration: how far the predictor usually is from the truth, per (layer, K/V, kv-head,
channel), and the fp8 scales of the cache, measured on calibration text and saved with
safetensors."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from .. import __version__, _speckv
from .. import cuda as speckv_cuda
from .._speckv import PredictionMismatchError
from ..models.architecture import UnsupportedModelError
from ..models.cache import KV, last_tokens, other_kernels, prefill
from .base import FP8_MAX, AnyPredictor, describe
from .joint_fit import JOINT_SHRINKAGE, JointFit, pack_joint, unpack_joint
from .layerwise import is_layerwise, walk

CALIBRATION_FORMAT = 1
# the tensors every calibration file holds (sigma_rel*, predictor.* and joint.* are optional)
CALIBRATION_TENSORS = ("sigma", "sigma_fp8", "fp8_scales", "means")
# safetensors names of a learned predictor's tensors in a calibration file
PREDICTOR_PREFIX = "predictor."
# ... and of the joint residual model's ("joint.<mode>.<name>")
JOINT_PREFIX = "joint."


class CalibrationMismatchError(PredictionMismatchError):
    """A calibration (or a stream) was made for another model, predictor or calibration."""


def fingerprint_config(model: Any) -> dict[str, Any]:
    """The model's config as its fingerprint reads it: less where it was loaded from, the
    transformers version and the dtype (``model_cache.config_dict`` keeps those two)."""
    config = model.config.to_dict()
    for volatile in ("_name_or_path", "transformers_version", "torch_dtype", "dtype", "_commit_hash", "name_or_path"):
        config.pop(volatile, None)
    return config


def model_fingerprint(model: Any) -> str:
    """BLAKE2b of the model's config and of every parameter's bytes (so the same weights in
    another dtype, or other weights, give another fingerprint)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps(fingerprint_config(model), sort_keys=True, default=str).encode())
    for name, p in model.named_parameters():
        t = p.detach().cpu().contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _like(kv: list[tuple[torch.Tensor, torch.Tensor]], truth: KV) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """A prediction where the cache it predicts is: a GPU's prediction
    (``Fp8Predictor(device="cuda")``) of a GPU's cache stays there, and calibration sums it
    there (``_channel_sums``); otherwise on the host."""
    device = truth[0][0].device
    return [(k.to(device), v.to(device)) for k, v in kv]


def _channel_sums(t: torch.Tensor, p: torch.Tensor, p8: torch.Tensor, scale: float) -> list[list[int]]:
    """Exact per-channel sums (``rust/speckv/src/stats.rs``, invariant S1) of one layer's K or
    V ``t`` ``[batch, heads, tokens, dim]``: of its values, of ``(t - p)^2`` and of ``(q - p8 /
    scale)^2`` with ``q`` the fp8 mode's stored values; as Python integers in units of 2^-64,
    per statistic and channel ``(head, dim)``. On a GPU the CUDA module sums them where the
    tensors are, to the same integers."""
    if t.is_cuda and p.device == t.device and p8.device == t.device and speckv_cuda.available():
        q = speckv_cuda.fp8_quantize(t, scale).float()
        limbs = speckv_cuda.channel_sums(t, p, p8, q, scale)
    else:
        flat = [a.detach().cpu().float().contiguous().reshape(-1).numpy() for a in (t, p, p8)]
        q = fp8_quantize(t.detach().cpu(), scale).float().reshape(-1).numpy()
        _, heads, tokens, dim = t.shape
        limbs = _speckv.channel_sums(flat[0], flat[1], flat[2], q, scale, (heads, tokens, dim)).reshape(3, -1, 3)
    out = []
    for stat in limbs.tolist():
        row = []
        for low, mid, high in stat:
            value = low | mid << 64 | high << 128
            row.append(value - (1 << 192) if value >> 191 else value)  # two's complement
        out.append(row)
    return out


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
    ``predictor_state``: what a learned predictor fitted during calibration (e.g. the maps of
    ``ModelPrefixPredictor``), saved alongside and given back to it by ``SpeculativeCodec``.
    ``sigma_rel`` / ``sigma_rel_fp8`` (optional, same shape as ``sigma``): a part of the error
    proportional to the prediction, for layers whose prediction is the model's own computation
    under other kernels (errors of a few ulps: relative, not absolute). Where given, a
    scalar's sigma is ``sqrt(sigma^2 + (sigma_rel * mu)^2)``.
    """

    sigma: torch.Tensor
    sigma_fp8: torch.Tensor
    fp8_scales: torch.Tensor
    means: torch.Tensor
    metadata: dict[str, Any] = field(default_factory=dict)
    predictor_state: dict[str, torch.Tensor] = field(default_factory=dict)
    sigma_rel: torch.Tensor | None = None
    sigma_rel_fp8: torch.Tensor | None = None
    # the joint residual model per storage mode ("bf16", "fp8"; see JointFit): "coef"
    # [layers, C, C] (C = 2 x heads x dim: a layer's K channels then its V channels, strictly
    # lower-triangular), "offset" [layers, C], "sigma" [layers, 2, heads, dim] (conditional)
    joint: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    # the JointFit statistics of a fresh calibration, per mode (not saved): to solve other
    # structures from (``speckv eval --ablate``)
    joint_fits: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    # digest() hashes every tensor (the maps are megabytes) and is asked for on every
    # compress and decompress: computed once. A Calibration is not to be changed in place.
    _digest: str | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def n_layers(self) -> int:
        return int(self.sigma.shape[0])

    def digest(self) -> str:
        if self._digest is None:
            self._digest = self._compute_digest()
        return self._digest

    def _compute_digest(self) -> str:
        h = hashlib.blake2b(digest_size=16)
        for t in (self.sigma, self.sigma_fp8, self.fp8_scales, self.means):
            h.update(t.float().contiguous().numpy().tobytes())
        for name, rel in (("sigma_rel", self.sigma_rel), ("sigma_rel_fp8", self.sigma_rel_fp8)):
            if rel is not None:
                h.update(name.encode())
                h.update(rel.float().contiguous().numpy().tobytes())
        for name in sorted(self.predictor_state):
            h.update(name.encode())
            h.update(self.predictor_state[name].float().contiguous().numpy().tobytes())
        for mode in sorted(self.joint):
            for name in sorted(self.joint[mode]):
                h.update(f"joint.{mode}.{name}".encode())
                h.update(self.joint[mode][name].float().contiguous().numpy().tobytes())
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
        for name, t in (("sigma_rel", self.sigma_rel), ("sigma_rel_fp8", self.sigma_rel_fp8)):
            if t is not None:
                tensors[name] = t.float().contiguous()
        for name, t in self.predictor_state.items():
            tensors[PREDICTOR_PREFIX + name] = t.float().contiguous()
        for mode, parts in self.joint.items():
            for name, t in pack_joint(parts).items():
                tensors[f"{JOINT_PREFIX}{mode}.{name}"] = t.contiguous()
        save_file(tensors, path, metadata={"speckv": json.dumps(self.metadata, sort_keys=True)})

    @classmethod
    def load(cls, path: str, model: Any = None, predictor: AnyPredictor | None = None) -> Calibration:
        """Loads a calibration; with ``model`` (and ``predictor``), refuses one made for others."""
        from safetensors import SafetensorError, safe_open
        from safetensors.torch import load_file

        # a file that is not one (damaged, or another kind) is a typed error; a missing or
        # unreadable one stays the OSError it is
        try:
            tensors = load_file(path)
            with safe_open(path, framework="pt") as f:
                meta = json.loads((f.metadata() or {}).get("speckv", "{}"))
        except (SafetensorError, ValueError) as e:
            raise CalibrationMismatchError(f"{path}: not a speckv calibration file ({e})") from None
        if not isinstance(meta, dict) or meta.get("format") != CALIBRATION_FORMAT:
            found = meta.get("format") if isinstance(meta, dict) else None
            raise CalibrationMismatchError(f"{path}: not a speckv calibration (format {found!r})")
        missing = [name for name in CALIBRATION_TENSORS if name not in tensors]
        if missing:
            raise CalibrationMismatchError(f"{path}: a damaged speckv calibration (no {', '.join(missing)})")
        state = {k[len(PREDICTOR_PREFIX) :]: v for k, v in tensors.items() if k.startswith(PREDICTOR_PREFIX)}
        packed: dict[str, dict[str, torch.Tensor]] = {}
        for k, v in tensors.items():
            if k.startswith(JOINT_PREFIX):
                mode, _, name = k[len(JOINT_PREFIX) :].partition(".")
                packed.setdefault(mode, {})[name] = v
        try:
            joint = {mode: unpack_joint(parts) for mode, parts in packed.items()}
        except (KeyError, ValueError, RuntimeError, IndexError) as e:
            raise CalibrationMismatchError(f"{path}: a damaged speckv calibration (joint model: {e})") from None
        cal = cls(
            tensors["sigma"],
            tensors["sigma_fp8"],
            tensors["fp8_scales"],
            tensors["means"],
            meta,
            state,
            tensors.get("sigma_rel"),
            tensors.get("sigma_rel_fp8"),
            joint,
        )
        if model is not None:
            cal.check(model_fingerprint(model), predictor)
        return cal

    def check(self, fingerprint: str, predictor: AnyPredictor | None = None) -> None:
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
    predictor: AnyPredictor,
    samples: Iterable[torch.Tensor],
    *,
    fingerprint: str,
    source: str = "",
    progress: bool = False,
    producer: Callable[[Any, torch.Tensor], KV] | None = None,
    joint: bool = True,
    keep_joint_fits: bool = False,
    fp8_scale: float | None = None,
) -> Calibration:
    """Measures a Calibration from prompts (``input_ids`` tensors of shape ``[1, seq]``).

    A predictor with ``fit`` (``ModelPrefixPredictor``) has its maps fitted here, and its
    sigmas come from out-of-fold predictions. ``producer(model, input_ids)`` makes the true
    caches (default: ``prefill``). For a predictor that runs the model's own layers the
    default is ``other_kernels`` instead, so that the sigmas of those layers describe a cache
    made under other kernels (the usual case: another machine or engine made the cache)
    rather than the exact agreement of identical kernels, which would leave no room for a
    single differing bit. ``joint``: also fit the joint residual model (``JointFit``) for the
    layers whose sigma is not relative; ``keep_joint_fits``: keep its statistics on the result
    (``joint_fits``, hundreds of MB for a real model) to solve other structures from.
    ``fp8_scale``: one fp8 scale for every layer's K and V instead of each one's absmax / 448,
    for caches an engine stored in fp8 with that scale (vLLM's default: 1.0).
    """
    samples = list(samples)
    if not samples:
        raise ValueError("samples: at least one calibration prompt is needed")
    fits = callable(getattr(predictor, "fit", None))
    # a predictor that learns from the calibration caches themselves (ChannelStatsPredictor)
    learns = callable(getattr(predictor, "fit_from_caches", None))
    if producer is None:
        producer = other_kernels if callable(getattr(predictor, "prefix", None)) else prefill
    iterator: Iterable[torch.Tensor] = samples
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(samples, desc="calibrating", unit="prompt")
    truths: list[KV] = []
    whole: list[KV] = []
    tokens = 0
    with torch.no_grad():
        for ids in iterator:
            truths.append(producer(model, ids))
            if not fits and not learns:
                whole.append(
                    walk(predictor.start(ids), truths[-1], _as_float)
                    if is_layerwise(predictor)
                    else _like(predictor.predict(ids), truths[-1])
                )
            tokens += ids.numel()
    n_layers = len(truths[0])
    heads, dim = truths[0][0][0].shape[1], truths[0][0][0].shape[3]
    for layer, (keys, values) in enumerate(truths[0]):
        if (keys.shape[1], keys.shape[3], values.shape[1], values.shape[3]) != (heads, dim, heads, dim):
            raise UnsupportedModelError(
                f"layer {layer}: keys {tuple(keys.shape)} and values {tuple(values.shape)}; speckv's calibration needs "
                f"every layer's K and V to have layer 0's {heads} heads x {dim} channels"
            )
    amax = torch.zeros(n_layers, 2, dtype=torch.float64)
    # per layer: tokens summed over (a sliding-window layer holds fewer than the prompt)
    count = [0] * n_layers
    for true in truths:
        for layer, pair in enumerate(true):
            count[layer] += pair[0].shape[0] * pair[0].shape[2]
            for kv, t in enumerate(pair):
                amax[layer, kv] = max(amax[layer, kv], t.double().abs().max().cpu())  # exact anywhere
    scales = (amax / FP8_MAX).clamp(min=1e-12).float()
    if fp8_scale is not None:
        if not fp8_scale > 0:
            raise ValueError(f"fp8_scale: must be positive, got {fp8_scale}")
        scales = torch.full_like(scales, float(fp8_scale))
    if learns:
        learner: Any = predictor  # has fit_from_caches (above)
        learner.fit_from_caches(truths)
        whole = [_like(learner.predict(ids), truth) for ids, truth in zip(samples, truths)]
    if fits:
        preds = _fitted_predictions(predictor, samples, truths, scales, progress)
    else:
        preds = {"bf16": whole, "fp8": whole}
    # a prediction of every position, for layers that hold the last ones only
    preds = {mode: [_last_tokens(kv, true) for kv, true in zip(runs, truths)] for mode, runs in preds.items()}
    # per layer and K/V: exact sums of the values, (t - p)^2 and (q - p8 / s)^2 per channel
    # (`_channel_sums`), each rounded to float64 once at the end
    exact = [[[[0] * (heads * dim) for _ in range(3)] for _ in range(2)] for _ in range(n_layers)]
    # layers predicted by the model's own computation get a relative part of sigma
    relative = range(int(getattr(predictor, "layers", 0))) if callable(getattr(predictor, "prefix", None)) else range(0)
    rel = {v: _RelativeFit(len(relative), heads, dim) for v in ("bf16", "fp8")} if relative else {}
    # the joint model needs K and V of a layer to have one shape (one channel layout)
    same_shapes = all(k.shape == v.shape for k, v in truths[0])
    joint_layers = [layer for layer in range(n_layers) if layer not in relative] if joint and same_shapes else []
    fits_joint = {v: JointFit(n_layers, heads, dim) for v in ("bf16", "fp8")} if joint_layers else {}
    for i, true in enumerate(truths):
        for layer, pair in enumerate(true):
            # per storage mode: the residuals and the predictions of K then V
            errors: dict[str, list[torch.Tensor]] = {"bf16": [], "fp8": []}
            mus: dict[str, list[torch.Tensor]] = {"bf16": [], "fp8": []}
            for kv, t in enumerate(pair):
                s = float(scales[layer, kv])
                sums = _channel_sums(t, preds["bf16"][i][layer][kv], preds["fp8"][i][layer][kv], s)
                for stat, row in zip(exact[layer][kv], sums):
                    for c, v in enumerate(row):
                        stat[c] += v
                if layer not in relative and layer not in joint_layers:
                    continue
                p = preds["bf16"][i][layer][kv].double()
                p8 = preds["fp8"][i][layer][kv].double() / s
                e, e8 = t.double() - p, fp8_quantize(t, s).double() - p8
                if layer in relative:
                    rel["bf16"].add(layer, kv, e, p)
                    rel["fp8"].add(layer, kv, e8, p8)
                errors["bf16"].append(e)
                errors["fp8"].append(e8)
                mus["bf16"].append(p)
                mus["fp8"].append(p8)
            if layer in joint_layers:
                for store, fit in fits_joint.items():
                    fit.add(layer, *errors[store], *mus[store])

    def mean(stat: int) -> torch.Tensor:
        # one correctly rounded division of exact integers (Python's int / int)
        means = [[[v / (count[i] << 64) for v in kv[stat]] for kv in layer] for i, layer in enumerate(exact)]
        return torch.tensor(means, dtype=torch.float64).reshape(n_layers, 2, heads, dim)

    sigma = mean(1).sqrt().float()
    sigma_fp8 = mean(2).sqrt().float()
    sigma_rel: torch.Tensor | None = None
    sigma_rel_fp8: torch.Tensor | None = None
    if relative:
        sigma_rel, sigma_rel_fp8 = torch.zeros_like(sigma), torch.zeros_like(sigma)
        for out_abs, out_rel, rfit in ((sigma, sigma_rel, rel["bf16"]), (sigma_fp8, sigma_rel_fp8, rel["fp8"])):
            a, r = rfit.solve()
            out_abs[: len(relative)] = a
            out_rel[: len(relative)] = r
    metadata: dict[str, Any] = {
        "format": CALIBRATION_FORMAT,
        "model_fingerprint": fingerprint,
        "predictor": describe(predictor),
        "speckv_version": __version__,
        "samples": len(samples),
        "tokens": tokens,
        "source": source,
    }
    metadata["producer"] = getattr(producer, "__name__", type(producer).__name__)
    solved = {v: fit.solve(joint_layers, JOINT_SHRINKAGE) for v, fit in fits_joint.items()}
    if joint_layers:
        metadata["joint"] = {"layers": joint_layers, "shrinkage": JOINT_SHRINKAGE}
        # degenerate channels (constant, or a covariance that is not positive definite):
        # what the fit did about them, per mode and layer
        repairs = {v: fit.repairs for v, fit in fits_joint.items() if fit.repairs}
        if repairs:
            metadata["joint"]["repairs"] = repairs
    state_dict = getattr(predictor, "state_dict", None)
    return Calibration(
        sigma=sigma,
        sigma_fp8=sigma_fp8,
        fp8_scales=scales,
        means=mean(0).float(),
        metadata=metadata,
        predictor_state=dict(state_dict()) if (fits or learns) and callable(state_dict) else {},
        sigma_rel=sigma_rel,
        sigma_rel_fp8=sigma_rel_fp8,
        joint=solved,
        joint_fits=fits_joint if keep_joint_fits else {},
    )


class _RelativeFit:
    """Per channel, the variance model ``e^2 ~ a + b mu^2`` fitted by least squares over the
    calibration residuals ``e`` (b >= 0, a >= a small floor); gives ``sqrt(a)`` and ``sqrt(b)``."""

    FLOOR = 1e-6

    def __init__(self, layers: int, heads: int, dim: int) -> None:
        shape = (layers, 2, heads, dim)
        self.n = torch.zeros(shape, dtype=torch.float64)
        self.e2, self.p2, self.p4, self.e2p2 = (torch.zeros(shape, dtype=torch.float64) for _ in range(4))

    def add(self, layer: int, kv: int, e: torch.Tensor, p: torch.Tensor) -> None:
        e2, p2 = e * e, p * p
        self.n[layer, kv] += e.shape[0] * e.shape[2]
        self.e2[layer, kv] += e2.sum(dim=(0, 2)).cpu()
        self.p2[layer, kv] += p2.sum(dim=(0, 2)).cpu()
        self.p4[layer, kv] += (p2 * p2).sum(dim=(0, 2)).cpu()
        self.e2p2[layer, kv] += (e2 * p2).sum(dim=(0, 2)).cpu()

    def solve(self) -> tuple[torch.Tensor, torch.Tensor]:
        n = self.n.clamp(min=1)
        me2, mp2, mp4, me2p2 = self.e2 / n, self.p2 / n, self.p4 / n, self.e2p2 / n
        var_p2 = (mp4 - mp2 * mp2).clamp(min=1e-300)
        b = ((me2p2 - me2 * mp2) / var_p2).clamp(min=0)
        a = me2 - b * mp2
        floor = self.FLOOR**2
        low = a < floor
        # where the intercept would go below the floor: pin it there and refit the slope
        b = torch.where(low, ((me2p2 - floor * mp2) / mp4.clamp(min=1e-300)).clamp(min=0), b)
        a = torch.where(low, torch.full_like(a, floor), a)
        return a.sqrt().float(), b.sqrt().float()


def _last_tokens(pred: KV, truth: KV) -> KV:
    """``pred`` cut to the tokens each layer of ``truth`` holds (``cache.last_tokens``)."""
    return [
        (last_tokens(pk, k.shape[2], layer), last_tokens(pv, v.shape[2], layer))
        for layer, ((pk, pv), (k, v)) in enumerate(zip(pred, truth))
    ]


def _as_float(layer: int, which: int, t: torch.Tensor) -> torch.Tensor:
    return t.float()


def _fitted_predictions(
    predictor: Any, samples: list[torch.Tensor], truths: list[KV], scales: torch.Tensor, progress: bool
) -> dict[str, list[KV]]:
    """Fits a learned predictor and returns its out-of-fold predictions of every calibration
    prompt, as observed in bf16 storage and in fp8 storage."""

    def as_bf16(layer: int, which: int, t: torch.Tensor) -> torch.Tensor:
        return t.to(torch.bfloat16).float()

    def as_fp8(layer: int, which: int, t: torch.Tensor) -> torch.Tensor:
        s = float(scales[layer, which])
        return fp8_quantize(t, s).float() * s

    hidden = [predictor.hidden_state(ids) for ids in samples] if getattr(predictor, "hidden", False) else None
    oof = predictor.fit(truths, {"bf16": as_bf16, "fp8": as_fp8}, progress=progress, hidden_states=hidden)
    prefix_layers = int(getattr(predictor, "layers", 0))
    out: dict[str, list[KV]] = {"bf16": [], "fp8": []}
    for i, ids in enumerate(samples):
        made: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

        def keep(layer: int, k: torch.Tensor, v: torch.Tensor, made: dict = made) -> None:
            made[layer] = (k.float(), v.float())

        if prefix_layers:
            predictor.prefix(ids, keep)
        for variant in out:
            kv = []
            for layer in range(len(truths[i])):
                if layer < prefix_layers:
                    kv.append(made[layer])
                else:
                    kv.append((oof[variant][i][layer, 0], oof[variant][i][layer, 1]))
            out[variant].append(kv)
    return out
