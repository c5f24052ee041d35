"""How many of a model's layers a ``ModelPrefixPredictor`` can run within a restore budget
(a multiple of the model's own prefill), measured on this machine."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from .. import _api, _arrays
from ..models.cache import prefill
from .early_exit import DEFAULT_THREADS, HISTORY, ModelPrefixPredictor
from .linear_map import apply_map, feature_shifts, integer_map


def layers_for_budget(
    model: Any, input_ids: torch.Tensor, budget: float = 1.0, *, threads: int = DEFAULT_THREADS, repeat: int = 2
) -> tuple[int, list[float]]:
    """The most of ``model``'s layers a ``ModelPrefixPredictor`` can run while a restore of
    ``input_ids`` is expected to cost at most ``budget`` times the model's own prefill, measured
    here: the prefill, the forward pass up to each layer (on ``threads`` threads), one layer's
    maps and one layer's decode on synthetic data of the cache's shape. Returns that number of
    layers (at least 1) and the estimated restore cost of each choice ``1..n_layers`` (x prefill).

    The estimate is what the restore does: the prefix's forward pass, its layers decoded at once
    on every core, then per later layer two map products and two one-layer decodes. It leaves
    out the fixed costs of a restore (checks, building the cache, torch's thread hand-overs): on
    the demo model it is 0.1-0.15x of the prefill below the measured restore, so leave that
    margin, and check a choice with the trade-off table (``speckv eval --predictors ...``)."""

    n = int(model.config.num_hidden_layers)

    def best(fn: Callable[[], Any]) -> float:
        times = []
        for _ in range(max(1, repeat)):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        return min(times)

    full = prefill(model, input_ids)
    base = best(lambda: prefill(model, input_ids))
    forward = [float("inf")] * n
    whole = ModelPrefixPredictor(model, n, threads=threads)
    for _ in range(max(1, repeat)):
        marks: list[float] = []  # when each layer's cache was written
        start = time.perf_counter()

        def mark(layer: int, k: torch.Tensor, v: torch.Tensor, marks: list[float] = marks) -> None:
            marks.append(time.perf_counter())

        whole.prefix(input_ids, mark)
        forward = [min(a, t - start) for a, t in zip(forward, marks)]
    # one layer of K (V alike): decode, alone and in bulk, and the maps' products
    k = full[0][0]
    shape, numel = tuple(k.shape), k.numel()
    g = np.random.default_rng(0)
    mu = g.standard_normal((n, numel)).astype(np.float32)
    x = (mu + 0.05 * g.standard_normal(mu.shape)).astype(_arrays.numpy_dtype("bfloat16"))
    sigma = np.full(1, 0.05, dtype=np.float32)
    per = 2 if numel % 2 == 0 else 1
    data = _api.encode(x, mu, sigma, chunk_size=numel // per)
    one = best(lambda: _api.decode(data, mu, sigma, chunks=(0, per)))
    bulk = best(lambda: _api.decode(data, mu, sigma))  # all n layers at once
    width = shape[1] * shape[3]
    feats = torch.randn(shape[0] * shape[2], 2 * HISTORY * width)
    both = integer_map(torch.randn(2 * HISTORY * width, 2 * width), torch.zeros(2 * width), feature_shifts([feats]))
    own = integer_map(torch.randn(width, width), torch.zeros(width), feature_shifts([feats[:, :width]]))
    maps = best(lambda: (apply_map(both, feats), apply_map(own, feats[:, :width])))
    # the walk's own work on each tensor: mu and sigma of the codec's targets, sigma codes, the
    # observed copy (``CodingParams.measured``, ``decode_walk.decode_layerwise``)
    kf, rel = k.float(), torch.rand(shape[1], shape[3])[None, :, None, :]
    buf = np.zeros(shape, dtype=np.int16)

    def walk_step() -> None:
        mu_t = kf / 1.5
        torch.sqrt(rel * rel + (rel * mu_t) ** 2)
        buf[...] = _api.sigma_codes(rel)
        k.to(torch.bfloat16).float()

    step = best(walk_step)
    costs = []
    for m in range(1, n + 1):
        restore = forward[m - 1] + 2 * bulk * m / n + (n - m) * 2 * (one + maps / 2) + 2 * n * step
        costs.append(restore / base)
    fitting = [m for m in range(1, n + 1) if costs[m - 1] <= budget]
    return (max(fitting) if fitting else 1), costs
