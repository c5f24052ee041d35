"""The cache container ("SPKC"): a model's KV cache as speckv streams, addressable by token
block, by layer and by K/V.

The byte layout (version 2) is documented, written and validated in the Rust core
(``rust/speckv/src/format/container.rs``); this module is the thin Python view of it, and
reads version 1 too (one block, a BLAKE2b-checksummed JSON header; written by the codec before
2026-12). No torch needed: ``speckv.info`` describes a container with this module alone.

The metadata block holds UTF-8 JSON written by ``speckv.hf``: the storage mode, the model,
calibration and predictor identities, and the prompt's digest.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from . import _speckv
from ._speckv import ChecksumError, CorruptStreamError, UnsupportedStreamError

MAGIC = b"SPKC"
VERSION: int = _speckv.CONTAINER_VERSION
# Version 1's JSON header is refused past this size before it is read.
MAX_V1_HEADER = 16 << 20
LAYOUTS = ("stacked", "per-layer")


@dataclass(frozen=True)
class Stream:
    """One speckv stream of a container: its bytes and how its chunks hold layers (stacked
    layout: ``layers_per_chunk`` or ``chunks_per_layer``, one of them 1)."""

    data: memoryview
    layers_per_chunk: int
    chunks_per_layer: int

    def chunks_of(self, layer: int) -> tuple[tuple[int, int], int]:
        """``((first, stop), skip)``: the chunks holding ``layer`` of a stacked stream, and the
        layers before it in the first of them."""
        if self.layers_per_chunk > 1:
            c = layer // self.layers_per_chunk
            return (c, c + 1), layer % self.layers_per_chunk
        return (layer * self.chunks_per_layer, (layer + 1) * self.chunks_per_layer), 0


@dataclass(frozen=True)
class Container:
    """A parsed, validated container (stream payloads are checked when decoded)."""

    version: int
    layout: str
    layers: int
    block_tokens: int
    tokens: int
    metadata: dict[str, Any]
    # blocks[b]: the block's streams, K then V (stacked) or layer 0 K, layer 0 V, ... (per
    # layer; None where the layer holds none of the block's tokens)
    blocks: list[list[Stream | None]]
    # per layer, how many of the last ``tokens`` it holds (a sliding-window layer: its window)
    layer_tokens: tuple[int, ...] = ()

    def token_range(self, b: int) -> tuple[int, int]:
        start = b * self.block_tokens
        return start, min(start + self.block_tokens, self.tokens)

    def held(self, layer: int) -> int:
        """Tokens ``layer`` holds: the last ones of the prompt."""
        return self.layer_tokens[layer] if self.layer_tokens else self.tokens

    def layer_range(self, b: int, layer: int) -> tuple[int, int]:
        """Block ``b``'s tokens that ``layer`` holds, as indices into the layer's own tokens
        (``start == stop`` where it holds none of them)."""
        return held_range(*self.token_range(b), self.tokens, self.held(layer))

    def layers_of(self, b: int, first: int, stop: int, which: int) -> tuple[bytes, list[int] | None]:
        """Block ``b``'s chunks holding layers ``first..stop - 1`` of its K (``which=0``) or V
        stream (stacked layout), cut out as a stream of their own (``speckv.cut_stream``), and
        that stream's shape: None where they are not whole chunks of just those layers."""
        stream = self.stream(b, first, which)
        (start, _), skip = stream.chunks_of(first)
        (_, end), _ = stream.chunks_of(stop - 1)
        if skip or min(start, end) < 0:
            return b"", None
        try:
            data = _speckv.stream_cut(_array(stream.data), start, end)
            return data, list(_speckv.info(_array(data))["shape"])
        except ValueError:
            return b"", None

    def stream(self, b: int, layer: int, which: int) -> Stream:
        """Block ``b``'s stream holding ``layer``'s K (``which=0``) or V (1);
        ``CorruptStreamError`` where the layer holds none of the block's tokens."""
        s = self.blocks[b][which if self.layout == "stacked" else 2 * layer + which]
        if s is None:
            raise CorruptStreamError(f"cache container: layer {layer} holds no token of block {b}")
        return s


def held_range(start: int, stop: int, tokens: int, held: int) -> tuple[int, int]:
    """Tokens ``start:stop`` of a ``tokens``-long prompt that a layer holding its last
    ``held`` has, as indices into the layer's own tokens (``lo == hi``: none of them)."""
    first = tokens - held
    lo = min(max(start, first), stop)
    return lo - first, max(lo, stop) - first


def _array(data: Any) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8)


