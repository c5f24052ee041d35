"""``BlockCodec``: one token block of a prompt's cache at a time, coded and decoded with a
``SpeculativeCodec``, given the tokens before it: what a prefix store codes.

A block's container is a whole container (``speckv.container``) whose prompt digest covers
the prompt up to the block's end. Its predictor sees the tokens before the block: a walking
predictor (``ModelPrefixPredictor``) through its ``PrefixState``, its cache of the blocks
before, carried from block to block in order (``skip`` carries it past a block that is stored
already); a whole-prompt predictor (per-channel statistics) from the block's own ids. Both
sides walk the same blocks in the same order, so a block decodes bit for bit whichever prompt
stored it.

``decode_blocks`` decodes a run of consecutive blocks in one walk where the predictor allows
(a ``ModelPrefixPredictor`` of a model without sliding windows, the blocks in one storage
mode, all coded with the joint model or none): each block's forward pass in
turn, then each layer's maps once over every block's tokens (they are row by row, so each
block gets its own walk's prediction bit for bit), each block's part decoded from its own
container. With a whole-prompt predictor (per-channel statistics, whose prediction reads no
decoded layer) every block's K streams are decoded in one call, then every block's V streams
(``decode_walk.decode_whole_blocks``). A store restores a prompt of many blocks at about one
container's cost instead of paying a walk's or a decode's fixed costs once per block
(``benches/block_restore.py``).

>>> blocks = BlockCodec(codec, "bf16")                          # doctest: +SKIP
>>> state = PrefixState()                                       # doctest: +SKIP
>>> data = blocks.encode(kv[:, :, 0:16], ids[:, :16], 0, state)  # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import torch

from .. import _api
from .._speckv import CorruptStreamError
from ..models.cache import KV
from ..predictors.early_exit import ModelPrefixPredictor
from ..predictors.layerwise import is_layerwise, overlap_pays
from ..predictors.prefix_pass import PrefixState
from .codec import SpeculativeCodec
from .decode_walk import decode_blocks_layerwise, decode_whole_blocks
from .modes import MODES


class BlockCodec:
    """Blocks of ``codec``'s caches stored as ``dtype`` (``"bf16"``, ``"fp16"``, ``"fp8"``).
    ``threads``, ``model`` (default: ``codec.restore_model(dtype)``) and ``block_size`` (the
    container's) are ``SpeculativeCodec.compress``'s."""

    def __init__(
        self,
        codec: SpeculativeCodec,
        dtype: str = "bf16",
        *,
        threads: int | None = None,
        model: _api.Model | None = None,
        block_size: int | None = None,
    ) -> None:
        if dtype not in MODES:
            raise ValueError(f"dtype: expected one of {sorted(MODES)}, got {dtype!r}")
        self.codec = codec
        self.dtype = dtype
        self.threads = threads
        self.model = codec.restore_model(dtype) if model is None else model
        self.block_size = block_size

    def encode(self, block: Any, input_ids: torch.Tensor, start: int, state: PrefixState | None = None) -> bytes:
        """The container of ``block`` (a cache, or per layer ``(K, V)``): tokens ``start:`` of
        ``input_ids``, the prompt up to the block's end. ``state``: a walking predictor's walk
        over the tokens before (``state.tokens == start``; None at a prompt's start), advanced
        past the block here."""
        codec = self.codec
        kv = codec.check_cache(block)
        tokens = max(k.shape[2] for k, _ in kv)
        if tokens != int(input_ids.shape[-1]) - start:
            raise ValueError(f"block: {tokens} tokens, input_ids has {int(input_ids.shape[-1]) - start} from {start}")
        block_ids = input_ids[:, start:]
        run = self._run(block_ids, start, state)
        pred = codec._predictions(kv, block_ids, self.dtype, run)
        return codec._encode(kv, input_ids, pred, self.dtype, self.threads, self.model, self.block_size)

    def decode(self, data: bytes, input_ids: torch.Tensor, start: int, state: PrefixState | None = None) -> KV:
        """``encode`` backwards: the block's per-layer ``(K, V)`` in the storage dtype (fp8 as
        stored), bit for bit. The container is checked against the codec and ``input_ids``
        (``CorruptStreamError``, ``PredictionMismatchError``) before the predictor runs;
        ``state`` as for ``encode``."""
        codec = self.codec
        c = codec._checked(data, input_ids)
        run = self._run(input_ids[:, start:], start, state)
        layers = codec._decode(c, input_ids, None, self.threads, None, None, run)
        return [layers[i] for i in range(c.layers)]

    def check(self, data: bytes, input_ids: torch.Tensor) -> None:
        """Refuses a block's container unless this codec made it for ``input_ids`` (the prompt
        up to the block's end): ``CorruptStreamError`` or ``PredictionMismatchError``, before
        any predictor runs."""
        self.codec._checked(data, input_ids)

    def decode_blocks(
        self, datas: list[bytes], input_ids: torch.Tensor, start: int, state: PrefixState | None = None
    ) -> list[KV]:
        """``decode`` of consecutive blocks (``datas``: their containers in order,
        ``input_ids``: the prompt up to the last one's end, ``start``: the first one's first
        token), in one walk where the predictor allows (module docs), else one by one: the
        same checks before the predictor runs, the same bits. ``state`` as for ``decode``,
        advanced past every block."""
        codec = self.codec
        cs, end = [], start
        for data in datas:
            end += codec.read_header(data).tokens
            cs.append(codec._checked(data, input_ids[:, :end]))
        if end != int(input_ids.shape[-1]):
            # the containers' own count disagrees with the prompt they were checked against
            raise CorruptStreamError(
                f"cache container: the blocks hold {end - start} tokens from {start}, "
                f"input_ids has {input_ids.shape[-1]}"
            )
        predictor = codec.predictor
        plans = [codec.params.reading(c, self.threads, layerwise=True) for c in cs]
        joined = (
            len(cs) > 1
            and isinstance(predictor, ModelPrefixPredictor)
            and all(w is None for w in predictor.windows)
            and all(c.layout == "stacked" and len(c.blocks) == 1 and c.tokens == cs[0].tokens for c in cs)
            and len({(p.mode, p.joint) for p in plans}) == 1
        )
        if (
            len(cs) > 1
            and not is_layerwise(predictor)
            and all(c.layout == "stacked" and len(c.blocks) == 1 for c in cs)
            and len({(p.mode, p.joint) for p in plans}) == 1
        ):
            # a whole-prompt predictor: every block's streams of K, then of V, in one call
            ends = [start + sum(c.tokens for c in cs[: i + 1]) for i in range(len(cs))]
            readings = [codec.params.reading(c, self.threads, layerwise=False) for c in cs]
            predictions = [predictor.predict(input_ids[:, :end]) for end in ends]
            layers = decode_whole_blocks(readings, cs, predictions)
            return [[got[i] for i in range(c.layers)] for got, c in zip(layers, cs)]
        if not joined:
            out, at = [], start
            for data, c in zip(datas, cs):
                at += c.tokens
                out.append(self.decode(data, input_ids[:, :at], at - c.tokens, state))
            return out
        run = self._run(input_ids[:, start:], start, state, block=cs[0].tokens)
        pipeline = overlap_pays(int(getattr(predictor, "threads", 1)))
        layers = decode_blocks_layerwise(plans[0], cs, run, pipeline)
        return [[got[i] for i in range(c.layers)] for got, c in zip(layers, cs)]

    def skip(self, block_ids: torch.Tensor, state: PrefixState) -> None:
        """Carries a walking predictor's ``state`` past a block coded elsewhere (one stored
        already): its forward pass over the block, nothing predicted. Nothing for a
        whole-prompt predictor."""
        predictor = self.codec.predictor
        if isinstance(predictor, ModelPrefixPredictor):
            predictor.prefix(block_ids, _ignore_layer, state)

    def _run(self, block_ids: torch.Tensor, start: int, state: PrefixState | None, block: int | None = None) -> Any:
        """A walking predictor's run over one block (``block``: over consecutive blocks of that
        many tokens), continuing ``state`` (None for a whole-prompt predictor, which needs
        none)."""
        predictor = self.codec.predictor
        if not isinstance(predictor, ModelPrefixPredictor):
            return None
        state = state if state is not None else PrefixState()
        if state.tokens != start:
            raise ValueError(f"state: walked {state.tokens} tokens, the block starts at {start}")
        return predictor.start(block_ids, state, block)


def _ignore_layer(layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
    """``skip``'s sink: a skipped block's layers are not wanted."""


__all__ = ["BlockCodec"]
