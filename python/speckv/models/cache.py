"""Getting per-layer keys and values out of a transformers cache, and building one back."""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any, cast

import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]


def extract_kv(cache: Any) -> KV:
    """Per-layer ``(keys, values)``, each ``[batch, kv_heads, seq, head_dim]`` (keys after RoPE).

    Reads ``cache.layers[i].keys/values`` (recent transformers), falls back to the older
    ``key_cache``/``value_cache`` lists and to the legacy tuple-of-tuples format.
    """
    layers = getattr(cache, "layers", None)
    if layers is not None:
        return [(layer.keys, layer.values) for layer in layers]
    if hasattr(cache, "key_cache"):
        return list(zip(cache.key_cache, cache.value_cache))
    if isinstance(cache, (list, tuple)) and all(len(item) == 2 for item in cache):
        return [(k, v) for k, v in cache]
    raise TypeError(f"cache: cannot read keys and values from a {type(cache).__name__}")


def last_tokens(pred: torch.Tensor, held: int, layer: int) -> torch.Tensor:
    """A prediction ``[batch, heads, tokens, dim]`` of a layer that holds the last ``held``
    tokens of the prompt: its last ``held`` tokens. Predictors may predict every token of the
    prompt, where a sliding-window layer holds only its window."""
    if pred.ndim != 4 or pred.shape[2] == held:
        return pred
    if pred.shape[2] < held:
        raise ValueError(f"prediction: layer {layer} has {pred.shape[2]} tokens, the cache holds {held}")
    return pred[:, :, pred.shape[2] - held :]


def build_cache(kv: KV, config: Any = None, tokens: int | None = None) -> Any:
    """A ``DynamicCache`` holding exactly these tensors (no copy, no cast).

    With ``config``, each layer is of the model's kind (a sliding-window layer where the model
    has one, unless it holds more tokens than its window keeps: then a full layer, so that no
    token is dropped), and ``tokens`` (the prompt's length) is what a sliding layer has seen:
    it holds fewer, and the model's masks need the count."""
    import transformers.cache_utils as cache_utils
    from transformers import DynamicCache

    # transformers >= 5 keeps a cache's layers as objects (`None` before)
    plain: Any = getattr(cache_utils, "DynamicLayer", None)
    cache = DynamicCache(config=config) if config is not None else DynamicCache()
    layers = getattr(cache, "layers", None)
    for i, (k, v) in enumerate(kv):
        layer = layers[i] if layers is not None and i < len(layers) else None
        window = getattr(layer, "sliding_window", None)
        if layers is not None and window is not None and k.shape[2] > int(window) - 1:
            layers[i] = layer = plain()
        made = layer if layer is not None else getattr(cache, "layer_class_to_replicate", None)
        if plain is not None and layers is not None and (made is plain or type(made) is plain):
            # a plain layer takes the tensors themselves: its update concatenates them onto an
            # empty tensor, a copy of the whole layer (the restore's largest copy); an update
            # of no tokens makes the layer and its device and dtype
            cache.update(k[:, :, :0], v[:, :, :0], i)
            layer = cast(Any, cache.layers[i])
            layer.keys, layer.values = k, v
        else:
            cache.update(k, v, i)
            # the update copies (a concatenation onto an empty layer): the layer takes the
            # tensors themselves instead, the same values, so a restore never holds the cache
            # twice
            held = getattr(cache, "layers", None)
            layer = held[i] if held is not None and i < len(held) else layer
            if layer is not None and getattr(layer, "keys", None) is not None and layer.keys.shape == k.shape:
                layer.keys, layer.values = k, v
        if tokens is not None and layer is not None and hasattr(layer, "cumulative_length"):
            layer.cumulative_length = int(tokens)
    return cache


def cache_argument(model: Any) -> str:
    """The forward pass's (and ``generate``'s) name for a cache to continue and fill:
    ``cache`` (transformers >= 5.20) or ``past_key_values`` (before)."""
    return "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"


def prefill(model: Any, input_ids: torch.Tensor) -> KV:
    """Runs the prompt through ``model`` and returns its cache as per-layer ``(K, V)``."""
    with torch.no_grad():
        out = model(input_ids=input_ids, use_cache=True)
    cache = getattr(out, "cache", None)
    if cache is None:
        cache = out.past_key_values
    return [(k.detach(), v.detach()) for k, v in extract_kv(cache)]


def recompute(model: Any, input_ids: torch.Tensor) -> None:
    """What recomputing the cache of ``input_ids`` costs a serving engine: the forward pass
    with the last token's logits only (``logits_to_keep=1`` where the model takes it), not
    every token's as ``prefill`` computes them (the LM head is 20-60% of a small model's
    prefill). The baseline of ``restore_over_recompute``."""
    kw = {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}
    with torch.no_grad():
        model(input_ids=input_ids, use_cache=True, **kw)


@contextlib.contextmanager
def attention(model: Any, implementation: str) -> Iterator[None]:
    """Runs ``model`` with another attention implementation (``"eager"``, ``"sdpa"``), then
    puts the previous one back."""
    previous = model.config._attn_implementation
    _set_attention(model, implementation)
    try:
        yield
    finally:
        _set_attention(model, previous)


def _set_attention(model: Any, implementation: str) -> None:
    setter = getattr(model, "set_attn_implementation", None)
    if callable(setter):
        setter(implementation)
    else:  # older transformers read the config at every forward pass
        model.config._attn_implementation = implementation


def other_kernels(model: Any, input_ids: torch.Tensor) -> KV:
    """The model's cache of ``input_ids`` computed by other attention kernels than the model's
    own (eager instead of sdpa, or sdpa instead of anything else): the same maths, other
    last bits in most scalars of the deeper layers. This is the situation of a cache made on
    another machine or by another engine, and what calibration and evaluation use to measure a
    predictor that runs the model's own layers honestly (another thread count changes no bit
    of the demo model's cache on the CPUs tested)."""
    current = model.config._attn_implementation
    with attention(model, "sdpa" if current == "eager" else "eager"):
        return prefill(model, input_ids)


def restore_device(device: str | torch.device | None, input_ids: Any) -> torch.device:
    """Where restored tensors go: ``device``, else the prompt's device (checked before any
    decoding, so a bad name costs nothing)."""
    if device is None:
        return input_ids.device if isinstance(input_ids, torch.Tensor) else torch.device("cpu")
    try:
        target = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device: expected a torch device such as 'cpu' or 'cuda:0', got {device!r}") from e
    if target.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r}, but there is no CUDA device here")
    return target
