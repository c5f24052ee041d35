"""``FreePrefixStore``: a model's KV caches by token block, coded without a predictor (the
fast lane, ``rust/speckv/src/fast_lane.rs``), in a ``speckv.store`` backend.

No calibration, no weights and no forward pass on either side: a block is stored as its key
(16 bytes: the hash chain of every token up to the block's end) and one stream of its keys and
values, ``[layers, 2, kv_heads, block_size, head_dim]`` in the storage dtype, and restoring it
is decoding alone (about a gigabyte of cache per second per core). It is
larger than what the predicted ``PrefixStore`` stores (measured on the demo model, 16-token
blocks: ~11.0 bits per bf16 scalar, against ~5.3 with a predictor) and smaller than zstd's; the
engine's choice of the two is TTFT against memory. Blocks are keyed as ``PrefixStore`` keys
them (``speckv.prefix.block_chain``), under a namespace of the model's fingerprint, the coding,
the storage dtype and the block size. The key inside the entry is what stands in for the
predicted store's prompt fingerprint: an entry written under another key (a foreign writer, a
misplaced file) is refused, never served as this prefix's cache.

``coding="raw"`` stores the same blocks uncompressed (a serving tier's baseline: the same
keys, budget and eviction, none of the codec).

Restoring layer by layer (``read_blocks``, then ``decode_layers``): a block's entry is read and
checked whole, and any run of its layers decoded alone, so that an engine can hand over layer 0
while later layers are still being decoded. A fast-lane block is coded in chunks of whole layers
(``layer_chunk``) so that a layer's chunks hold nothing of another's; blocks coded in other
chunks still decode, a layer then decoding the chunks it shares with its neighbours.
Entry payloads::

    offset  size             field
    0       16               the block's key (binary)
    16      N                fast: a speckv stream of [layers, 2, kv_heads, block_size, head_dim]
    16      4 + 5 * 4        raw:  b"RAW1", then those five sizes as little-endian uint32,
    40      (product) * w          and the scalars' bits, little-endian, w bytes each
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .. import _api, _arrays
from .._speckv import CorruptStreamError
from ..store import Backend
from .block_chain import BlockChain, prompt_ids

# 2: blocks written by vLLM's connector before it read vLLM's amx layout (2026-12-02) held
# scrambled caches on AMX processors; a new namespace so that none of them is ever served
STORE_FORMAT = 2
KEY_BYTES = 16
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}
CODINGS = ("fast", "raw")
RAW_MAGIC = b"RAW1"
_RAW_HEADER = struct.Struct("<4s5I")


@dataclass(frozen=True)
class StoredBlock:
    """One block's entry, read and checked (key, header, shape), not decoded yet."""

    data: bytes
    """the payload after the key: a fast-lane stream, or a raw block with its header"""
    shape: tuple[int, ...]
    """``[layers, 2, kv_heads, block_size, head_dim]``"""
    chunk_scalars: int
    """the fast-lane stream's scalars per chunk (0 for a raw block)"""


