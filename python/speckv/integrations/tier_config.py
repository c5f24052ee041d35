"""``TierConfig``: the settings of speckv's secondary tier for vLLM's tiered offloading
(``speckv.integrations.vllm_tier.SpeckvTier``), parsed once and checked at start-up.

They arrive as the tier's entry in ``kv_connector_extra_config["secondary_tiers"]``; vLLM
reads ``type``, ``module_path`` and ``backpressure`` and hands every other key to the tier.
An unknown key is refused naming the closest known one, so that a typo (``max_byte``) fails
when the server starts instead of leaving the tier unbounded.

>>> TierConfig.parse({"store": "memory", "max_bytes": "8GB"}).max_bytes
8000000000
>>> TierConfig.parse({"store": "memory", "max_byte": "8GB"})  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
ValueError: SpeckvTier: unknown key 'max_byte' (did you mean 'max_bytes'?); known keys: channels, ...
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from .._sizes import parse_size
from ..store import Backend, DirectoryBackend, MemoryBackend, RedisBackend
from ..store.redis_backend import SCHEMES as REDIS_SCHEMES
from .chunk_codec import CODINGS

MEMORY = "memory"
LOCALITIES = ("local", "remote")


@dataclass(frozen=True)
class TierConfig:
    """One speckv secondary tier's settings (every key, its type, default and unit)."""

    store: str = MEMORY
    """where entries live: ``"memory"`` (this process, the scheduler's), a folder path (a
    file per entry; shared by the servers that mount it; survives restarts), or a
    ``redis://`` / ``rediss://`` / ``unix://`` URL (one server's memory shared by many), or
    ``redis-cluster://host:port`` (a Redis Cluster, any of its nodes)"""
    max_bytes: int | None = None
    """bytes of entries the tier may hold (``8e9``, ``"8GB"``, ``"512MiB"``); least recently
    used entries are evicted past it. Required for ``"memory"``; optional for a folder;
    refused for Redis, whose budget is its own ``maxmemory`` (with ``maxmemory-policy
    allkeys-lru``)"""
    codec: str = "fast"
    """``"fast"``: the predictor-free fast lane (about 0.7x the bytes of bf16/fp16 chunks,
    decoded at several hundred MB/s per core); ``"none"``: stored as they are"""
    workers: int = 2
    """threads that code stores and decode loads (the speckv core releases the GIL)"""
    max_pending: int = 64
    """store jobs queued or running before new ones are dropped (back-pressure: a dropped
    store is a block the tier does not get, never a stalled scheduler); loads are never
    dropped"""
    channels: int | None = None
    """the fast lane's channel period in scalars (None: found from the first chunk's words)"""
    name: str = "default"
    """a name in every key: tiers of other names never serve each other's entries"""
    enable_kv_events: bool = False
    """emit vLLM's BlockStored / BlockRemoved events for this tier (where KV events are on)"""
    locality: str | None = None
    """``"local"`` or ``"remote"``: where this tier's storage is, for vLLM's tier filters"""

    @classmethod
    def keys(cls) -> list[str]:
        return sorted(f.name for f in fields(cls))

    @classmethod
    def parse(cls, options: Mapping[str, Any]) -> TierConfig:
        """The settings in ``options`` (the tier's config, less what vLLM reads itself);
        ``ValueError`` with one line naming the key for anything unknown or out of range."""
        known = cls.keys()
        for key in options:
            if key not in known:
                close = difflib.get_close_matches(str(key), known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ValueError(f"SpeckvTier: unknown key {key!r}{hint}; known keys: {', '.join(known)}")
        o = dict(options)
        store = o.get("store", MEMORY)
        if not isinstance(store, str) or not store:
            raise ValueError(f"SpeckvTier: store: expected 'memory', a folder or a redis:// URL, got {store!r}")
        max_bytes = None if o.get("max_bytes") is None else parse_size(o["max_bytes"], "SpeckvTier: max_bytes")
        if store == MEMORY and max_bytes is None:
            raise ValueError(
                "SpeckvTier: max_bytes: required with store='memory' (an in-process tier without a "
                "budget grows until the server runs out of memory)"
            )
        if store.startswith(REDIS_SCHEMES) and max_bytes is not None:
            raise ValueError(
                "SpeckvTier: max_bytes: a Redis server's budget is its own: set its maxmemory and "
                "maxmemory-policy allkeys-lru"
            )
        codec = o.get("codec", "fast")
        if codec not in CODINGS:
            raise ValueError(f"SpeckvTier: codec: expected one of {', '.join(CODINGS)}, got {codec!r}")
        channels = o.get("channels")
        if channels is not None:
            channels = _positive_int(channels, "channels", 1 << 20)
        locality = o.get("locality")
        if isinstance(locality, str):
            locality = locality.lower()  # vLLM's own tiers take "LOCAL" / "REMOTE"
        if locality is not None and locality not in LOCALITIES:
            raise ValueError(f"SpeckvTier: locality: expected one of {', '.join(LOCALITIES)}, got {locality!r}")
        events = o.get("enable_kv_events", False)
        if not isinstance(events, bool):
            raise ValueError(f"SpeckvTier: enable_kv_events: expected true or false, got {events!r}")
        name = o.get("name", "default")
        if not isinstance(name, str) or not name:
            raise ValueError(f"SpeckvTier: name: expected a non-empty string, got {name!r}")
        return cls(
            store=store,
            max_bytes=max_bytes,
            codec=codec,
            workers=_positive_int(o.get("workers", 2), "workers", 256),
            max_pending=_positive_int(o.get("max_pending", 64), "max_pending", 1 << 20),
            channels=channels,
            name=name,
            enable_kv_events=events,
            locality=locality,
        )

    def open_backend(self) -> Backend:
        """The backend ``store`` names, with ``max_bytes``."""
        if self.store == MEMORY:
            return MemoryBackend(self.max_bytes)
        if self.store.startswith(REDIS_SCHEMES):
            return RedisBackend(self.store, prefix=f"speckv-tier:{self.name}:")
        return DirectoryBackend(os.path.expanduser(self.store), self.max_bytes)


def _positive_int(value: Any, key: str, most: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= most:
        raise ValueError(f"SpeckvTier: {key}: expected an int from 1 to {most}, got {value!r}")
    return value


__all__ = ["LOCALITIES", "MEMORY", "TierConfig"]
