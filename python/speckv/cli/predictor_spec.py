"""``--predictor`` names: the predictor each builds, and the short names used in messages and
calibration file names."""

from __future__ import annotations

import hashlib
import json
from typing import TYPE_CHECKING, Any

from .common import CommandError

if TYPE_CHECKING:  # the hf extra: imported where a predictor is made
    from ..predictors.base import AnyPredictor

PREDICTORS_HELP = (
    "prefix (the default: the model's first layers + maps), prefix:N (N layers), map (layer 0 + maps), "
    "map+hidden or prefix:N+hidden (maps that also read the hidden state the last run layer hands on), "
    "fp8 (fp8 weights, float32 compute, 1 thread), fp8-all (the same on every core), "
    "fp8-bf16 (fp8 weights, bf16 compute, every core), stats (no model: per-channel means)"
)


def parse_spec(spec: str) -> tuple[str, int | None, bool]:
    """A ``--predictor`` name as (kind, layers of ``prefix:N`` or None, maps read the hidden
    state), or ``CommandError``: checked before any model loads."""
    if spec in ("fp8", "fp8-all", "fp8-bf16", "stats"):
        return spec, None, False
    hidden = spec.endswith("+hidden")
    base = spec[: -len("+hidden")] if hidden else spec
    if base in ("map", "prefix"):
        return base, None, hidden
    if base.startswith("prefix:"):
        try:
            return "prefix", int(base.split(":", 1)[1]), hidden
        except ValueError:
            raise CommandError(f"predictor {spec!r}: expected prefix:N with N a number of layers") from None
    raise CommandError(f"unknown predictor {spec!r}: expected {PREDICTORS_HELP}")


def make_predictor(spec: str, model: Any, block_size: int | None = None) -> AnyPredictor:
    """A predictor from its command-line name (see PREDICTORS_HELP)."""
    import torch

    from ..hf import ChannelStatsPredictor, Fp8Predictor, ModelPrefixPredictor
    from ..predictors.early_exit import default_prefix_layers

    kind, layers, hidden = parse_spec(spec)
    if kind == "fp8":
        return Fp8Predictor(model, block_size=block_size)
    if kind == "fp8-all":
        return Fp8Predictor(model, block_size=block_size, threads="all")
    if kind == "fp8-bf16":
        return Fp8Predictor(model, block_size=block_size, dtype=torch.bfloat16, threads="all")
    if kind == "stats":
        return ChannelStatsPredictor()
    if kind == "map":
        return ModelPrefixPredictor(model, layers=1, hidden=hidden)
    if layers is None:
        return ModelPrefixPredictor(model, layers=default_prefix_layers(model), hidden=hidden)
    try:
        return ModelPrefixPredictor(model, layers=layers, hidden=hidden)
    except ValueError as e:
        raise CommandError(f"predictor {spec!r}: {e}") from None


def predictor_key(predictor: AnyPredictor) -> str:
    """A short, stable name of a predictor's settings for calibration file names."""
    from ..predictors.base import describe

    d = describe(predictor)
    if d.get("name") == "fp8" and d.get("compute_dtype") == "float32" and d.get("threads") == 1:
        # the name calibrations of the default fp8 predictor had before there were others
        return "pt" if d["scale"].startswith("per-tensor") else f"b{d['scale'].split('x')[0]}"
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


def describe_short(predictor: AnyPredictor) -> str:
    """A predictor in a few words, for progress lines and table notes."""
    from ..predictors.base import describe

    d = describe(predictor)
    if d.get("name") == "model-prefix":
        maps = "maps of K, V and its hidden state" if "hidden" in d else "maps"
        return f"the model's first {d['layers']} layers on {d['threads']} threads + {maps}"
    if d.get("name") == "fp8":
        scale = d["scale"].replace("per-tensor absmax", "per-tensor")
        return f"fp8 weights ({scale} scales), {d['compute_dtype']} compute on {d['threads']} thread(s)"
    return str(d.get("name"))
