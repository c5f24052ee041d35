"""Fitting a ``ModelPrefixPredictor``'s maps on calibration caches: ridge regression per layer
and tensor (and its fallback map), with out-of-fold predictions for the sigmas."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..models.cache import KV
from .linear_map import feature_shifts, first_rows, ridge_fit, rows_after
from .map_sources import HIDDEN, _features, _missing, _tokens, heads_of
from .rope import Ropes

FOLDS = 4


def fit_maps(
    predictor: Any,
    truths: Sequence[KV],
    variants: dict[str, Callable[[int, int, torch.Tensor], torch.Tensor]],
    progress: bool = False,
    hidden_states: Sequence[torch.Tensor] | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, list[dict[tuple[int, int], torch.Tensor]]]]:
    """The maps of ``predictor`` (a ``ModelPrefixPredictor``) for layers ``layers..n_layers-1``,
    fitted on the true caches ``truths`` (one per calibration prompt), and out-of-fold
    predictions of those layers: for each
    ``variants`` entry (a function turning a true tensor into what the decoder would observe,
    e.g. its fp8 round trip), per prompt, ``{(layer, which): prediction}``. Where the maps
    read the hidden state: ``hidden_states``, per prompt (``hidden_state``)."""
    if predictor.hidden and (hidden_states is None or len(hidden_states) != len(truths)):
        raise ValueError("ModelPrefixPredictor.fit: its maps read the hidden state: give one per prompt")
    n = len(truths)
    folds = [list(range(i, n, FOLDS)) for i in range(min(FOLDS, n))]
    # positions of a prompt: its longest layer's (a sliding layer holds the last ones)
    seqs = [max(k.shape[2] for k, _ in t) for t in truths]
    ropes = [Ropes(predictor.model, s, int(truths[i][0][0].shape[3])) for i, s in enumerate(seqs)]
    # observed tensors per variant and prompt; the fit uses the first variant's
    names = list(variants)
    observed = {
        v: [{(layer, w): f(layer, w, t) for layer, pair in enumerate(kv) for w, t in enumerate(pair)} for kv in truths]
        for v, f in variants.items()
    }
    if predictor.hidden and hidden_states is not None:
        for v in names:
            for p in range(n):
                observed[v][p][HIDDEN] = hidden_states[p]
    oof: dict[str, list[dict[tuple[int, int], torch.Tensor]]] = {v: [{} for _ in range(n)] for v in names}
    jobs = [(layer, which) for layer in range(predictor.layers, predictor.n_layers) for which in (0, 1)]
    iterator: Any = jobs
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(jobs, desc="fitting maps", unit="map")
    maps: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for layer, which in iterator:
            sources = predictor._sources(layer, which)
            fallback = predictor._fallback(layer, which)
            name = f"maps.{layer}.{'kv'[which]}"
            shapes = [tuple(t[layer][which].shape) for t in truths]
            xs = {v: [_features(observed[v][p], sources, ropes[p], shapes[p][2]) for p in range(n)] for v in names}
            ys = []
            for p in range(n):
                t = observed[names[0]][p][layer, which].float()
                ys.append(_tokens(ropes[p].of(layer).unrope(t) if which == 0 else t))
            # the main map learns from the positions every source holds
            miss = [_missing(observed[names[0]][p], sources, shapes[p][2]) for p in range(n)]
            weight, bias, fold_fits = ridge_fit(
                [rows_after(x, shapes[p][0], miss[p]) for p, x in enumerate(xs[names[0]])],
                [rows_after(y, shapes[p][0], miss[p]) for p, y in enumerate(ys)],
                folds,
            )
            maps[f"{name}.weight"], maps[f"{name}.bias"] = weight, bias
            maps[f"{name}.shift"] = feature_shifts(xs[names[0]])
            fallback_fits: list[tuple[torch.Tensor, torch.Tensor]] = []
            fx: dict[str, list[torch.Tensor]] = {}
            if fallback is not None:
                fx = {v: [_features(observed[v][p], fallback, ropes[p], shapes[p][2]) for p in range(n)] for v in names}
                fw, fb, fallback_fits = ridge_fit(fx[names[0]], ys, folds)
                maps[f"{name}.fallback_weight"], maps[f"{name}.fallback_bias"] = fw, fb
                maps[f"{name}.fallback_shift"] = feature_shifts(fx[names[0]])
            for f, ((w_f, b_f), members) in enumerate(zip(fold_fits, folds)):
                for p in members:
                    for v in names:
                        y = torch.addmm(b_f, xs[v][p], w_f)
                        if fallback is not None and miss[p]:
                            fw_f, fb_f = fallback_fits[f]
                            y = y.reshape(shapes[p][0], shapes[p][2], -1)
                            x_f = first_rows(fx[v][p], shapes[p][0], miss[p])
                            y[:, : miss[p]] = torch.addmm(fb_f, x_f, fw_f).reshape(shapes[p][0], miss[p], -1)
                            y = y.reshape(-1, y.shape[-1])
                        rope = ropes[p].of(layer) if which == 0 else None
                        oof[v][p][layer, which] = heads_of(y, shapes[p], rope)
    return maps, oof
