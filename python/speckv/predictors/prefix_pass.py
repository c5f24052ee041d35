"""The forward pass of a ``ModelPrefixPredictor``'s prefix: the model, unchanged, run until its
last wanted layer has written its cache (with the hidden state: until that layer has ended),
each layer's K and V handed on as made; inputs longer than ``prefill_chunk`` in steps, a
prompt's blocks one after another (``PrefixState``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from .base import decoder_layers, fixed_threads


class _Stop(Exception):
    """Raised inside the model's forward pass once the last wanted layer has written its cache."""


def _observing_cache(
    config: Any, stop_after: int, sink: Callable[[int, torch.Tensor, torch.Tensor], None], keep: bool = True
) -> Any:
    """A DynamicCache that hands every layer's new K/V to ``sink`` and stops the forward pass
    after layer ``stop_after - 1``. ``keep=False`` (a forward pass over a whole prompt, whose
    cache nobody reads afterwards): it stores nothing and hands attention the new K/V
    themselves, which are what an empty cache's update returns (the same values, so the same
    bits), without the cache's copy of every layer (as large as the layers' cache)."""
    from transformers import DynamicCache

    class ObservingCache(DynamicCache):
        sink: Callable[[int, torch.Tensor, torch.Tensor], None]

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kw: Any
        ) -> tuple[torch.Tensor, torch.Tensor]:
            if keep:
                out = super().update(key_states, value_states, layer_idx, *args, **kw)
            else:
                out = (key_states, value_states)
            self.sink(layer_idx, key_states, value_states)
            if layer_idx + 1 >= stop_after:
                raise _Stop
            return out

    cache = ObservingCache(config=config)
    cache.sink = sink
    return cache


class PrefixState:
    """What a ``ModelPrefixPredictor`` carries from one token block to the next (the prefix
    store codes a prompt block by block): the cache its forward pass wrote for the earlier
    blocks (its own layers only) and their length. A block's predictions then depend on the
    tokens up to its end alone, and are the same whoever runs the blocks in the same order."""

    def __init__(self) -> None:
        self.cache: Any = None
        self.tokens = 0


def run_prefix(
    predictor: Any,
    input_ids: torch.Tensor,
    sink: Callable[[int, torch.Tensor, torch.Tensor], None],
    state: PrefixState | None = None,
    hidden: Callable[[torch.Tensor], None] | None = None,
) -> None:
    """``predictor.prefix`` (a ``ModelPrefixPredictor``): runs the model's forward pass on
    ``threads`` threads until layer ``layers - 1`` has written its cache, handing each layer's
    (K, V) of every position of ``input_ids`` to ``sink`` once, as it is made; where the maps
    read the hidden state (``predictor.hidden``), until that layer has ended, handing its output
    (``[batch, tokens, hidden]``) to ``hidden``. With ``state``, ``input_ids`` continues the blocks run before (see
    ``PrefixState``). Inputs longer than ``prefill_chunk`` tokens run in steps of that
    many (``PREFILL_CHUNK``); their layers and hidden state reach the sinks in the last
    step."""
    n = int(input_ids.shape[1])
    if n <= predictor.prefill_chunk:
        prefix_step(predictor, input_ids, sink, state, hidden)
        return

    own = state if state is not None else PrefixState()
    steps = list(range(0, n, predictor.prefill_chunk))
    # a sliding-window layer's cache keeps its window: its earlier steps' K/V are kept
    # here; a full layer's cache holds them all already (no second copy)
    parts: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
    last = [False]

    def gather(layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        if predictor.windows[layer] is not None:
            parts.setdefault(layer, []).append((k, v))
        if not last[0]:
            return
        if predictor.windows[layer] is None:
            held = own.cache.layers[layer]
            k, v = held.keys[:, :, -n:], held.values[:, :, -n:]
        else:
            pieces = parts.pop(layer)
            k, v = (torch.cat([p[i] for p in pieces], dim=2) for i in (0, 1))
        sink(layer, k, v)

    states: list[torch.Tensor] = []  # the hidden state of each step's tokens

    def gather_hidden(h: torch.Tensor) -> None:
        states.append(h)
        if last[0] and hidden is not None:
            hidden(torch.cat(states, dim=1))

    for i, start in enumerate(steps):
        last[0] = i + 1 == len(steps)
        prefix_step(predictor, input_ids[:, start : start + predictor.prefill_chunk], gather, own, gather_hidden)


def prefix_step(
    predictor: Any,
    input_ids: torch.Tensor,
    sink: Callable[[int, torch.Tensor, torch.Tensor], None],
    state: PrefixState | None,
    hidden: Callable[[torch.Tensor], None] | None = None,
) -> None:
    """One forward pass of ``prefix`` (see there)."""
    # with the hidden state, the pass stops at the end of layer ``layers - 1`` (its hook),
    # not in its cache's update
    stop_after = predictor.layers + 1 if predictor.hidden else predictor.layers
    if state is not None and state.cache is not None:
        cache = state.cache
        cache.sink = sink
    else:
        cache = _observing_cache(predictor.model.config, stop_after, sink, keep=state is not None)
    handle = None
    if predictor.hidden:

        def ended(module: Any, args: Any, output: Any) -> None:
            if hidden is not None:
                hidden((output[0] if isinstance(output, tuple) else output).detach())
            raise _Stop

        handle = decoder_layers(predictor.model)[predictor.layers - 1].register_forward_hook(ended)
    with torch.no_grad(), fixed_threads(predictor.threads):
        try:
            predictor.model(input_ids=input_ids, use_cache=True, **{predictor._cache_kw: cache})
        except _Stop:
            if state is not None:
                state.cache = cache
                state.tokens += int(input_ids.shape[1])
            return
        finally:
            if handle is not None:
                handle.remove()
    raise RuntimeError("the model's forward pass ended before its cache reached the wanted layer")
