"""How a cache is laid out in a container: the layout (one stream per block holding every
layer, or a stream per layer), the blocks' size, the tokens each layer holds, how many layers
go in a chunk and how many are coded at a time, and the coding jobs (one stream each) spread
over threads."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from .. import _api
from ..models.cache import KV

# Tokens per block of the container: what a reader can address (and what a prefix store
# shares); a block costs one more stream header per K and V (~0.1 KB).
DEFAULT_BLOCK_SIZE = 256
MAX_CHUNK = 1 << 24
# Layers per chunk of the stacked layout: fewer chunk headers, still one small read per layer.
LAYERS_PER_CHUNK = 2
# Chunks per layer of a layer-wise predictor's streams: what one layer's decode can spread over.
CHUNKS_PER_LAYER = 2


def choose_layout(tensors: list[torch.Tensor]) -> str:
    """ "stacked" when every layer's keys share one shape and values another (the usual case),
    so all layers fit one stream each with a chunk per layer; otherwise "per-layer".
    ``tensors``: every layer's K and V, in that order."""
    keys, values = tensors[0::2], tensors[1::2]
    same = all(k.shape == keys[0].shape for k in keys) and all(v.shape == values[0].shape for v in values)
    small = max(keys[0].numel(), values[0].numel()) <= MAX_CHUNK
    return "stacked" if same and small else "per-layer"


def block_size(requested: int | None, tokens: int) -> int:
    """Tokens per container block: ``requested`` (default DEFAULT_BLOCK_SIZE), never more
    than the cache holds."""
    block = DEFAULT_BLOCK_SIZE if requested is None else requested
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block_size: expected a positive int, got {requested!r}")
    return max(1, min(block, tokens))


def held(kv: KV) -> list[int]:
    """Per layer, the tokens its cache holds (a sliding-window layer: fewer than the prompt);
    K and V of a layer hold the same tokens, and every layer some."""
    out = []
    for layer, (k, v) in enumerate(kv):
        if k.ndim != 4 or v.ndim != 4 or k.shape[2] != v.shape[2] or k.shape[2] < 1:
            raise ValueError(
                f"cache: layer {layer}'s keys {tuple(k.shape)} and values {tuple(v.shape)} are not "
                "[batch, heads, tokens, dim] of the same (non-zero) tokens"
            )
        out.append(int(k.shape[2]))
    return out


def wanted(layers: list[int] | None, n_layers: int) -> list[int]:
    """The layers asked for (default: all), each checked to exist."""
    out = list(range(n_layers)) if layers is None else list(layers)
    for layer in out:
        if not 0 <= layer < n_layers:
            raise IndexError(f"layer {layer} of {n_layers}")
    return out


def per_layer_batch(threads: int, blocks: int) -> int:
    """Layers a per-layer container is coded or decoded at a time: enough streams (K and V of
    each block) for every thread, and no more layers' parameters than that."""
    return max(1, -(-2 * threads // blocks))


def join(blocks: list[torch.Tensor]) -> torch.Tensor:
    """One layer's K or V from its blocks' pieces (``[batch, heads, tokens, dim]``)."""
    return blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=2)


def parallel(fn: Callable[[Any], Any], jobs: list[Any], threads: int | None) -> list[Any]:
    """``[fn(job) for job in jobs]`` on up to ``threads`` threads (speckv releases the GIL), in
    order; each stream is coded on one thread, so the bytes never depend on ``threads``."""
    n = _api.resolve_threads(threads)
    if n == 1 or len(jobs) <= 1:
        return [fn(job) for job in jobs]
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="speckv") as pool:
        return list(pool.map(fn, jobs))
