"""``TieredBackend``: storage tiers stacked into one backend (host RAM over a disk folder or a
Redis server), each with its own budget, and counters per tier.

Writes go through to every tier (the tiers are inclusive: a lower tier holds what an upper
one holds, as far as its own budget lets it), so an upper tier's eviction loses nothing the
lower tier kept; reads take the first tier that holds the key, and a lower tier's hit is
promoted into the tiers above it. A tier that fails (``StoreError``) is counted in its
``faults`` and passed over while another tier can answer: a dead Redis under a RAM tier
costs the entries only Redis held, not the tier above it.

>>> ram = DirectoryBackend("/dev/shm/kv", 8 << 30, durable=False)  # doctest: +SKIP
>>> tiers = TieredBackend([ram, RedisBackend("redis://127.0.0.1:6379/0")])  # doctest: +SKIP
>>> tiers.tier_stats()  # per tier: hits, misses, promotions, faults, evictions, bytes  # doctest: +SKIP
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from .backend import Backend, touch_chain
from .entry import StoreError


class TieredBackend:
    """``tiers`` (upper first) as one ``speckv.store.Backend`` (module docs)."""

    def __init__(self, tiers: Sequence[Backend]) -> None:
        if len(tiers) < 2:
            raise StoreError(f"TieredBackend: stack two tiers or more, got {len(tiers)}")
        self.tiers = list(tiers)
        self._lock = threading.Lock()
        self._counters = [{"hits": 0, "misses": 0, "promotions": 0, "faults": 0} for _ in self.tiers]

    def __repr__(self) -> str:
        return "TieredBackend([" + ", ".join(repr(t) for t in self.tiers) + "])"

    def _count(self, tier: int, name: str) -> None:
        with self._lock:
            self._counters[tier][name] += 1

    def _each(self, call: str, *args: Any) -> list[Any]:
        """``call(*args)`` on every tier; a failing tier counted and its answer None. Raises
        ``StoreError`` only when every tier failed."""
        answers: list[Any] = []
        failed = 0
        for i, tier in enumerate(self.tiers):
            try:
                answers.append(getattr(tier, call)(*args))
            except StoreError:
                self._count(i, "faults")
                answers.append(None)
                failed += 1
        if failed == len(self.tiers):
            raise StoreError(f"TieredBackend.{call}: every tier failed")
        return answers

    def get(self, key: str) -> bytes | None:
        failed = 0
        for i, tier in enumerate(self.tiers):
            try:
                value = tier.get(key)
            except StoreError:
                self._count(i, "faults")
                failed += 1
                continue
            if value is None:
                self._count(i, "misses")
                continue
            self._count(i, "hits")
            for j in range(i):  # promoted: the next read of this key is the upper tier's
                try:
                    if self.tiers[j].put(key, value, None):
                        self._count(j, "promotions")
                except StoreError:
                    self._count(j, "faults")
            return value
        if failed == len(self.tiers):
            raise StoreError("TieredBackend.get: every tier failed")
        return None

    def has(self, key: str) -> bool:
        return any(bool(a) for a in self._each("has", key))

    def put(self, key: str, value: bytes, parent: str | None = None) -> bool:
        return any(bool(a) for a in self._each("put", key, value, parent))

    def delete(self, key: str) -> None:
        self._each("delete", key)

    def keys(self) -> list[str]:
        seen: dict[str, None] = {}
        for answer in self._each("keys"):
            seen.update(dict.fromkeys(answer or []))
        return list(seen)

    def nbytes(self) -> int:
        """Bytes held by the upper tier (what its budget bounds)."""
        return int(self.tiers[0].nbytes())

    def touch_chain(self, keys: list[str]) -> None:
        for i, tier in enumerate(self.tiers):
            try:
                touch_chain(tier, keys)
            except StoreError:
                self._count(i, "faults")

    @property
    def evictions(self) -> int:
        """Evictions of the upper tier."""
        return int(getattr(self.tiers[0], "evictions", 0))

    def tier_stats(self) -> list[dict[str, Any]]:
        """Per tier, upper first: its ``repr``, hits, misses, promotions (into it), faults,
        evictions, and the bytes it holds (None where it cannot be asked)."""
        out = []
        with self._lock:
            counters = [dict(c) for c in self._counters]
        for tier, c in zip(self.tiers, counters):
            try:
                held: int | None = int(tier.nbytes())
            except StoreError:
                held = None
            out.append({"tier": repr(tier), **c, "evictions": int(getattr(tier, "evictions", 0)), "bytes": held})
        return out


__all__ = ["TieredBackend"]
