"""The layer-wise maps' arithmetic: ridge regressions fitted in float64 at calibration, then run
as the Rust core's integer maps (``speckv._speckv.LinearMap``, invariant M1 of
``rust/speckv/src/linear_map.rs``) on features quantised with a power-of-two scale each: the
same prediction on every machine, SIMD width and thread count."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import cast

import numpy as np
import torch

from .. import _speckv

# The maps' integer sums on one of the core's threads unless told more: a restore's walk
# gives them the decoder's threads once the model's forward pass is over (``decode_walk``;
# on two cores a map restore 1.15-1.3x faster, AMD Zen 4), fitting and encoding keep one.
MAP_THREADS = 1
# The maps run as integer sums in the speckv core (``speckv._speckv.LinearMap``, invariant M1
# of ``linear_map.rs``): the same prediction on every machine, SIMD width and thread count.
# Features are quantised to 16-bit integers with a power-of-two scale per feature that puts
# the calibration's largest magnitude at MAP_FEATURE_RANGE (8x headroom for other text
# before values clamp); weights to at most MAP_WEIGHT_RANGE per output, so sums of ~1k
# products stay far inside 32 bits.
MAP_FEATURE_RANGE = 2**12
MAP_WEIGHT_RANGE = 2**12
# the largest power-of-two exponent a feature's or an output's scale may have (the core's bound)
MAP_MAX_SHIFT = _speckv.LINEAR_MAP_MAX_SHIFT
# Ridge strengths tried per map, as multiples of the mean diagonal of the features' covariance;
# the one with the smallest out-of-fold error wins.
RIDGE_GRID = (1e-4, 1e-3, 1e-2, 1e-1, 1.0)


def feature_shifts(xs: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per feature (columns of the ``[rows, features]`` tensors ``xs``), the power-of-two
    exponent that puts its largest magnitude at most at MAP_FEATURE_RANGE (int32; 0 for a
    feature that is always 0)."""
    if not xs or xs[0].shape[1] == 0:
        return torch.zeros(0, dtype=torch.int32)
    amax = torch.stack([x.abs().amax(0) for x in xs]).amax(0).double().tolist()
    out = []
    for a in amax:
        if not a > 0 or not math.isfinite(a):
            out.append(0)
            continue
        _, e = math.frexp(MAP_FEATURE_RANGE / a)  # exact: MAP_FEATURE_RANGE / a < 2^e
        out.append(max(-MAP_MAX_SHIFT, min(MAP_MAX_SHIFT, e - 1)))
    return torch.tensor(out, dtype=torch.int32)


def integer_map(weight: torch.Tensor, bias: torch.Tensor, shift: torch.Tensor) -> _speckv.LinearMap:
    """The calibrated map ``y = bias + x @ weight`` (float32) as the core's integer map for
    features quantised with ``shift``: weights scaled exactly (powers of two) and rounded half
    to even, in numpy's float64 (the same integers on every machine), with per output the
    largest power of two that keeps them within MAP_WEIGHT_RANGE."""
    features, outputs = weight.shape
    sh = shift.numpy().astype(np.int64)
    w = np.ldexp(weight.double().numpy(), -sh[:, None])  # the weights of the integer features
    amax = np.abs(w).max(axis=0)
    _, e = np.frexp(np.where(amax > 0, MAP_WEIGHT_RANGE / np.where(amax > 0, amax, 1.0), 1.0))
    scale = np.clip(np.where(amax > 0, e - 1, 0), -MAP_MAX_SHIFT, MAP_MAX_SHIFT).astype(np.int64)
    # within MAP_WEIGHT_RANGE unless an exponent hit MAP_MAX_SHIFT: clipped, never wrapped
    q = np.clip(np.rint(np.ldexp(w, scale[None, :])), -32767, 32767).astype(np.int16)
    return _speckv.LinearMap(
        int(features),
        int(outputs),
        np.ascontiguousarray(sh, dtype=np.int32),
        np.ascontiguousarray(q.reshape(-1)),
        np.ascontiguousarray(bias.float().numpy()),
        np.ascontiguousarray(scale, dtype=np.int32),
    )


