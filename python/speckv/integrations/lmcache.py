"""speckv as an LMCache serde: ``import speckv.integrations.lmcache`` registers ``"speckv"``.

LMCache's distributed storage (the multiprocess L2 path) hands a serde each KV chunk as a
tensor (vLLM's layout: ``[2, layers, tokens, hidden]``) and never the token ids, so only the
models that need no predictor fit here:

- ``model="free"``: speckv's predictor-free fast lane (``speckv.encode`` without ``mu``: static
  per-chunk tables shared by channels alike, decoded by table lookups; channel ``i % hidden``);
- ``model="stats"``: a Gaussian around per-channel means with per-channel scales
  (``stats=`` a safetensors file from ``fit_stats``, tensors ``mean`` and ``std`` shaped
  ``[2, layers, 1, hidden]``, measured on calibration text), coded with the bins model for
  16-bit formats (``speckv.restore_model``: static tables, several times faster to decode than
  the exact model for ~0.1% more bytes), the exact model for fp8.

Lossless. Each chunk becomes a 16-byte header and a speckv stream, or the raw bytes where the
stream would not be smaller, so ``estimate_serialized_size`` (raw size + 16) is a strict upper
bound. Header (little-endian)::

    offset  size  field
    0       4     magic b"SPKL"
    4       1     version (1)
    5       1     flags: 1 = raw bytes follow, 2 = the stats model was used
    6       2     reserved, 0
    8       8     payload length N
    16      N     payload

LMCache configuration (an L2 adapter spec with a serde; every key of the serde:
``speckv.integrations.lmcache_config.LMCacheSerdeConfig``)::

    {"type": "fs", "base_path": "/cache", "serde": {"type": "speckv", "model": "stats",
     "stats": "/path/stats.safetensors"}}

and ``import speckv.integrations.lmcache`` in the process before the adapters are built (for
example through LMCache's plugin or startup hook).
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from .. import _api, _arrays
from .._speckv import CorruptStreamError
from .lmcache_config import LMCacheSerdeConfig

SERDE_NAME = "speckv"
MAGIC = b"SPKL"
VERSION = 1
HEADER = 16
RAW = 1
STATS = 2
_WORDS = {2: np.uint16, 1: np.uint8, 4: np.uint32}


def _words(tensor: Any) -> tuple[np.ndarray, str]:
    """A torch tensor's bit patterns as a numpy array, and its speckv dtype name."""
    name = _arrays.dtype_name(tensor, "chunk")
    return _arrays.to_numpy(tensor.contiguous()), name


def encode_chunk(tensor: Any, stats: dict[str, Any] | None = None) -> bytes:
    """A KV chunk (a torch tensor) as header + payload (see the module docs)."""
    x, name = _words(tensor)
    raw = np.ascontiguousarray(x).view(np.uint8).tobytes()
    flags = 0
    data = None
    if stats is not None:
        mean, std = stats["mean"], stats["std"]
        try:
            np.broadcast_shapes(mean.shape, x.shape)
            data = _api.encode(x, np.broadcast_to(mean, x.shape), std, model=_api.restore_model(name))
            flags = STATS
        except ValueError:  # another layout than the statistics': the free model
            data = None
    if data is None:
        data = _api.encode(x)
    if len(data) >= len(raw):
        data, flags = raw, RAW
    return MAGIC + struct.pack("<BBHQ", VERSION, flags, 0, len(data)) + data


def decode_chunk(data: bytes, out: Any, stats: dict[str, Any] | None = None) -> None:
    """Decodes ``encode_chunk``'s bytes into the torch tensor ``out`` (its shape and dtype)."""
    view = memoryview(data)
    if len(view) < HEADER or bytes(view[:4]) != MAGIC:
        raise CorruptStreamError("speckv LMCache chunk: bad magic or truncated header")
    version, flags, reserved, length = struct.unpack_from("<BBHQ", view, 4)
    if version != VERSION or reserved != 0 or flags & ~(RAW | STATS):
        raise CorruptStreamError(f"speckv LMCache chunk: version {version}, flags {flags} not supported")
    if length > len(view) - HEADER:
        raise CorruptStreamError("speckv LMCache chunk: truncated payload")
    payload = view[HEADER : HEADER + length]
    import torch

    nbytes = out.numel() * out.element_size()
    if flags & RAW:
        if length != nbytes:
            raise CorruptStreamError("speckv LMCache chunk: raw payload of the wrong size")
        words = np.frombuffer(payload, dtype=np.uint8)
    else:
        if flags & STATS:
            if stats is None:
                raise CorruptStreamError("speckv LMCache chunk: coded with channel statistics this serde lacks")
            shape = tuple(out.shape)
            words = _api.decode(payload, np.broadcast_to(stats["mean"], shape), stats["std"])
        else:
            words = _api.decode(payload)
        # a coded chunk knows its dtype: one of another dtype of the same size (a model now
        # run in bf16 reading its fp16 chunks) would be bits of the wrong format
        coded, wanted = _arrays.dtype_name(words, "chunk"), _arrays.dtype_name(out, "out")
        if coded != wanted:
            raise CorruptStreamError(f"speckv LMCache chunk: coded as {coded}, the destination is {wanted}")
        words = np.ascontiguousarray(words).view(np.uint8).reshape(-1)
        if words.size != nbytes:
            raise CorruptStreamError("speckv LMCache chunk: decoded size differs from the destination's")
    flat = out.view(-1).view(torch.uint8)
    flat.copy_(torch.from_numpy(words.copy()))


