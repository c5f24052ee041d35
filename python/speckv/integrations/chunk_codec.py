"""``ChunkCodec``: one offload chunk (a row of bytes from a serving engine's host KV buffer)
coded into a store entry and decoded back, bit for bit, with no model and no engine.

An engine's host tier holds a chunk as opaque bytes in the engine's own layout (vLLM's CPU
primary tier: every layer's blocks of one chunk, each worker's page, page padding). What the
codec needs to know is the scalars' dtype, which the engine's config says; the channel period
(``head_dim``, or ``heads * head_dim``) is found from the first chunk's words
(``speckv._channels.detect_period``) and kept, since every chunk of one engine has the same
layout. The stream records its period, so decoding never depends on that choice.

Codings (``CODINGS``): ``"fast"`` (the predictor-free fast lane, ``speckv.encode(...,
lane="fast")``; the default) and ``"none"`` (the bytes as they are: the raw tier a
compressed one is measured against, with the same keys, budget and eviction). A dtype the fast
lane does not code (float32) is stored as ``"none"``.

Entry payload (little-endian), inside ``speckv.store.pack_entry`` (length and a checksum keyed
by the entry's key, so that a damaged or misplaced entry is refused)::

    offset  size  field
    0       4     magic b"SPKC"
    4       1     payload version (1)
    5       1     coding: 0 none, 1 fast
    6       1     dtype code (``DTYPE_CODES``)
    7       1     reserved, 0
    8       8     N: the chunk's bytes
    16      ...   none: the N bytes; fast: a speckv stream of N / width scalars

Keys: ``ChunkCodec.key(offload_key)`` is 32 hex digits, a BLAKE2b-128 of the codec's
namespace (the engine's model, dtype, chunk size and layout: ``namespace``) and the engine's
own key for the chunk, so that a chunk stored by an engine of another model or layout is a
miss, never a wrong block, and engines of one configuration share entries.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Mapping
from typing import Any

import numpy as np

from .. import _api, _arrays, _speckv
from .._channels import detect_period
from .._speckv import CorruptStreamError

MAGIC = b"SPKC"
PAYLOAD_VERSION = 1
HEADER = struct.Struct("<4sBBBBQ")
CODINGS = ("fast", "none")
_CODING_IDS = {"none": 0, "fast": 1}
# the engine's names for its cache dtypes -> the dtype names speckv's streams record
ENGINE_DTYPES = {
    "bfloat16": "bfloat16",
    "bf16": "bfloat16",
    "float16": "float16",
    "half": "float16",
    "fp16": "float16",
    "fp8": "float8_e4m3fn",
    "fp8_e4m3": "float8_e4m3fn",
    "float8_e4m3fn": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
    "float8_e5m2": "float8_e5m2",
    "float32": "float32",
    "float": "float32",
    "uint8": "uint8",
}
# dtype -> the byte the payload records; "uint8": bytes of no known float format (stored as
# they are)
DTYPE_CODES = {"uint8": 0, "bfloat16": 1, "float16": 2, "float8_e4m3fn": 3, "float8_e5m2": 4, "float32": 5}
# namespace version: bump when what a key names changes
KEY_VERSION = 1


def engine_dtype(name: str) -> str:
    """speckv's dtype name for an engine's cache dtype name (``"bfloat16"``, ``"fp8_e4m3"``,
    ``"torch.float16"``, ...); ``ValueError`` naming the known ones otherwise."""
    key = str(name).removeprefix("torch.").lower()
    if key not in ENGINE_DTYPES:
        raise ValueError(f"cache dtype {name!r}: expected one of {', '.join(sorted(ENGINE_DTYPES))}")
    return ENGINE_DTYPES[key]


class ChunkCodec:
    """Codes chunks of ``chunk_bytes`` bytes of ``dtype`` scalars (module docs).

    ``namespace``: what names this engine's chunks (model, dtype, layout; any JSON-able
    mapping): keys are derived from it. ``coding``: ``"fast"`` or ``"none"``. ``channels``:
    the period of the fast lane's channels (None: found from the first chunk coded)."""

    def __init__(
        self,
        dtype: str,
        chunk_bytes: int,
        namespace: Mapping[str, Any],
        *,
        coding: str = "fast",
        channels: int | None = None,
    ) -> None:
        if coding not in CODINGS:
            raise ValueError(f"coding: expected one of {CODINGS}, got {coding!r}")
        self.dtype = engine_dtype(dtype)
        width = 1 if self.dtype == "uint8" else _arrays.numpy_dtype(self.dtype).itemsize
        if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes <= 0:
            raise ValueError(f"chunk_bytes: expected a positive int, got {chunk_bytes!r}")
        if chunk_bytes % width:
            raise ValueError(f"chunk_bytes: {chunk_bytes} is not a whole number of {self.dtype} scalars")
        if channels is not None and (isinstance(channels, bool) or not isinstance(channels, int) or channels < 1):
            raise ValueError(f"channels: expected a positive int, got {channels!r}")
        self.chunk_bytes = chunk_bytes
        self.width = width
        # the fast lane codes 8- and 16-bit floats; anything else is stored as it is
        self.coding = coding if self.dtype not in ("uint8", "float32") else "none"
        self.channels = channels
        self.namespace = {"key_version": KEY_VERSION, **dict(namespace)}
        self.namespace.update(dtype=self.dtype, chunk_bytes=chunk_bytes)
        named = json.dumps(self.namespace, sort_keys=True, default=str).encode()
        self._salt = hashlib.blake2b(named, digest_size=16).digest()

    def key(self, offload_key: bytes) -> str:
        """The store key of the engine's chunk key ``offload_key`` (32 hex digits)."""
        return hashlib.blake2b(bytes(offload_key), digest_size=16, key=self._salt).hexdigest()

    def encode(self, chunk: Any, *, threads: int | None = 1) -> bytes:
        """The payload of ``chunk``: ``chunk_bytes`` bytes (bytes, a memoryview or a uint8 /
        int8 array of them)."""
        raw = np.frombuffer(chunk, dtype=np.uint8) if not isinstance(chunk, np.ndarray) else chunk.reshape(-1)
        if raw.nbytes != self.chunk_bytes:
            raise ValueError(f"chunk: expected {self.chunk_bytes} bytes, got {raw.nbytes}")
        coding, dtype = _CODING_IDS[self.coding], DTYPE_CODES[self.dtype]
        head = HEADER.pack(MAGIC, PAYLOAD_VERSION, coding, dtype, 0, self.chunk_bytes)
        if self.coding == "none":
            return head + raw.tobytes()
        scalars = raw.view(np.uint8).view(_arrays.numpy_dtype(self.dtype))
        if self.channels is None:
            # one engine's chunks share a layout: found once, from the first chunk's words
            self.channels = detect_period(scalars)
        return head + _api.encode(scalars, lane="fast", channels=self.channels, threads=threads)

    def decode_into(self, payload: bytes, out: np.ndarray, *, threads: int | None = 1) -> None:
        """Decodes ``payload`` into ``out`` (``chunk_bytes`` writable bytes, a uint8 or int8
        array). ``CorruptStreamError`` for a payload of another dtype, size or format, or a
        damaged stream; ``out`` is then left partly written (the engine recomputes it)."""
        if len(payload) < HEADER.size:
            raise CorruptStreamError("chunk payload: shorter than its header")
        magic, version, coding, dtype_code, _, n = HEADER.unpack_from(payload)
        if magic != MAGIC or version != PAYLOAD_VERSION:
            raise CorruptStreamError("chunk payload: not a speckv chunk of this version")
        if dtype_code != DTYPE_CODES[self.dtype] or n != self.chunk_bytes or n != out.nbytes:
            raise CorruptStreamError(f"chunk payload: dtype code {dtype_code}, {n} bytes; not this tier's chunks")
        body = memoryview(payload)[HEADER.size :]
        flat = out.reshape(-1).view(np.uint8)
        if coding == _CODING_IDS["none"]:
            if len(body) != n:
                raise CorruptStreamError("chunk payload: raw body of the wrong length")
            flat[:] = np.frombuffer(body, dtype=np.uint8)
            return
        if coding != _CODING_IDS["fast"]:
            raise CorruptStreamError(f"chunk payload: unknown coding {coding}")
        stream = np.frombuffer(body, dtype=np.uint8)
        if _speckv.info(stream)["dtype"] != self.dtype:
            raise CorruptStreamError("chunk payload: the stream holds another dtype's chunk")
        if flat.ctypes.data % self.width:  # the core writes whole words: an odd slot takes a copy
            words = _api.decode(body, threads=threads)
            flat[:] = words.reshape(-1).view(np.uint8)
            return
        try:
            # straight into the slot: no output allocated, nothing copied after decoding
            _speckv.decode_into(stream, flat, _api.resolve_threads(threads))
        except ValueError as e:  # the stream's length is not the slot's
            raise CorruptStreamError(f"chunk payload: {e}") from None


__all__ = ["CODINGS", "DTYPE_CODES", "ENGINE_DTYPES", "MAGIC", "PAYLOAD_VERSION", "ChunkCodec", "engine_dtype"]