def apply_map(m: _speckv.LinearMap, x: torch.Tensor, threads: int = MAP_THREADS) -> torch.Tensor:
    """An integer map on ``x`` (``[rows, features]``): ``[rows, outputs]`` float32, summed on
    ``threads`` of the core's threads (the same bits on any number, invariant M1)."""
    x = x.float().contiguous()
    y = m.apply(x.reshape(-1).numpy(), int(x.shape[0]), threads)
    return torch.from_numpy(y).reshape(x.shape[0], m.outputs)


def rows_after(x: torch.Tensor, batch: int, m: int) -> torch.Tensor:
    """Rows ``[batch * positions, f]`` without each batch entry's first ``m`` positions."""
    if m == 0:
        return x
    kept = x.reshape(batch, x.shape[0] // batch, x.shape[-1])[:, m:]
    return kept.reshape(kept.shape[0] * kept.shape[1], x.shape[-1])


def first_rows(x: torch.Tensor, batch: int, m: int) -> torch.Tensor:
    """Rows ``[batch * positions, f]`` of each batch entry's first ``m`` positions."""
    first = x.reshape(batch, x.shape[0] // batch, x.shape[-1])[:, :m]
    return first.reshape(first.shape[0] * first.shape[1], x.shape[-1])


def ridge_fit(
    xs: list[torch.Tensor], ys: list[torch.Tensor], folds: list[list[int]]
) -> tuple[torch.Tensor, torch.Tensor, list[tuple[torch.Tensor, torch.Tensor]]]:
    """Ridge regression of ys on xs (lists per prompt, float32) with a bias. The strength is
    picked from RIDGE_GRID by out-of-fold squared error over ``folds`` (lists of prompt
    indices); returns the fit on everything and, per fold, the fit without it."""
    # sums per fold, in float64: x'x, x'y, x, y, count
    stats: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, int]] = []
    for members in folds:
        x = torch.cat([xs[p] for p in members]).double()
        y = torch.cat([ys[p] for p in members]).double()
        stats.append((x.T @ x, x.T @ y, x.sum(0), y.sum(0), x.shape[0]))

    def solve(parts: list[int], alpha: float) -> tuple[torch.Tensor, torch.Tensor]:
        # Python's sum, in fold order (the calibration's maps depend on the order of additions)
        xx, xy, sx, sy = (cast(torch.Tensor, sum(stats[i][j] for i in parts)) for j in range(4))
        count = sum(stats[i][4] for i in parts)
        mx, my = sx / count, sy / count
        if xx.shape[0] == 0:  # no features (a fallback map with no source): the mean alone
            return torch.zeros(0, my.shape[0]), my.float().contiguous()
        cov = xx - count * torch.outer(mx, mx)
        cxy = xy - count * torch.outer(mx, my)
        lam = alpha * float(cov.diagonal().mean().clamp(min=1e-30))
        w = torch.linalg.solve(cov + lam * torch.eye(cov.shape[0], dtype=cov.dtype), cxy)
        b = my - mx @ w
        return w.float().contiguous(), b.float().contiguous()

    everything = list(range(len(folds)))
    if len(folds) < 2:
        w, b = solve(everything, RIDGE_GRID[2])
        return w, b, [(w, b)]
    best: tuple[float, float, list[tuple[torch.Tensor, torch.Tensor]]] | None = None
    for alpha in RIDGE_GRID:
        fits = [solve([j for j in everything if j != i], alpha) for i in everything]
        err = 0.0
        for (w, b), members in zip(fits, folds):
            for p in members:
                err += float(((torch.addmm(b, xs[p], w) - ys[p]) ** 2).sum())
        if best is None or err < best[0]:
            best = (err, alpha, fits)
    assert best is not None  # RIDGE_GRID is not empty
    _, alpha, fits = best
    w, b = solve(everything, alpha)
    return w, b, fits