def load_stats(path: str) -> dict[str, np.ndarray]:
    """``mean`` and ``std`` from a ``fit_stats`` file, as float32 arrays."""
    from safetensors.numpy import load_file

    tensors = load_file(path)
    if "mean" not in tensors or "std" not in tensors:
        raise ValueError(f"{path}: expected tensors 'mean' and 'std'")
    return {"mean": tensors["mean"].astype(np.float32), "std": np.maximum(tensors["std"].astype(np.float32), 1e-6)}


def fit_stats(caches: list[Any], path: str | None = None) -> dict[str, np.ndarray]:
    """Per-channel ``mean`` and ``std`` (``[2, layers, 1, hidden]``) of model caches (lists of
    per-layer ``(K, V)`` ``[batch, heads, tokens, dim]`` tensors), saved to ``path`` if given."""

    sums: Any = None
    sq: Any = None
    count = 0
    for kv in caches:
        stacked = chunk_of(kv).double()
        s, q = stacked.sum(dim=2, keepdim=True), (stacked**2).sum(dim=2, keepdim=True)
        sums = s if sums is None else sums + s
        sq = q if sq is None else sq + q
        count += stacked.shape[2]
    if sums is None or sq is None:
        raise ValueError("caches: at least one cache is needed")
    mean = sums / count
    std = (sq / count - mean**2).clamp(min=1e-12).sqrt()
    out = {"mean": mean.float().numpy(), "std": std.float().numpy()}
    if path is not None:
        from safetensors.numpy import save_file

        save_file(out, path)
    return out


def _tokens_major(t: Any) -> Any:
    """[batch, heads, tokens, dim] -> [tokens, heads * dim] (batch 0)."""
    return t[0].permute(1, 0, 2).reshape(t.shape[2], -1)


def chunk_of(kv: Any) -> Any:
    """A model cache (per-layer ``(K, V)``, ``[1, heads, tokens, dim]``) in vLLM's chunk layout
    ``[2, layers, tokens, heads * dim]``: what LMCache hands a serde."""
    import torch

    return torch.stack([torch.stack([_tokens_major(pair[w]) for pair in kv]) for w in (0, 1)])


def _lmcache_classes() -> tuple[Any, Any]:
    """The LMCache serde classes built on its base classes (ImportError without lmcache)."""
    import torch
    from lmcache.v1.distributed.serde.base import Deserializer, Serializer

    class SpeckvSerializer(Serializer):
        """speckv's lossless serializer for LMCache (see the module docs)."""

        def __init__(self, stats: dict[str, Any] | None = None) -> None:
            self.stats = stats

        def serialize(self, src: Any, dst: Any, key: Any) -> int:
            data = encode_chunk(src.tensor, self.stats)
            out = dst.tensor.view(-1).view(torch.uint8)
            if len(data) > out.numel():
                raise ValueError("speckv serde: the destination is smaller than estimate_serialized_size")
            out[: len(data)].copy_(torch.frombuffer(bytearray(data), dtype=torch.uint8))
            return len(data)

        def estimate_serialized_size(self, layout_desc: Any) -> int:
            total = 0
            for shape, dtype in zip(layout_desc.shapes, layout_desc.dtypes):
                n = 1
                for d in shape:
                    n *= int(d)
                total += n * torch.empty((), dtype=dtype).element_size()
            return total + HEADER

    class SpeckvDeserializer(Deserializer):
        def __init__(self, stats: dict[str, Any] | None = None) -> None:
            self.stats = stats

        def deserialize(self, src: Any, dst: Any, key: Any) -> None:
            data = src.tensor.view(-1).view(torch.uint8)
            header = bytes(data[:HEADER].numpy())
            length = struct.unpack_from("<Q", header, 8)[0] if len(header) == HEADER else 0
            decode_chunk(bytes(data[: HEADER + length].numpy()), dst.tensor, self.stats)

    return SpeckvSerializer, SpeckvDeserializer


def create_serde(kwargs: dict[str, object]) -> Any:
    """LMCache's factory: ``kwargs`` are ``LMCacheSerdeConfig``'s keys (``model``, ``stats``,
    ``max_workers``), checked before anything is built."""
    from lmcache.v1.distributed.serde.async_processor import AsyncSerdeProcessor

    config = LMCacheSerdeConfig.parse(kwargs)
    stats = load_stats(config.stats) if config.stats is not None else None
    serializer, deserializer = _lmcache_classes()
    return AsyncSerdeProcessor(serializer(stats), deserializer(stats), max_workers=config.max_workers)


def register() -> None:
    """Registers the ``"speckv"`` serde with LMCache (done on import when LMCache is there)."""
    from lmcache.v1.distributed.serde.factory import get_registered_serde_types, register_serde_factory

    if SERDE_NAME not in get_registered_serde_types():
        register_serde_factory(SERDE_NAME, create_serde)


try:
    register()
except ImportError:  # no LMCache here: the chunk functions still work
    pass


__all__ = [
    "SERDE_NAME",
    "chunk_of",
    "create_serde",
    "decode_chunk",
    "encode_chunk",
    "fit_stats",
    "load_stats",
    "register",
]
