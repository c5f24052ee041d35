"""A restore's walk split into walks over groups of token blocks, side by side, one a thread:
a walk is one chain of small steps (a layer's maps, its decode calls, the Python and torch
work between them) of which only the core calls use every core; walks over parts of the
tokens keep the cores busy (the core and torch release the GIL). A layer-wise predictor's
walk splits past the model's prefix (``split_walk``), a whole-prompt predictor's from the
start (``split_whole``)."""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import numpy as np
import torch

from .. import _api, container
from ..models.cache import last_tokens
from .block_layout import join, parallel
from .plan import CodingPlan
from .stacked import _stacked_job, _stacked_result


class _Piece(NamedTuple):
    """One token block of a layer-wise walk's stacked container(s): the container, the
    block, where its jointly coded V finds its K's residuals (keyed by ``block``), and the
    prompt position its container's tokens start at (a container per block of a prompt)."""

    c: container.Container
    block: int
    outside: dict[int, np.ndarray]
    start: int = 0

    def tokens(self) -> tuple[int, int]:
        lo, hi = self.c.token_range(self.block)
        return self.start + lo, self.start + hi


def split_walk(
    plan: CodingPlan, run: Any, pieces: list[_Piece], layers: range, threads: int
) -> list[dict[int, list[torch.Tensor]]] | None:
    """A layer-wise walk's ``layers`` (its maps, from ``run.independent_layers`` on) as walks
    over groups of consecutive ``pieces``, side by side, one per thread
    (``_PrefixRun.split``): each predicts its tokens' rows, decodes its pieces' streams and
    observes them. Per piece, its layers' ``[K, V]``: the same words as one walk over every
    token (each row's prediction is the same bits, and each piece's stream is checked
    against it). None where the walk does not split (one thread, one piece, a run whose maps
    are not row by row): the caller walks on as one.

    Measured on an Intel Xeon with AMX, 2 cores, the demo model's 512-token restore with the
    ``map`` predictor (``benches/profile_restore.py``): see ``docs/benchmarks/restore-profile.md``."""
    groups = min(threads, len(pieces))
    split = getattr(run, "split", None)
    if groups < 2 or not callable(split) or not layers:
        return None
    if any(p.c.held(layer) != p.c.tokens for p in pieces for layer in layers):
        return None  # a layer holding the last tokens only: its rows are not the walk's
    sizes = [hi - lo for lo, hi in (p.tokens() for p in pieces)]
    bounds = [[pieces[i] for i in group] for group in token_groups(sizes, groups)]
    spans = [(g[0].tokens()[0], g[-1].tokens()[1]) for g in bounds]
    runs = split(spans, max(1, threads // len(bounds)))
    if runs is None:
        return None

    def walk(work: tuple[Any, list[_Piece], int]) -> list[dict[int, list[torch.Tensor]]]:
        sub, group, first = work
        got: list[dict[int, list[torch.Tensor]]] = [{} for _ in group]
        for layer in layers:
            for which in (0, 1):
                target = plan.target(layer, which, sub.predict(layer, which))
                jobs = [
                    _stacked_job(plan, p.c, p.block, which, layer, [target], p.outside, first - p.start) for p in group
                ]
                values = []
                for i, (p, words, job) in enumerate(zip(group, _api.decode_many(jobs, sub.threads), jobs)):
                    values.append(_stacked_result(plan, words, job[1], p.block, which, 1, p.outside)[0])
                    got[i].setdefault(layer, []).append(values[-1])
                sub.observe(layer, which, plan.observed(layer, which, join(values)))
        return got

    done = parallel(walk, [(sub, g, lo) for sub, g, (lo, _) in zip(runs, bounds, spans)], len(bounds))
    return [per_piece for group in done for per_piece in group]


def token_groups(sizes: list[int], groups: int) -> list[list[int]]:
    """Indices of consecutive items of ``sizes`` tokens each, in at most ``groups`` groups of
    about as many tokens each."""
    out: list[list[int]] = [[]]
    seen, total = 0, sum(sizes)
    for i, size in enumerate(sizes):
        if out[-1] and seen >= total * len(out) / groups:
            out.append([])
        out[-1].append(i)
        seen += size
    return out


def split_whole(
    plan: CodingPlan, c: container.Container, prediction: list[tuple[torch.Tensor, torch.Tensor]], threads: int
) -> list[dict[int, list[torch.Tensor]]] | None:
    """A whole-prompt predictor's stacked container, every layer, as walks over groups of
    consecutive token blocks side by side, one a thread: each makes its tokens' targets
    (``CodingPlan.target`` is per scalar: the rows of the whole prompt's), then decodes its
    blocks' K streams and V streams a few layers a call (a jointly coded V reads its own
    block's K residuals, which its walk holds). Per block, its layers' ``[K, V]``: the same
    words as one walk. None where it does not split (a per-layer container, one thread, one
    block, a layer holding only the last tokens): the caller walks as one."""
    if c.layout != "stacked" or threads < 2 or len(c.blocks) < 2:
        return None
    if any(c.held(layer) != c.tokens for layer in range(c.layers)):
        return None
    if any(s is None for block in c.blocks for s in block):
        return None
    # whole chunks, as many layers a call as one walk over every token takes (the walks'
    # targets together are that walk's)
    span = threads * math.lcm(*(s.layers_per_chunk for block in c.blocks for s in block if s is not None))
    groups = token_groups([hi - lo for lo, hi in map(c.token_range, range(len(c.blocks)))], threads)
    share = max(1, threads // len(groups))

    def walk(blocks: list[int]) -> list[dict[int, list[torch.Tensor]]]:
        lo, hi = c.token_range(blocks[0])[0], c.token_range(blocks[-1])[1]
        got: list[dict[int, list[torch.Tensor]]] = [{} for _ in blocks]
        outside: dict[int, np.ndarray] = {}
        for first in range(0, c.layers, span):
            stop = min(first + span, c.layers)
            for which in (0, 1):
                targets = [
                    plan.target(layer, which, last_tokens(prediction[layer][which], c.tokens, layer)[:, :, lo:hi])
                    for layer in range(first, stop)
                ]
                jobs = [_stacked_job(plan, c, b, which, first, targets, outside, lo) for b in blocks]
                for i, (b, words, job) in enumerate(zip(blocks, _api.decode_many(jobs, share), jobs)):
                    pieces = _stacked_result(plan, words, job[1], b, which, stop - first, outside)
                    for layer, piece in zip(range(first, stop), pieces):
                        got[i].setdefault(layer, []).append(piece)
        return got

    return [per_block for done in parallel(walk, groups, len(groups)) for per_block in done]
