"""The decoder's walks: a cache container back into each wanted layer's K and V, given the
prediction. Whole-prompt predictors: every layer's parameters at once, a few layers a call on
every thread. Layer-wise predictors: in the predictor's order, each decoded layer observed
before the next is predicted (``layerwise``)."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from .. import _api, container
from .._speckv import CorruptStreamError
from ..models.cache import last_tokens
from ..predictors.base import fixed_threads
from ..predictors.layerwise import overlap_pays
from .block_layout import join, parallel, per_layer_batch
from .plan import CodingPlan
from .stacked import _stacked_job, _stacked_result
from .target import Target, channel_major, cut_tokens
from .token_walks import _Piece, split_walk, split_whole, token_groups

# per layer: its K's and V's decoded pieces (one per block)
Parts = dict[int, list[list[torch.Tensor]]]


def decode_whole(
    plan: CodingPlan,
    c: container.Container,
    prediction: list[tuple[torch.Tensor, torch.Tensor]],
    wanted: list[int],
    layers: list[int] | None,
) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """A whole-prompt predictor's container: the ``wanted`` layers' ``(K, V)`` (``layers``:
    what was asked for, None for all), decoded by ``plan`` (``CodingParams.reading``, made
    before the predictor ran) against ``prediction`` (every layer's)."""
    if len(prediction) != c.layers:
        raise ValueError(f"prediction: {len(prediction)} layers, the container has {c.layers}")

    def target(layer: int, which: int) -> Target:
        return plan.target(layer, which, last_tokens(prediction[layer][which], c.held(layer), layer))

    parts: Parts = {layer: [[], []] for layer in wanted}
    # torch on one thread while the coder's threads decode: the small tensor operations
    # between decode calls would otherwise wake torch's OpenMP workers, which then spin
    # for milliseconds on the cores the coder runs on (measured: 1.2-1.3x slower restores)
    with fixed_threads(1):
        split = split_whole(plan, c, prediction, plan.threads) if layers is None else None
        if split is not None:
            for layer in wanted:
                parts[layer] = [[got[layer][which] for got in split] for which in (0, 1)]
        else:
            _decode_parts(plan, c, wanted, layers, target, parts)
    return {layer: (join(k), join(v)) for layer, (k, v) in parts.items()}


def _decode_parts(
    plan: CodingPlan,
    c: container.Container,
    wanted: list[int],
    layers: list[int] | None,
    target: Callable[[int, int], Target],
    parts: Parts,
) -> None:
    """``decode_whole``'s walk: every wanted layer's pieces into ``parts``, a few layers at a
    time (their targets, not the whole cache's), each layer's target made once."""
    n = plan.threads
    if c.layout == "stacked":
        # whole chunks of every block's streams; all layers: enough chunks for the threads
        group = math.lcm(*(s.layers_per_chunk for block in c.blocks for s in block if s is not None))
        span = group * (n if layers is None else 1)
        for first in sorted({layer // span * span for layer in wanted}):
            stop = min(first + span, c.layers)
            targets = [[target(layer, which) for layer in range(first, stop)] for which in (0, 1)]
            outside: dict[int, np.ndarray] = {}
            for which in (0, 1):
                # every token block's stream of these layers in one call (a jointly coded V
                # reads its own block's K residuals, which K's call left in ``outside``)
                calls = [_stacked_job(plan, c, b, which, first, targets[which], outside) for b in range(len(c.blocks))]
                for b, (words, job) in enumerate(zip(_api.decode_many(calls, n), calls)):
                    got = _stacked_result(plan, words, job[1], b, which, stop - first, outside)
                    for layer, piece in zip(range(first, stop), got):
                        if layer in parts:
                            parts[layer][which].append(piece)
    else:
        span = per_layer_batch(n, len(c.blocks))
        for i in range(0, len(wanted), span):
            jobs = []
            for layer in wanted[i : i + span]:
                pair = [target(layer, which) for which in (0, 1)]
                jobs += [(b, layer, pair) for b in range(len(c.blocks))]
            out = parallel(lambda job: _decode_layer(plan, c, job[0], job[1], job[2]), jobs, n)
            for (_, layer, _), got in zip(jobs, out):
                for which, piece in enumerate(got):
                    parts[layer][which].append(piece)


# ``decode_whole_blocks``: the most tokens whose blocks' targets are held at once (one of K or
# V, every layer: ~35 MB for the demo model's 1,024 tokens), so a long prompt's restore holds
# a few blocks' worth, not the prompt's
WHOLE_BLOCKS_TOKENS = 1024


def decode_whole_blocks(
    plans: list[CodingPlan],
    cs: list[container.Container],
    predictions: list[list[tuple[torch.Tensor, torch.Tensor]]],
) -> list[dict[int, tuple[torch.Tensor, torch.Tensor]]]:
    """Consecutive token blocks of one prompt, each its own stacked container of one token
    block, each against its whole-prompt predictor's prediction (``predictions[i]``: the
    prompt up to block ``i``'s end) and its plan: every layer of every block, a group of
    blocks (``WHOLE_BLOCKS_TOKENS``) at a time, the group's K streams in one decode call
    (``_api.decode_many``, spread over the threads), then its V streams (a jointly coded V
    reads its own block's K residuals); on several threads, as walks over groups of
    consecutive blocks side by side, one a thread. The same words as ``decode_whole`` of each
    block: the same targets, each stream decoded whole."""
    outside: list[dict[int, np.ndarray]] = [{} for _ in cs]
    out: list[dict[int, list[torch.Tensor]]] = [{} for _ in cs]

    def walk(members: list[int], threads: int) -> None:
        groups: list[list[int]] = []
        for i in members:
            if not groups or sum(cs[j].tokens for j in groups[-1]) + cs[i].tokens > WHOLE_BLOCKS_TOKENS:
                groups.append([])
            groups[-1].append(i)
        for group in groups:
            for which in (0, 1):
                jobs = []
                for i in group:
                    plan, c, pred = plans[i], cs[i], predictions[i]
                    targets = [
                        plan.target(layer, which, last_tokens(pred[layer][which], c.held(layer), layer))
                        for layer in range(c.layers)
                    ]
                    jobs.append(_stacked_job(plan, c, 0, which, 0, targets, outside[i]))
                for i, got, job in zip(group, _api.decode_many(jobs, threads), jobs):
                    pieces = _stacked_result(plans[i], got, job[1], 0, which, cs[i].layers, outside[i])
                    for layer, piece in enumerate(pieces):
                        out[i].setdefault(layer, []).append(piece)

    n = plans[0].threads
    with fixed_threads(1):  # as ``decode_whole``: torch's workers off the coder's cores
        # walks over groups of consecutive blocks side by side, one a thread (as
        # ``token_walks``: one walk's Python between its decode calls overlaps the other's)
        members = token_groups([c.tokens for c in cs], n)
        parallel(lambda group: walk(group, max(1, n // len(members))), members, len(members))
    return [{layer: (kv[0], kv[1]) for layer, kv in blocks.items()} for blocks in out]


def decode_stacked(
    plan: CodingPlan,
    c: container.Container,
    b: int,
    which: int,
    first: int,
    targets: list[Target],
    outside: dict[int, np.ndarray],
    threads: int,
) -> list[torch.Tensor]:
    """Block ``b``'s K (``which=0``) or V of layers ``first, first + 1, ...`` of a stacked
    container, one ``[batch, heads, tokens, dim]`` tensor per target (the layers' targets over
    all their tokens, cut to the block here). Only those layers' chunks are read: cut out of
    the block's stream (``speckv.cut_stream``) and decoded against these layers' parameters
    alone. A jointly coded V reads its layers' K residuals in ``outside[b]``, which K's call
    leaves there."""
    data, mu, codes, model = _stacked_job(plan, c, b, which, first, targets, outside)
    got = _api.decode(data, mu, sigma_codes=codes, threads=threads, joint=model)
    return _stacked_result(plan, got, mu, b, which, len(targets), outside)


def _decode_layer(
    plan: CodingPlan, c: container.Container, b: int, layer: int, targets: list[Target]
) -> list[torch.Tensor]:
    """Block ``b``'s K and V of one layer (per-layer layout; ``targets``: the layer's K and V,
    cut to the block here); empty where the layer holds none of the block's tokens. See
    ``encode_walk._encode_layer``."""
    outside: dict[int, np.ndarray] = {}
    pieces = [decode_piece(plan, c, b, layer, which, t, outside, 1) for which, t in enumerate(targets)]
    return [p for p in pieces if p is not None]


def decode_piece(
    plan: CodingPlan,
    c: container.Container,
    b: int,
    layer: int,
    which: int,
    target: Target,
    outside: dict[int, np.ndarray],
    threads: int,
) -> torch.Tensor | None:
    """Block ``b``'s K (``which=0``) or V of one layer of a per-layer container (``target``:
    the layer's, cut to the block here); None where the layer holds none of the block's
    tokens. A joint layer is channel-major, its V given the block's K residuals, which its K
    leaves in ``outside[b]``."""
    lo, hi = c.layer_range(b, layer)
    if lo == hi:
        return None
    data = c.stream(b, layer, which).data
    job = cut_tokens(target, lo, hi)
    if layer not in plan.joint_layers:
        return _api.decode(data, job.mu, sigma_codes=job.codes, threads=threads)
    _, mu, codes = channel_major(job)
    given = outside.get(b) if which else None
    model = plan.joint_model(which, hi - lo, given, range(layer, layer + 1))
    got = _api.decode(data, mu, sigma_codes=codes, threads=threads, joint=model)
    if which == 0:
        outside[b] = _api.residuals(got, mu).reshape(1, -1, hi - lo)
    return got.transpose(-1, -2)


def decode_layerwise(
    plan: CodingPlan,
    c: container.Container,
    wanted: list[int],
    pipeline: bool | None,
    predictor_threads: int,
    run: Any,
    start_run: Callable[[], Any],
) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """Decodes a layer-wise predictor's container in the walk's order (see ``layerwise``), up
    to the last layer asked for, block by block within each layer. ``run``: the predictor's
    walk over the prompt, already started (e.g. on the next block of a prompt), or None to
    start one with ``start_run`` once the container passed its checks; closed here.

    The layers a run predicts without looking at decoded ones (``independent_layers``: the
    model's own prefix) are decoded either as they are made, overlapped with the predictor's
    forward pass (``pipeline=True``; pays where spare cores exist), or once the forward pass
    ends, a few layers per call on every core (``pipeline=False``: on a machine whose cores the
    forward pass already uses, sharing them slows it more than the decode gains). ``None``
    picks overlap when the machine has more cores than the predictor's threads
    (``predictor_threads``). Either way, the same bits; only a few layers' coding parameters
    are held at a time."""
    stacked = c.layout == "stacked"
    if stacked and any(s is None or s.layers_per_chunk != 1 for block in c.blocks for s in block):
        raise CorruptStreamError("cache container: a layer-wise stream needs whole chunks per layer")
    n_threads = plan.threads
    if pipeline is None:
        pipeline = overlap_pays(predictor_threads)
    out: dict[int, list[torch.Tensor]] = {}
    upto = max(wanted) + 1
    # joint: per block, the keys' residuals of the layers being decoded (the values'
    # outside channels)
    outside: dict[int, np.ndarray] = {}

    def prepare(layer: int, which: int, pred: torch.Tensor) -> Target:
        return plan.target(layer, which, last_tokens(pred, c.held(layer), layer))

    def decode(first: int, which: int, targets: list[Target], n: int) -> list[torch.Tensor]:
        """K or V of layers first.., every block of each joined."""

        def block(b: int, n: int) -> list[torch.Tensor]:
            if stacked:
                return decode_stacked(plan, c, b, which, first, targets, outside, n)
            piece = decode_piece(plan, c, b, first, which, targets[0], outside, n)
            return [] if piece is None else [piece]

        if stacked and len(c.blocks) > 1:
            # every token block's stream in one call, spread over the threads (a jointly
            # coded layer is one chunk, which one thread decodes; a block's values read only
            # its own keys' residuals)
            jobs = [_stacked_job(plan, c, b, which, first, targets, outside) for b in range(len(c.blocks))]
            got = _api.decode_many(jobs, n)
            blocks = [
                _stacked_result(plan, words, job[1], b, which, len(targets), outside)
                for b, (words, job) in enumerate(zip(got, jobs))
            ]
        elif plan.joint and len(c.blocks) > 1 and n > 1:
            # a jointly coded layer is one chunk, which one thread decodes: spread the
            # token blocks over the threads instead (a block's values read only its own
            # keys' residuals)
            share = max(1, n // len(c.blocks))
            blocks = parallel(lambda b: block(b, share), list(range(len(c.blocks))), n)
        else:
            blocks = [block(b, n) for b in range(len(c.blocks))]
        return [join([blk[i] for blk in blocks if blk]) for i in range(len(targets))]

    if run is None:
        run = start_run()
    if hasattr(run, "threads"):
        # the maps after the forward pass take the decoder's threads (the same bits on any)
        run.threads = n_threads
    quiet = contextlib.ExitStack()
    try:
        start = 0
        independent = int(getattr(run, "independent_layers", 0))
        free = min(independent, upto) if stacked and not pipeline else 0
        if free:
            wait = getattr(run, "wait", None)
            if callable(wait):
                wait()  # the forward pass first: it has the cores
            # a few layers a call: chunks enough for every thread
            per_layer = min(s.chunks_per_layer for block in c.blocks for s in block if s is not None)
            span = max(1, -(-n_threads // per_layer))
            for first in range(0, free, span):
                layers = range(first, min(first + span, free))
                for which in (0, 1):
                    targets = [prepare(layer, which, run.predict(layer, which)) for layer in layers]
                    for layer, value in zip(layers, decode(first, which, targets, n_threads)):
                        out.setdefault(layer, []).append(value)
                for layer in layers:
                    for which in (0, 1):
                        run.observe(layer, which, plan.observed(layer, which, out[layer][which]))
            start = free
        for layer in range(start, upto):
            if layer == independent:
                quiet.enter_context(quiet_torch(run))
                if stacked:
                    pieces = [_Piece(c, b, outside) for b in range(len(c.blocks))]
                    split = split_walk(plan, run, pieces, range(layer, upto), n_threads)
                    if split is not None:
                        for at in range(layer, upto):
                            out[at] = [join([got[at][which] for got in split]) for which in (0, 1)]
                        break
            out[layer] = []
            for which in (0, 1):
                target = prepare(layer, which, run.predict(layer, which))
                value = decode(layer, which, [target], n_threads)[0]
                out[layer].append(value.reshape(target.mu.shape))
                run.observe(layer, which, plan.observed(layer, which, out[layer][which]))
    finally:
        quiet.close()
        run.close()
    return {layer: (out[layer][0], out[layer][1]) for layer in wanted}


def decode_blocks_layerwise(
    plan: CodingPlan, cs: list[container.Container], run: Any, pipeline: bool
) -> list[dict[int, tuple[torch.Tensor, torch.Tensor]]]:
    """Consecutive token blocks of one prompt, each its own container of a layer-wise
    predictor's (stacked, one token block, a chunk per layer), decoded in one walk: ``run``
    walks every block's tokens at once (``ModelPrefixPredictor.start(block=...)``), so each
    layer's maps run once over all of them, and each block's part of a layer is decoded from
    its own container against its own part of the prediction (the maps are row by row: the
    same bits as a walk per block; a block that is not raises its stream's
    ``PredictionMismatchError``), with ``plan`` (every block's: one mode, joint or not; a
    jointly coded V reads its own block's K residuals). Every block's every layer; ``run``
    closed here.
    ``pipeline``: as for ``decode_layerwise`` (False: the forward pass first, on this
    thread)."""
    bounds, at = [], 0
    for c in cs:
        if c.layout != "stacked" or len(c.blocks) != 1 or c.layers != cs[0].layers:
            raise CorruptStreamError("cache container: not one token block of a layer-wise stream")
        if any(s is None or s.layers_per_chunk != 1 for s in c.blocks[0]):
            raise CorruptStreamError("cache container: a layer-wise stream needs whole chunks per layer")
        bounds.append((at, at + c.tokens))
        at += c.tokens
    out: list[dict[int, list[torch.Tensor]]] = [{} for _ in cs]
    # joint: per block, its keys' residuals of the layer being decoded (its values' outside)
    outside: list[dict[int, np.ndarray]] = [{} for _ in cs]
    threads = plan.threads
    if hasattr(run, "threads"):
        run.threads = threads
    quiet = contextlib.ExitStack()
    try:
        wait = getattr(run, "wait", None)
        if not pipeline and callable(wait):
            wait()
        independent = int(getattr(run, "independent_layers", 0))
        for layer in range(cs[0].layers):
            if layer == independent:
                quiet.enter_context(quiet_torch(run))
                pieces = [_Piece(c, 0, outside[i], bounds[i][0]) for i, c in enumerate(cs)]
                split = split_walk(plan, run, pieces, range(layer, cs[0].layers), threads)
                if split is not None:
                    for i, got in enumerate(split):
                        for at, kv in got.items():
                            out[i][at] = kv
                    break
            for which in (0, 1):
                # one target over every block's tokens (per scalar: the same bits as each
                # block's own), cut per block
                whole = plan.target(layer, which, run.predict(layer, which))
                targets = [cut_tokens(whole, lo, hi) for lo, hi in bounds]
                jobs = [
                    _stacked_job(plan, c, 0, which, layer, [t], outside[i]) for i, (c, t) in enumerate(zip(cs, targets))
                ]
                # every block's stream of this layer in one call, spread over the threads
                words = _api.decode_many(jobs, threads)
                values = []
                for i, (t, got, job) in enumerate(zip(targets, words, jobs)):
                    value = _stacked_result(plan, got, job[1], 0, which, 1, outside[i])[0]
                    values.append(value.reshape(t.mu.shape))
                    out[i].setdefault(layer, []).append(values[-1])
                run.observe(layer, which, plan.observed(layer, which, torch.cat(values, dim=2)))
    finally:
        quiet.close()
        run.close()
    return [{layer: (kv[0], kv[1]) for layer, kv in blocks.items()} for blocks in out]


@contextlib.contextmanager
def quiet_torch(run: Any) -> Iterator[None]:
    """The walk past a run's independent layers (its maps, one layer at a time): torch on one
    thread once the run's background work is over. A layer's products are small; with more
    threads, torch's workers keep spinning on the cores the decoder's threads need next
    (measured: a layer's decode 1.3 ms instead of 2.4). Thread counts are process-wide in
    torch, so this waits for the forward pass to end first."""
    wait = getattr(run, "wait", None)
    if callable(wait):
        wait()
    with fixed_threads(1):
        yield
