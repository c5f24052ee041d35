"""``MemoryBackend``: entries in this process's memory under a byte budget."""

from __future__ import annotations

import threading
from collections import OrderedDict

from .entry import StoreError, check_key


class MemoryBackend:
    """Entries in this process's memory, at most ``max_bytes`` of them (None: no limit).

    Eviction takes the least recently used entry that no other entry extends: a prefix loses
    its last blocks first and never a block in its middle. A ``put`` whose parent is absent is
    declined for the same reason. Thread-safe."""

    def __init__(self, max_bytes: int | None = None) -> None:
        if max_bytes is not None and max_bytes < 0:
            raise StoreError(f"max_bytes: must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, tuple[bytes, str | None]] = OrderedDict()
        self._children: dict[str, int] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self.evictions = 0

    def get(self, key: str) -> bytes | None:
        check_key(key)
        with self._lock:
            item = self._entries.get(key)
            if item is None:
                return None
            self._entries.move_to_end(key)
            return item[0]

    def has(self, key: str) -> bool:
        check_key(key)
        with self._lock:
            return key in self._entries

    def put(self, key: str, value: bytes, parent: str | None = None) -> bool:
        check_key(key)
        if parent is not None:
            check_key(parent)
        value = bytes(value)
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return False
            if parent is not None and parent not in self._entries:
                return False
            if self.max_bytes is not None and len(value) > self.max_bytes:
                return False
            # room first: evict leaves (never the parent being extended)
            while self.max_bytes is not None and self._bytes + len(value) > self.max_bytes:
                victim = next((k for k in self._entries if not self._children.get(k) and k != parent), None)
                if victim is None:
                    return False
                self._remove(victim)
                self.evictions += 1
            self._entries[key] = (value, parent)
            self._bytes += len(value)
            if parent is not None:
                self._children[parent] = self._children.get(parent, 0) + 1
                self._entries.move_to_end(parent, last=True)
                self._entries.move_to_end(key, last=True)
            return True

    def touch_chain(self, keys: list[str]) -> None:
        """Marks a chain (root first) as just used."""
        with self._lock:
            for k in keys:
                if k in self._entries:
                    self._entries.move_to_end(k)

    def _remove(self, key: str) -> None:
        value, parent = self._entries.pop(key)
        self._bytes -= len(value)
        self._children.pop(key, None)
        if parent is not None and parent in self._children:
            self._children[parent] -= 1
            if not self._children[parent]:
                del self._children[parent]

    def delete(self, key: str) -> None:
        """Removes ``key`` and every entry that extends it (no holes)."""
        check_key(key)
        with self._lock:
            doomed = {key} if key in self._entries else set()
            changed = True
            while changed:
                changed = False
                for k, (_, parent) in self._entries.items():
                    if parent in doomed and k not in doomed:
                        doomed.add(k)
                        changed = True
            # leaves first, so that child counts stay right
            for k in sorted(doomed, key=lambda k: self._depth(k), reverse=True):
                self._remove(k)

    def _depth(self, key: str) -> int:
        depth = 0
        parent = self._entries[key][1]
        while parent is not None and parent in self._entries:
            depth += 1
            parent = self._entries[parent][1]
        return depth

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._entries)

    def nbytes(self) -> int:
        return self._bytes
