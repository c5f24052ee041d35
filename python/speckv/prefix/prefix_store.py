"""``PrefixStore``: a model's KV caches, compressed and deduplicated by token block, on any
``speckv.store`` backend (memory, a directory, Redis).

A prompt is cut into blocks of ``block_size`` tokens. Block ``i`` is stored under a key that
chains the digests of every block up to it (and the codec's identity: model, calibration,
predictor, storage dtype, block size), as vLLM and LMCache name their blocks, so two prompts
that share a prefix share its blocks' entries and a key names its whole prefix.

Exactness across prompt lengths needs one more thing: the decoder must rebuild the encoder's
predictions bit for bit, and a forward pass over 768 tokens need not give the first 512 the
same last bits as one over 1,024. So the predictor runs block by block, each block attending to
the predictor's own cache of the blocks before it (``PrefixState``), on both sides: a block's
predictions then depend only on the tokens up to its end, and ``get`` returns the stored cache's
first ``n`` tokens bit for bit, whichever prompt stored them.

Sliding-window layers (Gemma 2/3, Mistral-style windows): a stored block holds its tokens'
keys and values in *every* layer, so that any stored prefix can be served, a short one whose
window still holds early blocks as well as a long one. A model's own cache drops the tokens
that left a sliding layer's window, which are then in no cache: ``put`` refuses such a cache
(``UnsupportedModelError``, naming the layer) and asks for one that kept every token, a
``DynamicCache()`` made without the model's config (the model's masks still apply the
window, so its outputs are the same); ``generate`` prefills with one. ``get`` returns a cache
whose layers hold every token of the prefix, which the model reads through the same masks.
"""

from __future__ import annotations

from typing import Any

import torch

from .._speckv import CorruptStreamError, PredictionMismatchError
from ..codec.blocks import BlockCodec
from ..codec.codec import SpeculativeCodec
from ..codec.modes import MODES
from ..codec.modes import dequantize as dequantize_fp8
from ..models.architecture import UnsupportedModelError, layer_windows, text_config
from ..models.cache import KV, build_cache, cache_argument, restore_device
from ..predictors.base import ChannelStatsPredictor, describe
from ..predictors.early_exit import ModelPrefixPredictor, PrefixState
from ..store import Backend
from .block_chain import BlockChain, chain_keys
from .block_chain import prompt_ids as _ids

DEFAULT_BLOCK_SIZE = 256
STORE_FORMAT = 1


