"""What a model's cache looks like layer by layer, and whether speckv can predict it.

speckv codes caches of attention layers that hold one ``(K, V)`` pair per token they keep:
full attention (every token) and sliding-window or chunked attention (the last tokens, a
window: transformers keeps ``window - 1`` after a prefill). Each layer's keys and values are
``[batch, kv_heads, tokens, head_dim]``; layers may differ in how many tokens they hold, and
in RoPE (Gemma 3: another base on its sliding layers). What the predictors cannot model yet is
refused up front (``check_architecture``) with ``UnsupportedModelError`` naming what is
missing, instead of a traceback from torch half-way through a calibration.
"""

from __future__ import annotations

from typing import Any

from .._speckv import SpeckvError

# layer types (transformers' ``config.layer_types``) whose cache is a (K, V) per held token
FULL = "full_attention"
WINDOWED = ("sliding_attention", "chunked_attention")
SUPPORTED_LAYER_TYPES = (FULL, *WINDOWED)


class UnsupportedModelError(SpeckvError):
    """The model's architecture is one speckv cannot predict (the message names what)."""


def text_config(model: Any) -> Any:
    """The decoder's config (a multimodal model's text part)."""
    config = model.config
    getter = getattr(config, "get_text_config", None)
    return getter(decoder=True) if callable(getter) else config


def layer_types(config: Any) -> list[str]:
    """Per layer, its attention type (``config.layer_types``; without it, sliding where the
    config has a ``sliding_window``, as transformers infers it)."""
    n = int(config.num_hidden_layers)
    types = getattr(config, "layer_types", None)
    if types is None:
        window = getattr(config, "sliding_window", None)
        use = getattr(config, "use_sliding_window", True)
        kind = WINDOWED[0] if window is not None and use else FULL
        return [kind] * n
    return [str(t) for t in types]


def layer_windows(config: Any) -> list[int | None]:
    """Per layer, the window of a sliding (or chunked) layer in tokens, ``None`` for full
    attention: a layer's cache may hold fewer tokens than the prompt where it has one."""
    out: list[int | None] = []
    for kind in layer_types(config):
        if kind == FULL:
            out.append(None)
        else:
            name = "attention_chunk_size" if kind == "chunked_attention" else "sliding_window"
            window = getattr(config, name, None)
            out.append(int(window) if window is not None else None)
    return out


def check_architecture(model: Any) -> None:
    """Raises ``UnsupportedModelError`` naming what speckv cannot predict in ``model``: no
    decoder layers at ``model.model.layers``, layer types other than full and sliding /
    chunked attention (recurrent, linear or compressed attention), latent (MLA) caches, KV
    shared between layers."""
    config = text_config(model)
    name = type(model).__name__
    inner = getattr(model, "model", model)
    language = getattr(inner, "language_model", None)
    if getattr(inner, "layers", None) is None and getattr(language, "layers", None) is None:
        raise UnsupportedModelError(f"{name}: no decoder layers at model.model.layers")
    if getattr(config, "num_hidden_layers", None) is None:
        raise UnsupportedModelError(f"{name}: its config has no num_hidden_layers")
    if getattr(config, "kv_lora_rank", None):
        raise UnsupportedModelError(
            f"{name}: multi-head latent attention (kv_lora_rank={config.kv_lora_rank}) caches latents, "
            "not per-head keys and values; speckv's predictors do not model them yet"
        )
    other = sorted({t for t in layer_types(config) if t not in SUPPORTED_LAYER_TYPES})
    if other:
        raise UnsupportedModelError(
            f"{name}: layer types {other} (speckv predicts {list(SUPPORTED_LAYER_TYPES)}): "
            "recurrent or compressed layers hold no per-token keys and values"
        )
    if getattr(config, "kv_sharing_modes", None) is not None or int(getattr(config, "num_kv_shared_layers", None) or 0):
        raise UnsupportedModelError(f"{name}: layers that reuse other layers' keys and values are not supported yet")


__all__ = [
    "SUPPORTED_LAYER_TYPES",
    "UnsupportedModelError",
    "check_architecture",
    "layer_types",
    "layer_windows",
    "text_config",
]
