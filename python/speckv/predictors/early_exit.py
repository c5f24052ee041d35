"""``ModelPrefixPredictor``: the model's own first layers, then learned maps from the layers
already decoded.

Restoring a cache with a full quantised copy of the model costs several prefills on a CPU.
Most of what a deep layer's K and V hold is already in the layers below it, which the decoder
has at hand when it gets there (see ``layerwise``). So this predictor:

- runs the model itself, unchanged, on the prompt for its first ``layers`` layers (the forward
  pass stops right after layer ``layers - 1`` has written its K and V), on a fixed number of
  torch threads recorded in the stream. Under the same kernels as the cache's producer these
  layers are predicted exactly; under others (other attention kernels, another machine or
  engine) to within a few ulps, growing with depth.
- predicts every later layer with ridge-regression maps from the decoded previous two layers
  (K un-RoPEd first, so that position does not scramble the channels, and the predicted K
  RoPEd again); V's map also sees the decoded K of its own layer. Calibration fits the maps
  (``fit``) and stores them with the sigmas, measured on out-of-fold predictions so they are
  honest about text the maps never saw. The maps run as integer sums in the Rust core
  (``integer_map``; invariant M1 of ``linear_map.rs``) on RoPE tables computed exactly, so a
  decoder on another machine, SIMD width or thread count rebuilds the encoder's prediction.
  With ``hidden=True`` they also read the hidden state the last run layer hands on.

``layers=1`` is the map-only predictor: layer 0 is a function of the token ids alone (computed
exactly as the model does), everything above comes from maps. ``layers=n_layers`` runs the
whole model: predictions are then exact under the producer's kernels.

The forward pass runs on a background thread, so that a decoder may code layer ``l`` while the
model computes layer ``l + 1`` (``decompress(pipeline=True)``); maps run on the calling thread
after the forward pass has finished (torch's thread count is process-wide: it is never changed
while another thread computes). ``PrefixState`` runs a prompt block by block (the prefix store).

This module holds the predictor itself; its parts live beside it: the forward pass
(``prefix_pass``), one prompt's walk (``prefix_run``), what the maps read (``map_sources``)
and how they are fitted (``map_fit``).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..models.architecture import layer_windows, text_config
from ..models.cache import KV, cache_argument
from .base import decoder_layers
from .cost import default_prefix_layers as counted
from .linear_map import MAP_FEATURE_RANGE, MAP_THREADS, apply_map, first_rows, integer_map
from .map_fit import fit_maps
from .map_sources import (
    HISTORY,
    Observed,
    _fallback_sources,
    _features,
    _hidden_source,
    _missing,
    _sources,
    apply_to_sources,
    heads_of,
)
from .prefix_pass import PrefixState, run_prefix
from .prefix_run import _PrefixRun
from .rope import Ropes

# torch threads of the prefix's forward pass (recorded in streams; a fixed number, so that a
# decoder on another machine makes the same predictions whatever its core count)
DEFAULT_THREADS = 2
# Tokens per step of the prefix's forward pass on longer inputs (chunked prefill, the cache
# carried from step to step, as serving engines run it): its activations stay a step's, not a
# prompt's (Qwen2.5-0.5B at 4,096 tokens: 1.1x the cache's size instead of 6x; the same
# time). Recorded in the predictor's description: it changes the bits of longer inputs.
PREFILL_CHUNK = 512


def default_prefix_layers(model: Any) -> int:
    """How many of ``model``'s layers the default ``ModelPrefixPredictor`` runs: the most
    whose restore, counted from the config, fits the budget (``cost.default_prefix_layers``:
    20 of the demo model's 30 layers, 20 of Qwen2.5-0.5B's 24, 12 of Gemma-3-270M's 18)."""
    return counted(text_config(model))


class ModelPrefixPredictor:
    """The model's first ``layers`` layers, run as the model runs them (its dtype, ``threads``
    torch threads), and calibrated maps for the rest (see the module docs).

    >>> from speckv.hf import ModelPrefixPredictor, SpeculativeCodec   # doctest: +SKIP
    >>> codec = SpeculativeCodec(model, predictor=ModelPrefixPredictor(model, layers=15))  # doctest: +SKIP
    >>> codec.calibrate(samples)   # runs the model and fits the maps   # doctest: +SKIP
    """

    def __init__(
        self,
        model: Any,
        layers: int | None = None,
        *,
        threads: int = DEFAULT_THREADS,
        prefill_chunk: int = PREFILL_CHUNK,
        hidden: bool = False,
    ) -> None:
        n = int(model.config.num_hidden_layers)
        if layers is None:
            layers = default_prefix_layers(model)
        if not 1 <= layers <= n:
            raise ValueError(f"layers: expected 1..{n} (the model has {n} layers), got {layers}")
        if threads < 1:
            raise ValueError(f"threads: must be at least 1, got {threads}")
        if isinstance(prefill_chunk, bool) or not isinstance(prefill_chunk, int) or prefill_chunk < 1:
            raise ValueError(f"prefill_chunk: expected a positive int, got {prefill_chunk!r}")
        self.prefill_chunk = prefill_chunk
        decoder_layers(model)
        self._cache_kw = cache_argument(model)
        self.model = model
        self.layers = int(layers)
        self.threads = int(threads)
        self.n_layers = n
        # earlier layers each map reads (what ``cost.predictor_flops`` counts)
        self.history = HISTORY
        # whether the maps also read the hidden state the model's last run layer hands on (the
        # forward pass then ends that layer): what maps from K and V lack most at the cheap
        # end, for one layer's attention and MLP more and a wider product (README, "The cheap
        # end"); never without maps
        self.hidden = bool(hidden) and self.layers < n
        # per layer, its sliding window (None: full attention); fallback maps where a map's
        # sources may lack tokens its layer holds (``_fallback_sources``)
        self.windows = layer_windows(text_config(model))
        self.maps: dict[str, torch.Tensor] = {}
        self._joint_maps: dict[int, tuple[Any, Any]] = {}
        self._fallback_maps: dict[tuple[int, int], Any] = {}

    # -- identity ------------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        dtype = next(self.model.parameters()).dtype
        return {
            "name": "model-prefix",
            "layers": self.layers,
            "threads": self.threads,
            "prefill_chunk": self.prefill_chunk,
            "compute_dtype": str(dtype).replace("torch.", ""),
            "maps": f"ridge, previous {HISTORY} layers, K un-RoPEd, V given K",
            "map_compute": f"int16 features x int16 weights, int32 sums (speckv core), features to {MAP_FEATURE_RANGE}",
            "torch": torch.__version__,
            # only for models with sliding windows, so other models' descriptions stay as they were
            **({"windows": "fallback maps where a source left its window"} if self._windowed() else {}),
            # only where the maps read it, so other descriptions stay as they were
            **({"hidden": f"maps also read the hidden state after layer {self.layers - 1}"} if self.hidden else {}),
        }

    def _windowed(self) -> bool:
        return any(w is not None for w in self.windows)

    def last_reader(self) -> dict[tuple[int, int], int]:
        """Per observed (layer, K/V), the last layer whose map or fallback map reads it (a
        walk drops it past there; absent: nothing reads it)."""
        last: dict[tuple[int, int], int] = {}
        for layer in range(self.layers, self.n_layers):
            for which in (0, 1):
                for src in self._sources(layer, which) + (self._fallback(layer, which) or []):
                    last[src] = max(last.get(src, -1), layer)
        return last

    def _sources(self, layer: int, which: int) -> list[tuple[int, int]]:
        return _sources(layer, which, self.hidden)

    def _fallback(self, layer: int, which: int) -> list[tuple[int, int]] | None:
        return _fallback_sources(layer, which, self.windows, self.hidden) if self._windowed() else None

    # -- calibration state ---------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        return dict(self.maps)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        missing = [
            f"maps.{layer}.{which}.{part}"
            for layer in range(self.layers, self.n_layers)
            for which in "kv"
            for part in ("weight", "shift")
        ]
        missing += [
            f"maps.{layer}.{'kv'[which]}.fallback_{part}"
            for layer in range(self.layers, self.n_layers)
            for which in (0, 1)
            if self._fallback(layer, which) is not None
            for part in ("weight", "shift")
        ]
        missing = [name for name in missing if name not in state]
        if missing:
            raise ValueError(f"predictor state: missing {missing[0]} (and {len(missing) - 1} more)")
        self.maps = {
            k: (v.to(torch.int32) if k.endswith("shift") else v.float()).contiguous()
            for k, v in state.items()
            if k.startswith("maps.")
        }
        self._joint_maps = {}
        self._fallback_maps = {}

    def digest(self) -> str:
        h = hashlib.blake2b(digest_size=16)
        for name in sorted(self.maps):
            h.update(name.encode())
            h.update(self.maps[name].contiguous().numpy().tobytes())
        return h.hexdigest()

    # -- prediction ----------------------------------------------------------------------
    def prefix(
        self,
        input_ids: torch.Tensor,
        sink: Callable[[int, torch.Tensor, torch.Tensor], None],
        state: PrefixState | None = None,
        hidden: Callable[[torch.Tensor], None] | None = None,
    ) -> None:
        """Runs the model's forward pass on ``threads`` threads until layer ``layers - 1`` has
        written its cache, handing each layer's (K, V) to ``sink`` (``prefix_pass.run_prefix``)."""
        run_prefix(self, input_ids, sink, state, hidden)

    def hidden_state(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The hidden state the maps read for ``input_ids`` (``[batch, 1, tokens, hidden]``,
        float32; ``self.hidden`` only): what the model's layer ``layers - 1`` hands on."""
        if not self.hidden:
            raise ValueError("ModelPrefixPredictor: its maps do not read the hidden state")
        got: list[torch.Tensor] = []
        self.prefix(input_ids, lambda layer, k, v: None, hidden=got.append)
        return _hidden_source(got[0])

    def start(self, input_ids: torch.Tensor, state: PrefixState | None = None, block: int | None = None) -> _PrefixRun:
        """A walk over ``input_ids`` (with ``state``: the next block of a prompt; see
        ``PrefixState``). ``block``: ``input_ids`` are consecutive blocks of that many tokens,
        which the forward pass runs one after another as a walk over each block would (so each
        block's prediction is its own walk's, bit for bit: the maps are row by row)."""
        if self.layers < self.n_layers and not self.maps:
            raise ValueError("ModelPrefixPredictor: the maps are not fitted: calibrate the codec first")
        return _PrefixRun(self, input_ids, state, block)

    def _joint(self, layer: int) -> tuple[Any, Any]:
        """K's map and the part of V's map that reads the previous layers, side by side (one
        integer map: one pass over the features at K's turn), and the part of V's map that
        reads its own layer's K (V's turn)."""
        if layer not in self._joint_maps:
            wk, bk = self.maps[f"maps.{layer}.k.weight"], self.maps[f"maps.{layer}.k.bias"]
            wv, bv = self.maps[f"maps.{layer}.v.weight"], self.maps[f"maps.{layer}.v.bias"]
            shift_k, shift_v = self.maps[f"maps.{layer}.k.shift"], self.maps[f"maps.{layer}.v.shift"]
            f = wk.shape[0]
            both = integer_map(torch.cat([wk, wv[:f]], dim=1), torch.cat([bk, bv]), shift_k)
            own = integer_map(wv[f:], torch.zeros_like(bv), shift_v[f:])
            self._joint_maps[layer] = (both, own)
        return self._joint_maps[layer]

    def map_predict(
        self,
        layer: int,
        which: int,
        observed: Observed,
        ropes: Ropes,
        shape: tuple[int, ...],
        scratch: dict[int, torch.Tensor],
        features: dict[tuple[int, int], torch.Tensor] | None = None,
        threads: int = MAP_THREADS,
    ) -> torch.Tensor:
        """The map's prediction of (layer, which) from the observed tensors, at every position
        of ``shape`` (``[batch, heads, positions, dim]``; a layer holding fewer keeps the last
        ones). K's turn leaves V's partial sum in ``scratch``; ``features``: the walk's sources
        made float32 and laid out by token (``_features``) for the fallback maps (the maps
        themselves read the observed tensors, ``apply_to_sources``); ``threads``: the core's
        threads the integer sums may take. The products are the core's
        integer sums (``integer_map``): the same bits on every machine, and ~2x torch's bf16
        products on one core; their rounding (16-bit features and weights) is far below the
        maps' own error."""
        rows, width = shape[2], shape[1] * shape[3]
        with torch.no_grad():
            both, own = self._joint(layer)
            if which == 0 or layer not in scratch:
                y = apply_to_sources(both, observed, self._sources(layer, 0), ropes, rows, threads)
                scratch[layer] = y[:, width:]
                if which == 0:
                    head = y[:, :width]
                    k = self._fallback_predict(layer, 0, observed, ropes, shape, head, features, threads)
                    # the outputs as they came where no fallback replaced rows: no copy of K's columns
                    return heads_of(y if k is head else k, shape, ropes.of(layer))
            partial = scratch.pop(layer)
            # one correctly rounded addition per scalar: the same bits everywhere
            y = partial + apply_to_sources(own, observed, [(layer, 0)], ropes, rows, threads)
            return heads_of(self._fallback_predict(layer, 1, observed, ropes, shape, y, features, threads), shape)

    def _fallback_predict(
        self,
        layer: int,
        which: int,
        observed: Observed,
        ropes: Ropes,
        shape: tuple[int, ...],
        y: torch.Tensor,
        features: dict[tuple[int, int], torch.Tensor] | None = None,
        threads: int = MAP_THREADS,
    ) -> torch.Tensor:
        """``y`` (the map's prediction, ``[batch * positions, width]``) with the positions some
        source does not hold predicted by the fallback map instead (``_fallback_sources``)."""
        sources = self._fallback(layer, which)
        if sources is None:
            return y
        m = _missing(observed, self._sources(layer, which), shape[2])
        if m == 0:
            return y
        key = (layer, which)
        if key not in self._fallback_maps:
            name = f"maps.{layer}.{'kv'[which]}"
            w, b = self.maps[f"{name}.fallback_weight"], self.maps[f"{name}.fallback_bias"]
            self._fallback_maps[key] = (
                integer_map(w, b, self.maps[f"{name}.fallback_shift"]) if w.shape[0] else b.clone()
            )
        fallback = self._fallback_maps[key]
        out = y.reshape(shape[0], shape[2], -1).clone()
        if isinstance(fallback, torch.Tensor):  # no source holds the tokens: the bias alone
            out[:, :m] = fallback
        else:
            x = first_rows(_features(observed, sources, ropes, shape[2], features), shape[0], m)
            out[:, :m] = apply_map(fallback, x, threads).reshape(shape[0], m, -1)
        return out.reshape(y.shape)

    # -- fitting ---------------------------------------------------------------------------
    def fit(
        self,
        truths: Sequence[KV],
        variants: dict[str, Callable[[int, int, torch.Tensor], torch.Tensor]],
        progress: bool = False,
        hidden_states: Sequence[torch.Tensor] | None = None,
    ) -> dict[str, list[dict[tuple[int, int], torch.Tensor]]]:
        """Fits the maps of layers ``layers..n_layers-1`` on the true caches ``truths`` and
        returns their out-of-fold predictions per ``variants`` entry (``map_fit.fit_maps``)."""
        self.maps, oof = fit_maps(self, truths, variants, progress, hidden_states)
        self._joint_maps = {}
        self._fallback_maps = {}
        return oof


__all__ = ["ModelPrefixPredictor", "PrefixState", "default_prefix_layers"]
