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
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .architecture import layer_windows, text_config
from .cache import KV, cache_argument
from .linear_map import MAP_FEATURE_RANGE, apply_map, feature_shifts, first_rows, integer_map, ridge_fit, rows_after
from .predictors import _decoder_layers, fixed_threads
from .rope import Ropes

# torch threads of the prefix's forward pass (recorded in streams; a fixed number, so that a
# decoder on another machine makes the same predictions whatever its core count)
DEFAULT_THREADS = 2
FOLDS = 4
HISTORY = 2
# The maps' name for that hidden state among their sources (``[batch, 1, tokens, hidden]``).
HIDDEN = (-1, 2)
# Tokens per step of the prefix's forward pass on longer inputs (chunked prefill, the cache
# carried from step to step, as serving engines run it): its activations stay a step's, not a
# prompt's (Qwen2.5-0.5B at 4,096 tokens: 1.1x the cache's size instead of 6x; the same
# time). Recorded in the predictor's description: it changes the bits of longer inputs.
PREFILL_CHUNK = 512


def default_prefix_layers(model: Any) -> int:
    """How many of ``model``'s layers the default ``ModelPrefixPredictor`` runs: the most
    whose restore, counted from the config, fits the budget (``cost.default_prefix_layers``:
    20 of the demo model's 30 layers, 20 of Qwen2.5-0.5B's 24, 12 of Gemma-3-270M's 18)."""
    from .cost import default_prefix_layers as counted

    return counted(text_config(model))


class _Stop(Exception):
    """Raised inside the model's forward pass once the last wanted layer has written its cache."""


def _observing_cache(
    config: Any, stop_after: int, sink: Callable[[int, torch.Tensor, torch.Tensor], None], keep: bool = True
) -> Any:
    """A DynamicCache that hands every layer's new K/V to ``sink`` and stops the forward pass
    after layer ``stop_after - 1``. ``keep=False`` (a forward pass over a whole prompt, whose
    cache nobody reads afterwards): it stores nothing and hands attention the new K/V
    themselves, which are what an empty cache's update returns (the same values, so the same
    bits), without the cache's copy of every layer (as large as the layers' cache)."""
    from transformers import DynamicCache

    class ObservingCache(DynamicCache):
        sink: Callable[[int, torch.Tensor, torch.Tensor], None]

        def update(
            self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kw: Any
        ) -> tuple[torch.Tensor, torch.Tensor]:
            if keep:
                out = super().update(key_states, value_states, layer_idx, *args, **kw)
            else:
                out = (key_states, value_states)
            self.sink(layer_idx, key_states, value_states)
            if layer_idx + 1 >= stop_after:
                raise _Stop
            return out

    cache = ObservingCache(config=config)
    cache.sink = sink
    return cache


class PrefixState:
    """What a ``ModelPrefixPredictor`` carries from one token block to the next (the prefix
    store codes a prompt block by block): the cache its forward pass wrote for the earlier
    blocks (its own layers only) and their length. A block's predictions then depend on the
    tokens up to its end alone, and are the same whoever runs the blocks in the same order."""

    def __init__(self) -> None:
        self.cache: Any = None
        self.tokens = 0


def _hidden_source(h: torch.Tensor) -> torch.Tensor:
    """A hidden state ``[batch, tokens, hidden]`` as the maps' source HIDDEN: ``[batch, 1,
    tokens, hidden]`` float32 (one "head" of ``hidden`` channels)."""
    return h.float()[:, None]


def _tokens(t: torch.Tensor) -> torch.Tensor:
    """[batch, heads, seq, dim] -> [batch * seq, heads * dim]."""
    b, h, s, d = t.shape
    return t.permute(0, 2, 1, 3).reshape(b * s, h * d)


def _untokens(x: torch.Tensor, like: tuple[int, ...]) -> torch.Tensor:
    b, h, s, d = like
    return x.reshape(b, s, h, d).permute(0, 2, 1, 3).contiguous()


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