def layer_chunk(shape: tuple[int, ...]) -> int:
    """Scalars per fast-lane chunk for blocks of ``shape`` (``[layers, 2, heads, block,
    dim]``): whole layers, as few as make a chunk of at least ``FAST_LANE_MIN_SCALARS`` (a
    chunk carries its own tables)."""
    per_layer = math.prod(shape[1:])
    return per_layer * max(1, -(-_api.FAST_LANE_MIN_SCALARS // per_layer))


class FreePrefixStore(BlockChain):
    """Prefix blocks of the model named by ``fingerprint``, coded predictor-free in ``backend``.

    ``dtype``: the storage dtype the caches arrive in (``bf16``, ``fp16``, ``fp8``); ``put``
    refuses another. fp8 caches are stored as their bits: whoever reads them must quantise
    with the writer's scales (``EngineStore`` hosts bf16 and fp16 only, for that reason).

    >>> store = FreePrefixStore("model-fingerprint", DirectoryBackend("kv"), block_size=16)  # doctest: +SKIP
    >>> store.put(input_ids, kv)             # per layer (K, V) [1, heads, tokens, dim]      # doctest: +SKIP
    >>> kv, n = store.get_kv(input_ids)      # the longest stored prefix                     # doctest: +SKIP
    """

    def __init__(
        self,
        fingerprint: str,
        backend: Backend,
        *,
        block_size: int,
        dtype: str = "bf16",
        threads: int | None = None,
        coding: str = "fast",
    ) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"dtype: expected one of {sorted(DTYPES)}, got {dtype!r}")
        if coding not in CODINGS:
            raise ValueError(f"coding: expected one of {CODINGS}, got {coding!r}")
        identity = {
            "format": STORE_FORMAT,
            "model": fingerprint,
            "predictor": "none",
            "lane": coding,
            "dtype": dtype,
            "block_size": int(block_size),
        }
        super().__init__(backend, block_size, identity)
        self.dtype = dtype
        self.threads = threads
        self.coding = coding

    def put(self, input_ids: torch.Tensor, kv: list[tuple[Any, Any]]) -> int:
        """Stores the whole blocks of ``kv`` (per layer ``(K, V)`` ``[1, kv_heads, tokens,
        head_dim]``, the cache of ``input_ids``: tensors in the storage dtype, or numpy arrays
        of their bits as integers) not stored yet; returns how many tokens that was. A backend
        that fails ends the storing there (``stats()["store_errors"]``). Coding runs on numpy
        and the core alone (no torch op: an engine's saver thread stays out of torch's thread
        pool)."""
        ids = prompt_ids(input_ids)
        want = DTYPES[self.dtype]
        words = [(_words(k, want), _words(v, want)) for k, v in kv]
        shapes = {t.shape for pair in words for t in pair}
        if not kv or len(shapes) != 1:
            raise ValueError(f"kv: expected per layer (K, V) of one shape, all {want}; got shapes {sorted(shapes)}")
        shape = next(iter(shapes))
        if len(shape) != 4 or shape[0] != 1 or shape[2] < ids.shape[1] - ids.shape[1] % self.block_size:
            raise ValueError(f"kv: expected [1, heads, tokens >= the prompt's whole blocks, dim], got {list(shape)}")
        typed = _arrays.numpy_dtype(_DTYPE_NAMES[want])

        def code(b: int, key: str) -> bytes:
            start, end = b * self.block_size, (b + 1) * self.block_size
            block = np.stack([np.stack([k[0, :, start:end], v[0, :, start:end]]) for k, v in words])
            if self.coding == "raw":
                little = block.astype(block.dtype.newbyteorder("<"), copy=False)
                return bytes.fromhex(key) + _RAW_HEADER.pack(RAW_MAGIC, *block.shape) + little.tobytes()
            # from numpy: decode then hands back numpy too (no torch hint in the stream); in
            # chunks of whole layers, for restores layer by layer (`decode_layers`)
            coded = _api.encode(
                block.view(typed), threads=self.threads, lane="fast", chunk_size=layer_chunk(block.shape)
            )
            return bytes.fromhex(key) + coded

        return self._put_chain(ids, code)

    def get_kv(
        self, input_ids: torch.Tensor, *, device: str | torch.device | None = None
    ) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int]:
        """Per layer ``(K, V)`` ``[1, kv_heads, n, head_dim]`` of the longest stored prefix of
        ``input_ids``, bit for bit, in the storage dtype; ``([], 0)`` if none. A damaged,
        foreign or unreadable entry ends the prefix there (counted in ``stats``)."""
        want = DTYPES[self.dtype]
        blocks: list[np.ndarray] = []
        for stored in self.read_blocks(input_ids):
            try:
                blocks.append(self.decode_layers(stored, 0, stored.shape[0]))
            except CorruptStreamError:
                self.damaged()
                break
        if not blocks:
            return [], 0
        whole = torch.from_numpy(np.ascontiguousarray(np.concatenate(blocks, axis=3))).view(want)
        if device is not None:
            whole = whole.to(device)
        kv = [(whole[layer, 0][None], whole[layer, 1][None]) for layer in range(whole.shape[0])]
        return kv, len(blocks) * self.block_size

    def read_blocks(self, input_ids: torch.Tensor, *, start: int = 0) -> list[StoredBlock]:
        """The entries of the longest stored prefix of ``input_ids``, from block ``start`` on
        (the blocks before it are the caller's already), read and checked but not decoded:
        ``decode_layers`` decodes them, a run of layers at a time. A damaged, foreign or
        unreadable entry ends the prefix there (counted); one whose stream turns out damaged
        when decoded is the caller's to report (``damaged``)."""
        want = DTYPES[self.dtype]
        shapes: list[tuple[int, ...]] = []

        def accept(b: int, entry: bytes) -> StoredBlock:
            if entry[:KEY_BYTES] != bytes.fromhex(keys[b]):
                raise CorruptStreamError("stored block: written for another prefix")
            data = entry[KEY_BYTES:]
            dtype_name, got, chunk = self._header(data)
            if dtype_name != _DTYPE_NAMES[want] or len(got) != 5 or got[1] != 2 or got[3] != self.block_size:
                raise CorruptStreamError(f"stored block: {dtype_name} {list(got)}, not this store's")
            if shapes and got != shapes[0]:
                raise CorruptStreamError("stored block: another shape than the blocks before it")
            shapes.append(got)
            return StoredBlock(data, got, chunk)

        keys = self.keys(input_ids)
        return self._read_chain(keys, accept, start)

    def decode_layers(self, block: StoredBlock, lo: int, hi: int) -> np.ndarray:
        """Layers ``lo:hi`` of a block from ``read_blocks``: ``[hi - lo, 2, kv_heads,
        block_size, head_dim]``, the storage dtype's bits as integers (int16, or uint8 for
        fp8), bit for bit. ``CorruptStreamError`` if those layers' bytes are damaged. Raw
        blocks are a view of the entry (no copy)."""
        if not 0 <= lo <= hi <= block.shape[0]:
            raise ValueError(f"layers {lo}:{hi}: the block has {block.shape[0]}")
        per_layer = math.prod(block.shape[1:])
        want = DTYPES[self.dtype]
        out_shape = (hi - lo, *block.shape[1:])
        if block.chunk_scalars == 0:
            word = np.dtype(_WORDS[want]).newbyteorder("<")
            offset = _RAW_HEADER.size + lo * per_layer * word.itemsize
            run = np.frombuffer(block.data, dtype=word, count=(hi - lo) * per_layer, offset=offset)
            return run.astype(_WORDS[want], copy=False).reshape(out_shape)
        if lo == hi:
            return np.zeros(out_shape, _WORDS[want])
        c = block.chunk_scalars
        first, last = lo * per_layer, hi * per_layer  # the layers' scalars
        chunks = (first // c, -(-last // c))
        run = np.asarray(_api.decode(block.data, threads=self.threads, chunks=chunks)).view(_WORDS[want])
        return run[first - chunks[0] * c : last - chunks[0] * c].reshape(out_shape)

    def damaged(self) -> None:
        """Counts a block that ``read_blocks`` returned and whose stream turned out damaged
        when decoded: a corrupt entry, not a hit."""
        self._stats["hits"] -= 1
        self._stats["corrupt_entries"] += 1

    def _header(self, data: bytes) -> tuple[str, tuple[int, ...], int]:
        """The stored block's dtype name, shape and scalars per chunk (0: raw), read from its
        payload's header (a raw block's length checked against its shape)."""
        if self.coding == "raw":
            if len(data) < _RAW_HEADER.size or data[:4] != RAW_MAGIC:
                raise CorruptStreamError("stored block: not a raw block")
            shape = tuple(_RAW_HEADER.unpack_from(data)[1:])
            if len(data) != _RAW_HEADER.size + math.prod(shape) * np.dtype(_WORDS[DTYPES[self.dtype]]).itemsize:
                raise CorruptStreamError("stored block: its length does not match its shape")
            return _DTYPE_NAMES[DTYPES[self.dtype]], shape, 0
        meta = _api.info(data)
        if meta.get("predicted") or meta.get("lane") != "fast":
            raise CorruptStreamError("stored block: not a predictor-free fast-lane stream")
        return str(meta["dtype"]), tuple(meta["shape"]), int(meta["chunk_scalars"])


_DTYPE_NAMES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float8_e4m3fn: "float8_e4m3fn"}


def _words(t: Any, want: torch.dtype) -> np.ndarray:
    """A cache tensor of ``want`` (or a numpy array of its bits as integers, or of its
    ml_dtypes type) as a numpy array of its bits as integers (a view where it can be)."""
    word = np.dtype(_WORDS[want])
    if isinstance(t, np.ndarray):
        if t.dtype not in (word, _arrays.numpy_dtype(_DTYPE_NAMES[want])):
            raise ValueError(f"kv: numpy arrays must hold {want}'s bits as {word}, got {t.dtype}")
        return t.view(word)
    if not isinstance(t, torch.Tensor) or t.dtype != want:
        raise ValueError(f"kv: expected tensors of {want}, got {getattr(t, 'dtype', type(t).__name__)}")
    return t.detach().cpu().contiguous().view(_TORCH_WORDS[want]).numpy()


_TORCH_WORDS = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float8_e4m3fn: torch.uint8}
_WORDS = {torch.bfloat16: np.int16, torch.float16: np.int16, torch.float8_e4m3fn: np.uint8}

__all__ = ["FreePrefixStore", "StoredBlock", "layer_chunk"]
