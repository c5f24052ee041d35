"""One prompt's walk for a ``ModelPrefixPredictor``: the forward pass of its prefix (on a
background thread where the walk predicts a layer while it runs, else on the caller's), the
maps on the caller's, the decoded layers kept while a map reads them."""

from __future__ import annotations

import threading
from typing import Any

import torch

from .linear_map import MAP_THREADS
from .map_sources import HIDDEN, _hidden_source
from .prefix_pass import PrefixState, _Stop
from .rope import Ropes


class _PrefixRun:
    """One prompt's walk for ``ModelPrefixPredictor``: the forward pass of the model's prefix,
    the maps on the caller's thread. ``predictor``: the ``ModelPrefixPredictor`` (typed
    loosely: its module imports this one).

    The forward pass starts when the walk first needs it: on a background thread when the
    walk asks for a prefix layer (``predict``: the caller codes that layer while the model
    computes the next), on the caller's own thread when it asks for the whole pass first
    (``wait``, ``close``, or a map's layer). The same bits either way (the same torch threads,
    ``fixed_threads``); on the caller's thread torch reuses the OpenMP workers it already has,
    where a new thread starts its own (measured on an Intel Xeon with AMX, 2 cores: the demo
    model's 20-layer prefix 95 ms on the calling thread, 154 ms on a new one)."""

    def __init__(
        self, predictor: Any, input_ids: torch.Tensor, state: PrefixState | None, block: int | None = None
    ) -> None:
        self.p = predictor
        # tokens per block of a walk over several blocks at once (None: one block)
        self.block = block
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
        # whether a map has run (the walk no longer splits: ``split``)
        self.mapped = False
        # the observed tensors as the maps read them (float32, K un-RoPEd, by token), made once
        self.features: dict[tuple[int, int], torch.Tensor] = {}
        # the core's threads the maps' integer sums take (the walk hands over the decoder's)
        self.threads = MAP_THREADS
        self.shape: tuple[int, ...] | None = None
        # layers predicted without looking at decoded ones: the codec may decode them in bulk
        self.independent_layers = predictor.layers
        self.hidden: torch.Tensor | None = None  # the maps' HIDDEN source, once the pass made it
        self.input_ids = input_ids
        # the background thread, once started (None: the pass has not started, or ran inline)
        self.thread: threading.Thread | None = None

    def _sink(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        with self.cond:
            if self.shape is None:  # the forward pass's new keys: every position of the prompt
                self.shape = tuple(k.shape)
            self.made[layer] = (k.detach(), v.detach())
            self.cond.notify_all()

    def _hidden(self, h: torch.Tensor) -> None:
        self.hidden = _hidden_source(h)

    def _forward(self, input_ids: torch.Tensor, inline: bool = False) -> None:
        try:
            if self.block is None:
                self.p.prefix(input_ids, self._sink, self.state, self._hidden if self.p.hidden else None)
            else:
                self._forward_blocks(input_ids, self.block)
        except BaseException as e:  # handed to the walk (``predict`` raises it)
            self.error = e
            if inline and not isinstance(e, Exception):
                raise  # an interrupt on the caller's own thread stays one
        finally:
            with self.cond:
                self.done = True
                self.cond.notify_all()

    def _forward_blocks(self, input_ids: torch.Tensor, block: int) -> None:
        """The forward pass over consecutive blocks of ``block`` tokens, one after another
        (each continuing the state the one before left), each layer's K/V and the hidden state
        joined along the tokens once every block has run."""
        made: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        hidden: list[torch.Tensor] = []
        state = self.state if self.state is not None else PrefixState()

        def sink(layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
            made.setdefault(layer, []).append((k, v))

        for start in range(0, int(input_ids.shape[1]), block):
            self.p.prefix(input_ids[:, start : start + block], sink, state, hidden.append if self.p.hidden else None)
        for layer in sorted(made):
            parts = made.pop(layer)
            self._sink(layer, torch.cat([k for k, _ in parts], dim=2), torch.cat([v for _, v in parts], dim=2))
        if hidden:
            self._hidden(torch.cat(hidden, dim=1))

    def predict(self, layer: int, which: int) -> torch.Tensor:
        if layer < self.p.layers:
            if self.thread is None and not self.done:
                self.thread = threading.Thread(
                    target=self._forward, args=(self.input_ids,), name="speckv-prefix", daemon=True
                )
                self.thread.start()
            with self.cond:
                while layer not in self.made and not self.done:
                    self.cond.wait()
                if layer not in self.made:
                    raise RuntimeError(f"the model's prefix did not produce layer {layer}") from self.error
                made = self.made[layer]
                if which == 1:  # the walk takes K, then V: the layer is done with
                    del self.made[layer]
            return made[which].float()
        ropes, shape = self._maps_ready()
        self.mapped = True
        return self.p.map_predict(layer, which, self.observed, ropes, shape, self.scratch, self.features, self.threads)

    def _maps_ready(self) -> tuple[Ropes, tuple[int, ...]]:
        """The forward pass ended (maps touch torch's thread count: only once it has), the
        RoPE tables and the hidden state in place: what the maps read besides the layers."""
        self.wait()
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
        return self.ropes, self.shape

    def observe(self, layer: int, which: int, value: torch.Tensor) -> None:
        _keep(self.observed, self.features, self.last_reader, layer, which, value)

    def split(self, bounds: list[tuple[int, int]], threads: int) -> list[TokenRun] | None:
        """The rest of the walk (every layer from ``independent_layers`` on: the maps) as
        walks over the token ranges ``bounds`` (``[(start, stop), ...]`` of the prompt's
        positions), each summing its maps on ``threads`` threads; None where the maps are not
        row by row (a model with sliding windows: a row's fallback depends on which tokens a
        layer holds), or once a map has run. Each walk's predictions are the rows of the
        whole walk's, bit for bit (the maps sum each token's features alone, the RoPE tables
        are the whole walk's, sliced), so the walks can run side by side: one per core, each
        one's Python between its core calls overlapping the others' (measured:
        ``docs/benchmarks/restore-profile.md``). This walk goes no further: its observed layers
        are the walks' from here (each holds its rows)."""
        if self.p._windowed() or self.mapped:
            return None
        ropes, shape = self._maps_ready()
        runs = [TokenRun(self, ropes, shape, lo, hi, threads) for lo, hi in bounds]
        self.observed.clear()
        return runs

    def wait(self) -> None:
        """Returns once the forward pass has ended (and restored torch's thread count): run
        here if it has not started."""
        if self.thread is not None:
            self.thread.join()
        elif not self.done:
            self._forward(self.input_ids, inline=True)

    def close(self) -> None:
        # the pass runs once whatever the walk asked for: a prompt's next block continues
        # the state it leaves (``PrefixState``)
        self.wait()


class TokenRun:
    """Tokens ``lo:hi`` of a ``_PrefixRun``'s walk past its forward pass (``_PrefixRun.split``):
    the maps of those rows on ``threads`` threads, the observed layers' rows kept while a map
    reads them. Why: a restore's walk is one chain of small steps (a layer's maps, its
    decode, the Python and torch work between them) of which only the core calls use both
    cores; two walks over halves of the tokens, side by side, keep both busy (the core
    releases the GIL; so do torch's operations)."""

    def __init__(self, run: _PrefixRun, ropes: Ropes, shape: tuple[int, ...], lo: int, hi: int, threads: int) -> None:
        if not 0 <= lo < hi <= shape[2]:
            raise ValueError(f"token run: tokens {lo}:{hi} of a walk over {shape[2]}")
        self.p = run.p
        self.shape = (shape[0], shape[1], hi - lo, *shape[3:])
        # copies: the maps read each one several times, whole
        self.observed = {key: t[:, :, lo:hi].contiguous() for key, t in run.observed.items()}
        self.ropes = ropes.tokens(lo, hi)
        self.last_reader = run.last_reader
        self.scratch: dict[int, torch.Tensor] = {}
        self.features: dict[tuple[int, int], torch.Tensor] = {}
        self.threads = threads

    def predict(self, layer: int, which: int) -> torch.Tensor:
        return self.p.map_predict(
            layer, which, self.observed, self.ropes, self.shape, self.scratch, self.features, self.threads
        )

    def observe(self, layer: int, which: int, value: torch.Tensor) -> None:
        _keep(self.observed, self.features, self.last_reader, layer, which, value)


def _keep(
    observed: dict[tuple[int, int], torch.Tensor],
    features: dict[tuple[int, int], torch.Tensor],
    last_reader: dict[tuple[int, int], int],
    layer: int,
    which: int,
    value: torch.Tensor,
) -> None:
    """A walk's observed layers after ``value`` (layer ``layer``'s K or V) was decoded: kept
    only while a map still reads it (the next layers' maps, fallback maps further down), so a
    walk holds a few layers, not the cache; each one's features (``map_sources._features``)
    dropped with it."""
    if last_reader.get((layer, which), -1) >= layer:
        observed[layer, which] = value
        features.pop((layer, which), None)
    if which == 1:
        for old in [key for key in observed if last_reader[key] <= layer]:
            del observed[old]
            features.pop(old, None)