def _features(observed: Observed, sources: list[tuple[int, int]], ropes: Ropes, rows: int) -> torch.Tensor:
    """The map's inputs at the last ``rows`` positions, ``[batch * rows, features]``: each
    source's K (un-RoPEd) or V there, zero where the source does not hold the position (see
    ``_missing``)."""
    cols = []
    for src, w in sources:
        t = observed[src, w].float()
        t = ropes.of(src).unrope(t) if w == 0 else t
        n = t.shape[2]
        if n > rows:
            t = t[:, :, n - rows :]
        elif n < rows:
            t = torch.nn.functional.pad(t, (0, 0, rows - n, 0))
        cols.append(_tokens(t))
    if not cols:
        b = next(iter(observed.values())).shape[0] if observed else 1
        return torch.zeros(b * rows, 0)
    return torch.cat(cols, dim=1)


def _missing(observed: Observed, sources: list[tuple[int, int]], rows: int) -> int:
    """How many of the last ``rows`` positions some source does not hold (the first ones:
    every layer holds the last tokens)."""
    held = [observed[src, w].shape[2] for src, w in sources]
    return max(0, rows - min(held)) if held else 0


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
        _decoder_layers(model)
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
        written its cache, handing each layer's (K, V) of every position of ``input_ids`` to
        ``sink`` once, as it is made; where the maps read the hidden state (``self.hidden``),
        until that layer has ended, handing its output (``[batch, tokens, hidden]``) to
        ``hidden``. With ``state``, ``input_ids`` continues the blocks run before (see
        ``PrefixState``). Inputs longer than ``prefill_chunk`` tokens run in steps of that
        many (``PREFILL_CHUNK``); their layers and hidden state reach the sinks in the last
        step."""
        n = int(input_ids.shape[1])
        if n <= self.prefill_chunk:
            self._prefix_step(input_ids, sink, state, hidden)
            return

        own = state if state is not None else PrefixState()
        steps = list(range(0, n, self.prefill_chunk))
        # a sliding-window layer's cache keeps its window: its earlier steps' K/V are kept
        # here; a full layer's cache holds them all already (no second copy)
        parts: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        last = [False]

        def gather(layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
            if self.windows[layer] is not None:
                parts.setdefault(layer, []).append((k, v))
            if not last[0]:
                return
            if self.windows[layer] is None:
                held = own.cache.layers[layer]
                k, v = held.keys[:, :, -n:], held.values[:, :, -n:]
            else:
                pieces = parts.pop(layer)
                k, v = (torch.cat([p[i] for p in pieces], dim=2) for i in (0, 1))
            sink(layer, k, v)

        states: list[torch.Tensor] = []  # the hidden state of each step's tokens

        def gather_hidden(h: torch.Tensor) -> None:
            states.append(h)
            if last[0] and hidden is not None:
                hidden(torch.cat(states, dim=1))

        for i, start in enumerate(steps):
            last[0] = i + 1 == len(steps)
            self._prefix_step(input_ids[:, start : start + self.prefill_chunk], gather, own, gather_hidden)

    def _prefix_step(
        self,
        input_ids: torch.Tensor,
        sink: Callable[[int, torch.Tensor, torch.Tensor], None],
        state: PrefixState | None,
        hidden: Callable[[torch.Tensor], None] | None = None,
    ) -> None:
        """One forward pass of ``prefix`` (see there)."""
        # with the hidden state, the pass stops at the end of layer ``layers - 1`` (its hook),
        # not in its cache's update
        stop_after = self.layers + 1 if self.hidden else self.layers
        if state is not None and state.cache is not None:
            cache = state.cache
            cache.sink = sink
        else:
            cache = _observing_cache(self.model.config, stop_after, sink, keep=state is not None)
        handle = None
        if self.hidden:

            def ended(module: Any, args: Any, output: Any) -> None:
                if hidden is not None:
                    hidden((output[0] if isinstance(output, tuple) else output).detach())
                raise _Stop

            handle = _decoder_layers(self.model)[self.layers - 1].register_forward_hook(ended)
        with torch.no_grad(), fixed_threads(self.threads):
            try:
                self.model(input_ids=input_ids, use_cache=True, **{self._cache_kw: cache})
            except _Stop:
                if state is not None:
                    state.cache = cache
                    state.tokens += int(input_ids.shape[1])
                return
            finally:
                if handle is not None:
                    handle.remove()
        raise RuntimeError("the model's forward pass ended before its cache reached the wanted layer")

    def hidden_state(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The hidden state the maps read for ``input_ids`` (``[batch, 1, tokens, hidden]``,
        float32; ``self.hidden`` only): what the model's layer ``layers - 1`` hands on."""
        if not self.hidden:
            raise ValueError("ModelPrefixPredictor: its maps do not read the hidden state")
        got: list[torch.Tensor] = []
        self.prefix(input_ids, lambda layer, k, v: None, hidden=got.append)
        return _hidden_source(got[0])

    def start(self, input_ids: torch.Tensor, state: PrefixState | None = None) -> _PrefixRun:
        """A walk over ``input_ids`` (with ``state``: the next block of a prompt; see
        ``PrefixState``)."""
        if self.layers < self.n_layers and not self.maps:
            raise ValueError("ModelPrefixPredictor: the maps are not fitted: calibrate the codec first")
        return _PrefixRun(self, input_ids, state)

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
    ) -> torch.Tensor:
        """The map's prediction of (layer, which) from the observed tensors, at every position
        of ``shape`` (``[batch, heads, positions, dim]``; a layer holding fewer keeps the last
        ones). K's turn leaves V's partial sum in ``scratch``. The products are the core's
        integer sums (``integer_map``): the same bits on every machine, and ~2x torch's bf16
        products on one core; their rounding (16-bit features and weights) is far below the
        maps' own error."""
        rows, width = shape[2], shape[1] * shape[3]
        with torch.no_grad():
            both, own = self._joint(layer)
            if which == 0 or layer not in scratch:
                y = apply_map(both, _features(observed, self._sources(layer, 0), ropes, rows))
                scratch[layer] = y[:, width:]
                if which == 0:
                    k = self._fallback_predict(layer, 0, observed, ropes, shape, y[:, :width])
                    return ropes.of(layer).rope(_untokens(k, shape))
            partial = scratch.pop(layer)
            # one correctly rounded addition per scalar: the same bits everywhere
            y = partial + apply_map(own, _features(observed, [(layer, 0)], ropes, rows))
            return _untokens(self._fallback_predict(layer, 1, observed, ropes, shape, y), shape)

    def _fallback_predict(
        self, layer: int, which: int, observed: Observed, ropes: Ropes, shape: tuple[int, ...], y: torch.Tensor
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
            x = first_rows(_features(observed, sources, ropes, shape[2]), shape[0], m)
            out[:, :m] = apply_map(fallback, x).reshape(shape[0], m, -1)
        return out.reshape(y.shape)

    # -- fitting ---------------------------------------------------------------------------
    def fit(
        self,
        truths: Sequence[KV],
        variants: dict[str, Callable[[int, int, torch.Tensor], torch.Tensor]],
        progress: bool = False,
        hidden_states: Sequence[torch.Tensor] | None = None,
    ) -> dict[str, list[dict[tuple[int, int], torch.Tensor]]]:
        """Fits the maps of layers ``layers..n_layers-1`` on the true caches ``truths`` (one per
        calibration prompt) and returns out-of-fold predictions of those layers: for each
        ``variants`` entry (a function turning a true tensor into what the decoder would observe,
        e.g. its fp8 round trip), per prompt, ``{(layer, which): prediction}``. Where the maps
        read the hidden state: ``hidden_states``, per prompt (``hidden_state``)."""
        if self.hidden and (hidden_states is None or len(hidden_states) != len(truths)):
            raise ValueError("ModelPrefixPredictor.fit: its maps read the hidden state: give one per prompt")
        n = len(truths)
        folds = [list(range(i, n, FOLDS)) for i in range(min(FOLDS, n))]
        # positions of a prompt: its longest layer's (a sliding layer holds the last ones)
        seqs = [max(k.shape[2] for k, _ in t) for t in truths]
        ropes = [Ropes(self.model, s, int(truths[i][0][0].shape[3])) for i, s in enumerate(seqs)]
        # observed tensors per variant and prompt; the fit uses the first variant's
        names = list(variants)
        observed = {
            v: [
                {(layer, w): f(layer, w, t) for layer, pair in enumerate(kv) for w, t in enumerate(pair)}
                for kv in truths
            ]
            for v, f in variants.items()
        }
        if self.hidden and hidden_states is not None:
            for v in names:
                for p in range(n):
                    observed[v][p][HIDDEN] = hidden_states[p]
        oof: dict[str, list[dict[tuple[int, int], torch.Tensor]]] = {v: [{} for _ in range(n)] for v in names}
        jobs = [(layer, which) for layer in range(self.layers, self.n_layers) for which in (0, 1)]
        iterator: Any = jobs
        if progress:
            from tqdm.auto import tqdm

            iterator = tqdm(jobs, desc="fitting maps", unit="map")
        maps: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for layer, which in iterator:
                sources = self._sources(layer, which)
                fallback = self._fallback(layer, which)
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
                    fx = {
                        v: [_features(observed[v][p], fallback, ropes[p], shapes[p][2]) for p in range(n)]
                        for v in names
                    }
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
                            y = _untokens(y, shapes[p])
                            oof[v][p][layer, which] = ropes[p].of(layer).rope(y) if which == 0 else y
        self.maps = maps
        self._joint_maps = {}
        self._fallback_maps = {}
        return oof


class _PrefixRun:
    """One prompt's walk for ``ModelPrefixPredictor``: the forward pass of the model's prefix
    on a background thread, the maps on the caller's."""

    def __init__(self, predictor: ModelPrefixPredictor, input_ids: torch.Tensor, state: PrefixState | None) -> None:
        self.p = predictor
        self.state = state
        self.offset = state.tokens if state is not None else 0  # the block's first position
        self.observed: dict[tuple[int, int], torch.Tensor] = {}
        self.last_reader = predictor.last_reader()
        # the forward pass's K/V per layer, in the model's dtype (half of float32), until the
        # walk has taken both
        self.made: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.error: BaseException | None = None
        self.done = False
        self.cond = threading.Condition()
        self.ropes: Ropes | None = None
        self.scratch: dict[int, torch.Tensor] = {}
        self.shape: tuple[int, ...] | None = None
        # layers predicted without looking at decoded ones: the codec may decode them in bulk
        self.independent_layers = predictor.layers
        self.hidden: torch.Tensor | None = None  # the maps' HIDDEN source, once the pass made it
        self.thread = threading.Thread(target=self._forward, args=(input_ids,), name="speckv-prefix", daemon=True)
        self.thread.start()

    def _sink(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        with self.cond:
            if self.shape is None:  # the forward pass's new keys: every position of the prompt
                self.shape = tuple(k.shape)
            self.made[layer] = (k.detach(), v.detach())
            self.cond.notify_all()

    def _hidden(self, h: torch.Tensor) -> None:
        self.hidden = _hidden_source(h)

    def _forward(self, input_ids: torch.Tensor) -> None:
        try:
            self.p.prefix(input_ids, self._sink, self.state, self._hidden if self.p.hidden else None)
        except BaseException as e:  # handed to the walking thread
            self.error = e
        finally:
            with self.cond:
                self.done = True
                self.cond.notify_all()

    def predict(self, layer: int, which: int) -> torch.Tensor:
        if layer < self.p.layers:
            with self.cond:
                while layer not in self.made and not self.done:
                    self.cond.wait()
                if layer not in self.made:
                    raise RuntimeError(f"the model's prefix did not produce layer {layer}") from self.error
                made = self.made[layer]
                if which == 1:  # the walk takes K, then V: the layer is done with
                    del self.made[layer]
            return made[which].float()
        # Maps touch torch's thread count: only once the forward pass has ended.
        self.thread.join()
        if self.error is not None and not isinstance(self.error, _Stop):
            raise RuntimeError("the model's prefix failed") from self.error
        if self.shape is None:
            raise RuntimeError("the model's prefix produced no layer")
        if self.ropes is None:  # on the first map
            self.ropes = Ropes(self.p.model, self.shape[2], self.shape[3], start=self.offset)
            if self.p.hidden:
                if self.hidden is None:
                    raise RuntimeError("the model's prefix produced no hidden state")
                self.observed[HIDDEN] = self.hidden
        return self.p.map_predict(layer, which, self.observed, self.ropes, self.shape, self.scratch)

    def observe(self, layer: int, which: int, value: torch.Tensor) -> None:
        # kept only while a map still reads it (the next layers' maps, fallback maps further
        # down): a walk holds a few layers, not the cache
        if self.last_reader.get((layer, which), -1) >= layer:
            self.observed[layer, which] = value
        if which == 1:
            for old in [key for key in self.observed if self.last_reader[key] <= layer]:
                del self.observed[old]

    def wait(self) -> None:
        """Returns once the forward pass has ended (and restored torch's thread count)."""
        self.thread.join()

    def close(self) -> None:
        self.thread.join()


__all__ = ["ModelPrefixPredictor", "PrefixState", "default_prefix_layers"]
