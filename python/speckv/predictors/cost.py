"""What a model's forward pass costs, counted from its config, and what that makes the
default predictor: FLOPs of a decoder layer and of the LM head, cache scalars per token, and
the coder's expected share of a restore.

A restore with ``ModelPrefixPredictor(layers=k)`` costs the model's first ``k`` layers plus the
coder; a recompute costs every layer (and one token's logits). The coder's time per cache
scalar is about constant on a machine, while a layer's FLOPs per cache scalar differ a lot
between models (Qwen2.5-0.5B: ~6x SmolLM2-135M's, for its 2 KV heads under a 896-wide
residual). So the deepest prefix that keeps a restore within budget differs per model:
``default_prefix_layers`` counts it, instead of one share of the layers for every model.
"""

from __future__ import annotations

from typing import Any

from ..models.architecture import layer_windows, text_config
from .base import ChannelStatsPredictor

# The coder's cost per cache scalar in FLOP-equivalents of a bf16 forward pass on the CPUs
# measured (2-core Zen 4, AVX-512 kernels; the demo model: decode ~0.2x of a recompute at
# ~18k decoder FLOPs per cache scalar). A machine-level constant, not a model's.
CODER_FLOPS_PER_SCALAR = 3_600.0
# A default restore: at most this share of a recompute (the prefix's layers + the coder).
# Chosen so that the demo model keeps the prefix measured best on it (20 of its 30 layers:
# README, "Restore cost").
RESTORE_BUDGET = 0.87
# Where the coder is at most this share of a recompute, the joint residual model's slower
# decode costs little, and layer-wise predictors code with it by default (README, "Joint
# residual model").
JOINT_CODER_SHARE = 0.1
# Prompt length the counts assume (the calibration's).
TOKENS = 512


def _dims(config: Any) -> tuple[int, int, int, int, int]:
    hidden = int(config.hidden_size)
    heads = int(config.num_attention_heads)
    kv = int(getattr(config, "num_key_value_heads", None) or heads)
    dim = int(getattr(config, "head_dim", None) or hidden // heads)
    return hidden, heads, kv, dim, int(config.intermediate_size)


def layer_flops(config: Any, layer: int = 0, tokens: int = TOKENS) -> float:
    """FLOPs of decoder layer ``layer`` over a prompt of ``tokens``: projections, MLP, and
    attention (causal; a sliding layer over its window)."""
    hidden, heads, kv, dim, inter = _dims(config)
    proj = 2 * tokens * hidden * (2 * heads * dim + 2 * kv * dim)  # q, o; k, v
    mlp = 2 * tokens * 3 * hidden * inter  # gate, up, down
    window = layer_windows(config)[layer]
    span = min(tokens, window) if window else tokens
    attention = 2 * 2 * tokens * span * heads * dim / 2
    return float(proj + mlp + attention)


def head_flops(config: Any, tokens: int = 1) -> float:
    """FLOPs of the LM head for ``tokens`` positions (a recompute needs the last one's)."""
    return float(2 * tokens * int(config.hidden_size) * int(config.vocab_size))


def cache_scalars_per_token(config: Any) -> int:
    _, _, kv, dim, _ = _dims(config)
    return int(config.num_hidden_layers) * 2 * kv * dim


def recompute_flops(config: Any, tokens: int = TOKENS) -> float:
    """A prefill that recomputes the cache: every layer, the last token's logits."""
    n = int(config.num_hidden_layers)
    return sum(layer_flops(config, i, tokens) for i in range(n)) + head_flops(config)


def coder_share(config: Any, tokens: int = TOKENS) -> float:
    """The coder's expected time as a share of a recompute (CODER_FLOPS_PER_SCALAR)."""
    scalars = cache_scalars_per_token(config) * tokens
    return CODER_FLOPS_PER_SCALAR * scalars / recompute_flops(config, tokens)


def prefix_share(config: Any, layers: int, tokens: int = TOKENS) -> float:
    """The model's first ``layers`` layers as a share of a recompute."""
    return sum(layer_flops(config, i, tokens) for i in range(layers)) / recompute_flops(config, tokens)


def map_flops(config: Any, tokens: int = TOKENS, history: int = 2, hidden: bool = False) -> float:
    """FLOPs of one layer's maps (``prefix.ModelPrefixPredictor``) over ``tokens``: K's and the
    first part of V's from the previous ``history`` layers' K and V (and with ``hidden`` the
    hidden state), V's own from its K."""
    size, _, kv, dim, _ = _dims(config)
    width = kv * dim
    features = 2 * history * width + (size if hidden else 0)
    return float(2 * tokens * (features * 2 * width + width * width))


def predictor_flops(predictor: Any, config: Any, tokens: int = TOKENS) -> float:
    """What a predictor computes for a prompt of ``tokens``, in FLOPs counted from the config:
    the model's own layers it runs, and its maps; 0 for one that runs no model (per-channel
    statistics); a whole forward pass for the predictors that run every layer."""
    n = int(config.num_hidden_layers)
    if callable(getattr(predictor, "prefix", None)):  # the model's first layers, then maps
        layers, hidden = int(predictor.layers), bool(getattr(predictor, "hidden", False))
        maps = (n - layers) * map_flops(config, tokens, int(predictor.history), hidden)
        return sum(layer_flops(config, i, tokens) for i in range(layers)) + maps
    if isinstance(predictor, ChannelStatsPredictor):
        return 0.0
    return sum(layer_flops(config, i, tokens) for i in range(n))


def default_prefix_layers(config: Any) -> int:
    """The most layers a default ``ModelPrefixPredictor`` runs while its restore (those
    layers and the coder) stays within RESTORE_BUDGET of a recompute; at least 1."""
    n = int(config.num_hidden_layers)
    share = coder_share(config)
    fitting = [k for k in range(1, n + 1) if prefix_share(config, k) + share <= RESTORE_BUDGET]
    return max(fitting) if fitting else 1


def joint_by_default(config: Any) -> bool:
    """Whether a layer-wise predictor codes with the joint residual model by default: where
    the coder is a small share of a recompute (JOINT_CODER_SHARE)."""
    return coder_share(config) <= JOINT_CODER_SHARE


__all__ = [
    "cache_scalars_per_token",
    "text_config",
    "coder_share",
    "default_prefix_layers",
    "head_flops",
    "joint_by_default",
    "layer_flops",
    "map_flops",
    "predictor_flops",
    "prefix_share",
    "recompute_flops",
]
