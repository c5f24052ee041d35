"""Layer-wise prediction: predictors that may look at the layers already decoded.

A whole-prompt predictor (``Predictor``) maps ``input_ids`` to a predicted cache before any
decoding starts. A layer-wise predictor instead opens a ``LayerRun`` for a prompt, and the
codec walks the cache in a fixed order, on both sides::

    for layer in range(n_layers):
        for which in (0, 1):                   # K, then V
            mu = run.predict(layer, which)     # may use everything observed so far
            ... code (or decode) that tensor against mu ...
            run.observe(layer, which, value)   # the stored tensor, in cache units (float32)

so the prediction of layer ``l``'s K may use layers ``< l``, and its V may also use its K.
A run may also say how many leading layers it predicts without looking at anything observed
(``independent_layers``: the codec may then decode those in bulk) and have ``wait()``, which
returns once its background work (a forward pass on another thread) is over.
The encoder observes the true (stored) tensors, the decoder the decoded ones: the same bits,
so the same predictions. ``decompress_layer(l)`` of such a stream decodes layers ``0..l``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import torch

from ..models.cache import KV

if TYPE_CHECKING:
    from typing_extensions import TypeIs


@runtime_checkable
class LayerRun(Protocol):
    """One prompt's walk through the layers (see the module docs for the order)."""

    def predict(self, layer: int, which: int) -> torch.Tensor: ...

    def observe(self, layer: int, which: int, value: torch.Tensor) -> None: ...

    def close(self) -> None: ...


@runtime_checkable
class LayerwisePredictor(Protocol):
    """A predictor that opens a ``LayerRun`` per prompt."""

    def start(self, input_ids: torch.Tensor) -> LayerRun: ...


class WholeRun:
    """A ``LayerRun`` over a prediction made before the walk (observations are not used)."""

    def __init__(self, prediction: KV) -> None:
        self.prediction = prediction

    def predict(self, layer: int, which: int) -> torch.Tensor:
        return self.prediction[layer][which]

    def observe(self, layer: int, which: int, value: torch.Tensor) -> None:
        pass

    def close(self) -> None:
        pass


def is_layerwise(predictor: object) -> TypeIs[LayerwisePredictor]:
    return callable(getattr(predictor, "start", None))


def overlap_pays(predictor_threads: int) -> bool:
    """Whether a walk should code layers while its predictor's forward pass runs: where the
    machine has more cores than the pass's torch threads. Elsewhere the pass runs first, on
    the walk's own thread (``wait``), and the coding after it: sharing the cores slows the
    pass more than the overlap gains, and torch on the caller's thread reuses its OpenMP
    workers (a new thread's pass: ~1.6x slower on a 2-core Intel Xeon)."""
    return (os.cpu_count() or 1) > predictor_threads


def walk_layers(
    run: LayerRun,
    kv: KV,
    observed: Callable[[int, int, torch.Tensor], torch.Tensor],
    past_independent: Callable[[LayerRun], contextlib.AbstractContextManager[Any]] | None = None,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """The encoder's walk, a layer at a time: ``run``'s prediction of each layer's K and V
    (float32), observing ``observed(layer, which, true tensor)`` after each (a caller that
    codes each layer as it comes holds one layer's prediction, not the cache's).
    ``past_independent(run)`` is entered once the run's ``independent_layers`` are done (the
    codec quiets torch there). Closes ``run`` when done or closed."""
    independent = int(getattr(run, "independent_layers", 0))
    with contextlib.ExitStack() as stack:
        stack.callback(run.close)
        for layer, pair in enumerate(kv):
            if layer == independent and past_independent is not None:
                stack.enter_context(past_independent(run))
            got = []
            for which, t in enumerate(pair):
                got.append(run.predict(layer, which).float())
                run.observe(layer, which, observed(layer, which, t))
            yield got[0], got[1]


def walk(
    run: LayerRun,
    kv: KV,
    observed: Callable[[int, int, torch.Tensor], torch.Tensor],
    past_independent: Callable[[LayerRun], contextlib.AbstractContextManager[Any]] | None = None,
) -> KV:
    """``walk_layers`` to the end: every layer's prediction."""
    return list(walk_layers(run, kv, observed, past_independent))


__all__ = ["LayerRun", "LayerwisePredictor", "WholeRun", "is_layerwise", "overlap_pays", "walk", "walk_layers"]
