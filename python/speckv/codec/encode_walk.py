"""The encoder's walk: a cache and its prediction, layer by layer, into a cache container's
streams (stacked: per block one stream of every layer's K and one of V; per-layer: a stream
per layer, block and K/V), as a ``CodingPlan`` says, holding a few layers' targets at a time."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable
from typing import Any

import torch

from .. import _api, container
from ..models.cache import KV, last_tokens
from .block_layout import (
    CHUNKS_PER_LAYER,
    LAYERS_PER_CHUNK,
    MAX_CHUNK,
    block_size,
    choose_layout,
    held,
    parallel,
    per_layer_batch,
)
from .kernels import CUDA, HOST, codes_on_gpu
from .plan import CodingPlan
from .target import Target, channel_major, cut_tokens, stack


def encode_container(
    plan: CodingPlan,
    kv: KV,
    prediction: Iterable[tuple[torch.Tensor, torch.Tensor]],
    metadata: dict[str, Any],
    requested_block: int | None,
) -> bytes:
    """The container of ``kv`` coded by ``plan`` against ``prediction`` (per layer ``(K, V)``,
    in cache units), consumed layer by layer: a few layers' targets are held at a time, never
    the whole cache's. A block's stacked stream is coded a group of layers (whole chunks) at a
    time and the groups' streams joined (``speckv.join_streams``: the bytes of one call over
    every layer)."""
    layout = choose_layout([t for pair in kv for t in pair])
    tokens_held = held(kv)
    tokens = max(tokens_held)
    block = block_size(requested_block, tokens)
    starts = list(range(0, tokens, block))
    n_layers = len(kv)
    layers = iter(prediction)
    first = next(layers, None)
    if first is None:
        raise ValueError(f"prediction: no layers, the cache has {n_layers}")
    # the GPU coder (speckv.cuda.encode) where cache and prediction are on a GPU the CUDA
    # module runs on: only coded bytes cross to the host. The exact model (the fast one
    # codes on the host); the bytes are the host's either way.
    if layout == "stacked" and plan.model == "exact" and codes_on_gpu(kv, [first], plan.params.device):
        plan = dataclasses.replace(plan, on_device=True)
    device = kv[0][0].device
    if layout == "stacked":
        # whole chunks per group: a whole-prompt predictor's chunks hold LAYERS_PER_CHUNK
        # layers (or one), a layer-wise one's a layer (or half)
        group = 1 if plan.layerwise else LAYERS_PER_CHUNK
    else:
        # enough streams at once for every thread
        group = per_layer_batch(plan.threads, len(starts))
    # per block: stacked, K's and V's streams of each group; per layer, every stream
    streams: list[list[Any]] = [[[], []] if layout == "stacked" else [] for _ in starts]
    pending: list[tuple[int, Target, Target]] = []
    count = 0
    for layer, (pk, pv) in enumerate(itertools.chain([first], layers)):
        if layer >= n_layers:
            raise ValueError(f"prediction: more layers than the cache's {n_layers}")
        jobs = []
        for which, (t, p) in enumerate(((kv[layer][0], pk), (kv[layer][1], pv))):
            p = last_tokens(p, tokens_held[layer], layer)
            if tuple(t.shape) != tuple(p.shape):
                raise ValueError(f"cache: layer {layer} has shape {tuple(t.shape)}, prediction {tuple(p.shape)}")
            if plan.on_device and p.device != device:
                p = p.to(device)
            jobs.append(plan.target(layer, which, p, t))
        pending.append((layer, jobs[0], jobs[1]))
        count += 1
        if len(pending) < group and layer + 1 < n_layers:
            continue
        if layout == "stacked":
            for b, start in enumerate(starts):
                part = [cut_tokens(job, start, start + block) for _, k, v in pending for job in (k, v)]
                first_layer = pending[0][0]
                coded = _encode_stacked(plan, part, range(first_layer, first_layer + len(pending)))
                streams[b][0].append(coded[0])
                streams[b][1].append(coded[1])
        else:
            # per layer: the block's tokens that each layer holds (none: no stream)
            pieces = []
            for b, start in enumerate(starts):
                for lay, k, v in pending:
                    lo, hi = container.held_range(start, min(start + block, tokens), tokens, tokens_held[lay])
                    pieces.append((b, lay, cut_tokens(k, lo, hi), cut_tokens(v, lo, hi)))
            coded = parallel(lambda p: _encode_layer(plan, p[1], p[2], p[3]), pieces, plan.threads)
            for (b, _, _, _), pair in zip(pieces, coded):
                streams[b].extend(pair)
        pending = []
    if count != n_layers:
        raise ValueError(f"prediction: {count} layers, the cache has {n_layers}")
    if layout == "stacked":
        blocks = []
        for kv_streams in streams:  # each group's streams let go once joined
            blocks.append([_api.join_streams(kv_streams[0]), _api.join_streams(kv_streams[1])])
            kv_streams.clear()
    else:
        blocks = streams
    if plan.joint:
        metadata = {**metadata, "joint": True}
    return container.pack(metadata, layout, n_layers, block, tokens, blocks, tokens_held)


def _encode_stacked(plan: CodingPlan, jobs: list[Target], layers: range) -> list[bytes]:
    """A block's keys, then its values, of ``layers`` (``jobs``: their K, V, K, V, ...), each
    one stream of those layers, which ``encode_container`` joins with the other groups' into
    one stream of every layer: a stream per layer would cost ~0.5% of an fp8 cache in headers,
    a chunk per layer ~0.07%. Whole-prompt predictors: LAYERS_PER_CHUNK layers a chunk; a
    layer-wise predictor decodes layer by layer: CHUNKS_PER_LAYER chunks a layer, so one
    layer's decode still spreads over cores. With the joint model each layer is stored
    channel-major and coded as a whole (its channels follow each other), the values
    conditioned on the keys' residuals. With ``plan.on_device`` the jobs' tensors are on a
    GPU and the GPU coder codes them there (``kernels.CudaKernels``)."""
    layer = [jobs[which].mu.numel() for which in (0, 1)]
    per_chunk = 1 if plan.layerwise else max(1, min(LAYERS_PER_CHUNK, MAX_CHUNK // max(layer)))
    split = plan.layerwise and not plan.joint and all(n % CHUNKS_PER_LAYER == 0 for n in layer)
    per_layer = CHUNKS_PER_LAYER if split else 1
    coder = CUDA if plan.on_device else HOST
    streams = []
    outside = None
    for which in (0, 1):
        mine = jobs[which::2]
        if plan.joint:
            mine = [channel_major(job) for job in mine]
        job = stack(mine)
        size = per_chunk * layer[which] // per_layer
        joint = None
        if plan.joint:
            joint = plan.joint_model(which, int(job.mu.shape[-1]), outside, layers)
        data, residuals = coder.encode(job, joint, size, plan.threads, plan.model, plan.joint and which == 0)
        streams.append(data)
        if residuals is not None:  # the values condition on these
            outside = residuals
    return streams


def _encode_layer(plan: CodingPlan, layer: int, k: Target, v: Target) -> tuple[bytes, bytes]:
    """A block's stream of one layer's K and of its V (per-layer layout; ``b""`` where the
    layer holds none of the block's tokens). With the joint model where the calibration has
    one for the layer, both channel-major, each one chunk, V conditioned on K's residuals;
    else each scalar on its own."""
    model = plan.model
    if k.mu.shape[2] == 0:
        return b"", b""
    if layer not in plan.joint_layers:
        return (
            _api.encode(k.x, k.mu, sigma_codes=k.codes, threads=1, model=model),
            _api.encode(v.x, v.mu, sigma_codes=v.codes, threads=1, model=model),
        )
    out, outside = [], None
    for which, job in enumerate((k, v)):
        x, mu, codes = channel_major(job)
        tokens = int(mu.shape[-1])
        joint = plan.joint_model(which, tokens, outside, range(layer, layer + 1))
        out.append(_api.encode(x, mu, sigma_codes=codes, threads=1, chunk_size=mu.numel(), model=model, joint=joint))
        outside = _api.residuals(x, mu).reshape(1, -1, tokens)
    return out[0], out[1]