def pack(
    metadata: dict[str, Any],
    layout: str,
    layers: int,
    block_tokens: int,
    tokens: int,
    blocks: list[list[bytes]],
    layer_tokens: list[int] | None = None,
) -> bytes:
    """A version-2 container of ``blocks`` (each a block's streams in layout order; ``b""``
    where a layer holds none of the block's tokens). ``layer_tokens``: per layer, how many of
    the last ``tokens`` it holds (per-layer layout; ``None`` or all equal to ``tokens``: every
    layer holds every token, and the container is what it was before layers could differ)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout: expected one of {LAYOUTS}, got {layout!r}")
    blob = json.dumps(metadata, sort_keys=True).encode()
    streams = [bytes(s) for block in blocks for s in block]
    if layer_tokens is not None and all(n == tokens for n in layer_tokens):
        layer_tokens = None
    shape = (layout == "per-layer", layers, block_tokens, tokens, layer_tokens)
    return _speckv.container_write(shape, blob, streams)


def parse(data: Any) -> Container:
    """The container in ``data`` (bytes-like), version 1 or 2, validated; typed errors
    (``CorruptStreamError``, ``ChecksumError``, ``UnsupportedStreamError``) otherwise."""
    view = memoryview(data).cast("B")
    if len(view) < 8 or bytes(view[:4]) != MAGIC:
        raise UnsupportedStreamError("not a speckv cache container (bad magic)")
    if struct.unpack_from("<H", view, 4)[0] == 1:
        return _parse_v1(view)
    d = _speckv.container_info(_array(view))
    metadata = _metadata(d["metadata"])
    per_block = d["streams_per_block"]
    streams = [
        Stream(view[s["offset"] : s["offset"] + s["length"]], int(s["layers_per_chunk"]), int(s["chunks_per_layer"]))
        if s is not None
        else None
        for s in d["streams"]
    ]
    blocks = [streams[i : i + per_block] for i in range(0, len(streams), per_block)]
    layer_tokens = tuple(int(n) for n in d["layer_tokens"])
    return Container(2, d["layout"], d["layers"], d["block_tokens"], d["tokens"], metadata, blocks, layer_tokens)


def _metadata(blob: bytes) -> dict[str, Any]:
    try:
        meta = json.loads(blob)
    except ValueError as e:
        raise CorruptStreamError(f"cache container metadata is not JSON: {e}") from None
    if not isinstance(meta, dict):
        raise CorruptStreamError("cache container metadata is not a JSON object")
    return meta


def _parse_v1(view: memoryview) -> Container:
    """Version 1: ``"SPKC"``, version u16 (1), reserved u16 (0), header length u32,
    BLAKE2b-64 of the header, the JSON header (with each stream's [offset, length] from its
    end), then the streams."""
    if len(view) < 20:
        raise CorruptStreamError("truncated cache container header")
    _, reserved, length = struct.unpack_from("<HHI", view, 4)
    if reserved != 0:
        raise CorruptStreamError("cache container version 1: reserved bytes are not zero")
    if length > min(MAX_V1_HEADER, len(view) - 20):
        raise CorruptStreamError("truncated cache container header")
    blob = bytes(view[20 : 20 + length])
    if hashlib.blake2b(blob, digest_size=8).digest() != bytes(view[12:20]):
        raise ChecksumError("cache container header checksum does not match")
    header = _metadata(blob)
    try:
        spans = [(int(o), int(n)) for o, n in header.pop("streams")]
        layers = int(header.pop("layers"))
        layout = header.pop("layout")
        per_chunk = int(header.pop("layers_per_chunk", 1))
        per_layer = int(header.pop("chunks_per_layer", 1))
    except (ValueError, KeyError, TypeError, OverflowError) as e:  # JSON allows Infinity
        raise CorruptStreamError(f"cache container header: {e}") from None
    if layers < 1 or per_chunk < 1 or per_layer < 1 or layout not in LAYOUTS:
        raise CorruptStreamError("cache container header: bad layout or layer counts")
    payload = view[20 + length :]
    expected = 0
    for o, n in spans:
        if o != expected or n < 0:
            raise CorruptStreamError("cache container: streams are not back to back")
        expected += n
    if expected != len(payload) or len(spans) != (2 if layout == "stacked" else 2 * layers):
        raise CorruptStreamError("cache container: stream table does not match the payload")
    streams: list[Stream | None] = [Stream(payload[o : o + n], per_chunk, per_layer) for o, n in spans]
    first = streams[0]
    assert first is not None
    shape = _speckv.info(_array(first.data))["shape"]
    tokens = int(shape[3] if layout == "stacked" else shape[2]) if len(shape) >= 4 else 0
    return Container(1, layout, layers, max(tokens, 1), tokens, header, [streams], (tokens,) * layers)


def describe(data: Any) -> dict[str, Any]:
    """``speckv.info`` of a container: its fields, metadata, sizes and every stream's facts."""
    c = parse(data)
    streams = []
    for b, block in enumerate(c.blocks):
        for s in block:
            if s is None:  # a layer that holds none of the block's tokens
                continue
            facts = _speckv.info(_array(s.data))
            facts.update(block=b, layers_per_chunk=s.layers_per_chunk, chunks_per_layer=s.chunks_per_layer)
            streams.append(facts)
    total = len(memoryview(data))
    scalars = sum(s["n_scalars"] for s in streams)
    return {
        "container": True,
        "version": c.version,
        "layout": c.layout,
        "layers": c.layers,
        "tokens": c.tokens,
        "block_tokens": c.block_tokens,
        "blocks": len(c.blocks),
        "layer_tokens": list(c.layer_tokens),
        "metadata": c.metadata,
        "total_bytes": total,
        "header_bytes": total - sum(s["total_bytes"] for s in streams),
        "raw_bytes": sum(s["raw_bytes"] for s in streams),
        "bits_per_scalar": 8 * total / scalars if scalars else 0.0,
        "streams": streams,
    }


__all__ = ["MAGIC", "VERSION", "Container", "Stream", "describe", "held_range", "pack", "parse"]