class PrefixStore(BlockChain):
    """Compressed prefix caches of ``codec``'s model in ``backend``.

    >>> store = PrefixStore(codec, DirectoryBackend("kv-store"))   # doctest: +SKIP
    >>> store.put(input_ids, cache)        # tokens newly stored      # doctest: +SKIP
    >>> cache, n = store.get(input_ids)    # the longest stored prefix # doctest: +SKIP

    Only whole blocks are stored; the tokens after the last whole block are not. ``scope``
    adds to the namespace (an engine's connector sets it: see ``EngineStore``).
    """

    def __init__(
        self,
        codec: SpeculativeCodec,
        backend: Backend,
        *,
        block_size: int = DEFAULT_BLOCK_SIZE,
        dtype: str = "bf16",
        threads: int | None = None,
        scope: str | None = None,
    ) -> None:
        if not isinstance(codec.predictor, (ModelPrefixPredictor, ChannelStatsPredictor)):
            raise TypeError(
                "PrefixStore: the codec's predictor must run block by block (ModelPrefixPredictor) or predict "
                f"every position alike (ChannelStatsPredictor); got {type(codec.predictor).__name__}"
            )
        if dtype not in MODES:
            raise ValueError(f"dtype: expected one of {sorted(MODES)}, got {dtype!r}")
        identity = {
            "format": STORE_FORMAT,
            "model": codec.fingerprint,
            "calibration": codec.require_calibration().digest(),
            "predictor": describe(codec.predictor),
            "dtype": dtype,
            "block_size": int(block_size),
        }
        if scope is not None:  # a writer's own namespace (an engine connector's: EngineStore)
            identity["scope"] = scope
        super().__init__(backend, block_size, identity)
        self.codec = codec
        self.dtype = dtype
        self.threads = threads
        # the bins model for 16-bit caches, the exact one for fp8 (`restore_model`)
        self.blocks = BlockCodec(codec, dtype, threads=threads, block_size=block_size)

    # -- writing -----------------------------------------------------------------------
    def put(self, input_ids: torch.Tensor, cache: Any) -> int:
        """Stores the blocks of ``cache`` (the model's cache of ``input_ids``) that are not
        stored yet; returns how many tokens that was. A backend that fails (``StoreError``)
        ends the storing there (counted in ``stats()["store_errors"]``): the blocks after a
        block that could not be stored are not stored either."""
        ids = _ids(input_ids)
        kv = self.codec.check_cache(cache)
        seq = max(k.shape[2] for k, _ in kv)
        for layer, (k, _) in enumerate(kv):
            if k.shape[2] < seq:
                raise UnsupportedModelError(
                    f"cache: layer {layer} holds {k.shape[2]} of {seq} tokens (a sliding window dropped the rest): "
                    "the prefix store keeps every layer of every block; store a cache that kept every token "
                    "(a DynamicCache() made without the model's config: the masks still apply the window)"
                )
        if seq < ids.shape[1] - ids.shape[1] % self.block_size:
            raise ValueError(f"cache: {seq} tokens, fewer than input_ids' whole blocks")
        # a walking predictor's state over the blocks before the one being coded
        state = PrefixState()
        b_size = self.block_size

        def stored_already(b: int) -> None:
            self.blocks.skip(ids[:, b * b_size : (b + 1) * b_size], state)

        def code(b: int, key: str) -> bytes:
            start, end = b * b_size, (b + 1) * b_size
            block = [(k[:, :, start:end], v[:, :, start:end]) for k, v in kv]
            return self.blocks.encode(block, ids[:, :end], start, state)

        return self._put_chain(ids, code, stored_already)

    # -- reading -----------------------------------------------------------------------
    def get(
        self, input_ids: torch.Tensor, *, dequantize: bool = True, device: str | torch.device | None = None
    ) -> tuple[Any, int]:
        """``(cache, n)``: the stored cache of the longest stored prefix of ``input_ids``, its
        first ``n`` tokens bit for bit, as a ``DynamicCache`` (``None, 0`` if no block is
        stored) on ``device`` (default: ``input_ids``' device). A damaged or foreign entry ends
        the prefix there (counted in ``stats``); the blocks before it are still served."""
        kv, n = self.get_kv(input_ids, device=device)
        if not n:
            return None, 0
        if self.dtype == "fp8" and dequantize:
            scales = self.codec.require_calibration().fp8_scales
            kv = [dequantize_fp8(k, v, float(scales[i, 0]), float(scales[i, 1])) for i, (k, v) in enumerate(kv)]
        return build_cache(kv), n

    def get_kv(
        self, input_ids: torch.Tensor, *, device: str | torch.device | None = None
    ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int]:
        """``get`` as per-layer ``(K, V)`` ``[1, kv_heads, n, head_dim]`` in the storage dtype
        (fp8 as stored), for engines with caches of their own; ``([], 0)`` if none."""
        target = restore_device(device, input_ids)
        ids = _ids(input_ids)

        def checked(b: int, data: bytes) -> bytes:
            self.blocks.check(data, ids[:, : (b + 1) * self.block_size])
            return data

        # the chain's entries read and their headers checked (a foreign or damaged one ends it
        # there), then decoded in one walk (``BlockCodec.decode_blocks``)
        datas = self._read_chain(self.keys(ids), checked)
        if not datas:
            return [], 0
        try:
            blocks = self.blocks.decode_blocks(datas, ids[:, : len(datas) * self.block_size], 0, PrefixState())
        except (CorruptStreamError, PredictionMismatchError):
            blocks = self._decode_each(datas, ids)
        if not blocks:
            return [], 0
        n_layers = len(blocks[0])

        def joined(layer: int, which: int) -> torch.Tensor:
            return torch.cat([blk[layer][which] for blk in blocks], dim=2).to(target)

        return [(joined(layer, 0), joined(layer, 1)) for layer in range(n_layers)], len(blocks) * self.block_size

    def _decode_each(self, datas: list[bytes], ids: torch.Tensor) -> list[KV]:
        """The blocks one by one, where decoding them together failed: a block whose payload
        is damaged ends the prefix there (``_read_chain`` counted it as a hit: now corrupt)."""
        state, out = PrefixState(), []
        for b, data in enumerate(datas):
            end = (b + 1) * self.block_size
            try:
                out.append(self.blocks.decode(data, ids[:, :end], end - self.block_size, state))
            except (CorruptStreamError, PredictionMismatchError):
                self._stats["hits"] -= len(datas) - b
                self._stats["corrupt_entries"] += 1
                break
        return out

    def generate(self, input_ids: torch.Tensor, *, store: bool = True, **generate_kwargs: Any) -> torch.Tensor:
        """``model.generate`` that starts from the longest stored prefix: restores it, lets the
        model prefill only the rest of ``input_ids``, generates, and (``store=True``) stores the
        blocks of the prompt and the generated text that are new. Returns the token ids, as
        ``generate`` does. In fp8 mode the model continues from the dequantised cache."""
        model = self.codec.model
        # the model's device: its prompt and its starting cache must both be there
        device = getattr(model, "device", None) or torch.device("cpu")
        ids = _ids(input_ids).to(device)
        cache, n = self.get(ids, device=device)
        if cache is not None and n >= ids.shape[1]:
            cache.crop(-1)  # generate needs at least one token to run the model on
        kwargs = dict(generate_kwargs)
        kwargs["return_dict_in_generate"] = True
        if cache is None and any(w is not None for w in layer_windows(text_config(model))):
            # a cache that keeps every token of every layer, so that its blocks can be stored
            from transformers import DynamicCache

            cache = DynamicCache()
        if cache is not None:
            kwargs[cache_argument(model)] = cache
        out = model.generate(ids, **kwargs)
        sequences = out.sequences
        made = getattr(out, "cache", None) or getattr(out, "past_key_values", None)
        if store and made is not None:
            # the cache holds every token but the last one generated
            self.put(sequences[:, :-1], made)
        return sequences


__all__ = ["DEFAULT_BLOCK_SIZE", "PrefixStore", "chain_keys"]
