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
speckv.settings.ConfigError: SpeckvTier: unknown key 'max_byte' (did you mean 'max_bytes'?); known keys: channels, ...
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, ClassVar

from ..settings import ConfigError, Settings, setting
from ..store import Backend, DirectoryBackend, MemoryBackend, RedisBackend
from ..store.redis_backend import SCHEMES as REDIS_SCHEMES
from .chunk_codec import CODINGS

MEMORY = "memory"
LOCALITIES = ("local", "remote")


@dataclass(frozen=True)
class TierConfig(Settings):
    """One speckv secondary tier's settings (every key, its type, default and unit)."""

    WHO: ClassVar[str] = "SpeckvTier"
    # vLLM reads these from the tier's entry itself and passes them on
    PASSED_THROUGH: ClassVar[tuple[str, ...]] = ("type", "module_path", "backpressure")
    EXAMPLE: ClassVar[dict[str, Any]] = {
        "type": "SpeckvTier",
        "module_path": "speckv.integrations.vllm_tier",
        "store": "memory",
        "max_bytes": "16GB",
    }

    store: str = setting(
        MEMORY,
        "str",
        """where entries live: `"memory"` (host RAM of the scheduler's process), a folder (a
        file per entry: survives restarts, shared by the servers that mount it), a
        `redis://`, `rediss://` or `unix://` URL (one Redis shared by many servers) or
        `redis-cluster://HOST:PORT` (a Redis Cluster, any of its nodes)""",
        side="tier",
    )
    max_bytes: int | None = setting(
        None,
        "size",
        """bytes of entries the tier may hold: least recently used entries are evicted past it.
        Required for `"memory"`, optional for a folder, refused for Redis (its budget is its own
        `maxmemory`, with `maxmemory-policy allkeys-lru`)""",
        unit="bytes",
        side="tier",
    )
    codec: str = setting(
        "fast",
        "choice",
        """`"fast"`: the predictor-free fast lane (about 0.7x the bytes of bf16 chunks);
        `"none"`: chunks stored as they are (a raw tier with the same keys, budget and
        eviction)""",
        choices=CODINGS,
        side="tier",
    )
    workers: int = setting(
        2,
        "int",
        "threads that code stores and decode loads (the core releases the GIL)",
        low=1,
        high=256,
        side="tier",
    )
    max_pending: int = setting(
        64,
        "int",
        """store jobs queued or running before new ones are dropped (back-pressure: a dropped
        store is a chunk the tier does not get, never a stalled scheduler; loads are never
        dropped)""",
        low=1,
        high=1 << 20,
        side="tier",
    )
    channels: int | None = setting(
        None,
        "int",
        "the fast lane's channel period (null: found from the first chunk's words)",
        unit="scalars",
        low=1,
        high=1 << 20,
        side="tier",
    )
    name: str = setting(
        "default",
        "str",
        "part of every key: tiers of other names never serve each other's entries",
        side="tier",
    )
    enable_kv_events: bool = setting(
        False,
        "bool",
        "emit vLLM's BlockStored events for chunks this tier stored (where vLLM's KV events are on)",
        side="tier",
    )
    locality: str | None = setting(
        None,
        "choice",
        "where the tier's storage is, for vLLM's tier filters",
        choices=(*LOCALITIES, *(x.upper() for x in LOCALITIES)),
        side="tier",
    )

    def check(self, given: set[str]) -> None:
        if self.store == MEMORY and self.max_bytes is None:
            raise ConfigError(
                "SpeckvTier: max_bytes: required with store='memory' (an in-process tier without a "
                "budget grows until the server runs out of memory)"
            )
        if self.store.startswith(REDIS_SCHEMES) and self.max_bytes is not None:
            raise ConfigError(
                "SpeckvTier: max_bytes: a Redis server's budget is its own: set its maxmemory and "
                "maxmemory-policy allkeys-lru"
            )

    def open_backend(self) -> Backend:
        """The backend ``store`` names, with ``max_bytes``."""
        if self.store == MEMORY:
            return MemoryBackend(self.max_bytes)
        if self.store.startswith(REDIS_SCHEMES):
            return RedisBackend(self.store, prefix=f"speckv-tier:{self.name}:")
        return DirectoryBackend(os.path.expanduser(self.store), self.max_bytes)


__all__ = ["LOCALITIES", "MEMORY", "TierConfig"]
