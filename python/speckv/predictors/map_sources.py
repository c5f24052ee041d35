"""What a ``ModelPrefixPredictor``'s maps read: their sources (the previous layers' K and V, the
hidden state, V's own K), the fallback sources where a sliding window lost tokens, and the
features built from them."""

from __future__ import annotations

import torch

from .. import _speckv
from .rope import Rope, Ropes

HISTORY = 2
# The maps' name for that hidden state among their sources (``[batch, 1, tokens, hidden]``).
HIDDEN = (-1, 2)


def _hidden_source(h: torch.Tensor) -> torch.Tensor:
    """A hidden state ``[batch, tokens, hidden]`` as the maps' source HIDDEN: ``[batch, 1,
    tokens, hidden]`` float32 (one "head" of ``hidden`` channels)."""
    return h.float()[:, None]


def _tokens(t: torch.Tensor) -> torch.Tensor:
    """[batch, heads, seq, dim] -> [batch * seq, heads * dim]."""
    b, h, s, d = t.shape
    return t.permute(0, 2, 1, 3).reshape(b * s, h * d)


def heads_of(y: torch.Tensor, shape: tuple[int, ...], rope: Rope | None = None) -> torch.Tensor:
    """The first ``heads * dim`` columns of a map's outputs ``y`` (``[batch * rows, outputs]``,
    float32) as a cache layer of ``shape`` (``[batch, heads, rows, dim]``), with ``rope``'s
    rotation applied (a key's): the bits of ``rope.rope(...)`` of those columns reordered by head
    (the core's invariant R2) in one core call instead of five torch operations per layer."""
    b, h, s, d = shape
    y = y.contiguous()
    tables = rope.tables(s) if rope is not None else None
    out = _speckv.map_heads(y.reshape(-1).numpy(), y.shape[1], 0, (b, h, s, d), tables)
    return torch.from_numpy(out).reshape(shape)


def _sources(layer: int, which: int, hidden: bool = False) -> list[tuple[int, int]]:
    """(layer, K/V) pairs a map reads: both tensors of the previous HISTORY layers, with
    ``hidden`` the prefix's hidden state (HIDDEN), and for V also the K of its own layer."""
    out = [(src, w) for src in range(layer - 1, layer - 1 - HISTORY, -1) if src >= 0 for w in (0, 1)]
    if hidden:
        out.append(HIDDEN)
    if which == 1:
        out.append((layer, 0))
    return out


def _covers(windows: list[int | None], src: int, layer: int) -> bool:
    """Whether layer ``src``'s cache holds every token layer ``layer``'s does (a full layer
    does; a sliding one only for a target of no larger window)."""
    mine, theirs = windows[layer], windows[src]
    return theirs is None or (mine is not None and theirs >= mine)


def _fallback_sources(
    layer: int, which: int, windows: list[int | None], hidden: bool = False
) -> list[tuple[int, int]] | None:
    """Where a map's sources (``_sources``) may lack tokens its layer holds (a full layer
    above sliding-window ones: on prompts longer than the window, its early tokens have left
    theirs), the sources of its fallback map for those tokens: the nearest HISTORY earlier
    layers that hold them all (none: the map's bias alone, the channels' means), and for V
    its own K. ``None`` where every source covers the layer."""
    if all(_covers(windows, src, layer) for src, _ in _sources(layer, which) if 0 <= src != layer):
        return None
    covering = [src for src in range(layer - 1, -1, -1) if _covers(windows, src, layer)][:HISTORY]
    out = [(src, w) for src in covering for w in (0, 1)]
    if hidden:  # every token's: the prompt's forward pass
        out.append(HIDDEN)
    if which == 1:
        out.append((layer, 0))
    return out


Observed = dict[tuple[int, int], torch.Tensor]


def _features(
    observed: Observed,
    sources: list[tuple[int, int]],
    ropes: Ropes,
    rows: int,
    cache: dict[tuple[int, int], torch.Tensor] | None = None,
) -> torch.Tensor:
    """The map's inputs at the last ``rows`` positions, ``[batch * rows, features]``: each
    source's K (un-RoPEd) or V there, zero where the source does not hold the position (see
    ``_missing``). With ``cache`` (a walk's, dropped with the observed tensors it was made
    from) each source is made float32, un-RoPEd and laid out by token once, not once per map
    that reads it (a layer's K feeds three maps): the same floats."""
    cols = []
    for src, w in sources:
        tokens = None if cache is None else cache.get((src, w))
        if tokens is None:
            t = observed[src, w].float()
            tokens = _tokens(ropes.of(src).unrope(t) if w == 0 else t)
            if cache is not None:
                cache[src, w] = tokens
        b = observed[src, w].shape[0]
        n = tokens.shape[0] // b
        if n != rows:
            by_batch = tokens.reshape(b, n, -1)
            if n > rows:
                by_batch = by_batch[:, n - rows :]
            else:
                by_batch = torch.nn.functional.pad(by_batch, (0, 0, rows - n, 0))
            cols.append(by_batch.reshape(b * rows, -1))
        else:
            cols.append(tokens)
    if not cols:
        b = next(iter(observed.values())).shape[0] if observed else 1
        return torch.zeros(b * rows, 0)
    return torch.cat(cols, dim=1)


def apply_to_sources(
    m: _speckv.LinearMap, observed: Observed, sources: list[tuple[int, int]], ropes: Ropes, rows: int, threads: int
) -> torch.Tensor:
    """``apply_map(m, _features(observed, sources, ropes, rows), threads)``, the features
    gathered by the core from the observed tensors themselves (``LinearMap.apply_sources``:
    each K's rotation undone there in the same float32 steps, invariant R1, so the same bits)
    instead of a float copy of them made here first: the walk's torch work per map was most
    of what it spent outside the core."""
    args = []
    batch = 1
    for src, w in sources:
        t = observed[src, w].float().contiguous()
        batch, heads, n, dim = t.shape
        tables = ropes.of(src).tables(n) if w == 0 else None
        cos, sin = tables if tables is not None else (None, None)
        args.append((t.reshape(-1).numpy(), heads, n, dim, cos, sin))
    y = m.apply_sources(args, batch, rows, threads)
    return torch.from_numpy(y).reshape(batch * rows, m.outputs)


def _missing(observed: Observed, sources: list[tuple[int, int]], rows: int) -> int:
    """How many of the last ``rows`` positions some source does not hold (the first ones:
    every layer holds the last tokens)."""
    held = [observed[src, w].shape[2] for src, w in sources]
    return max(0, rows - min(held)) if held else 0
