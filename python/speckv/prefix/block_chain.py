"""``BlockChain``: token blocks named by a hash chain in a ``speckv.store`` backend, the part
every prefix store shares: keys, matching a prompt's stored prefix, and the counters.

Block ``i`` of a prompt is stored under ``k_i = H(k_{i-1} || block_i)``, ``k_{-1}`` the store's
namespace (a digest of everything that must match for an entry to be served: model, coding,
storage dtype, block size), as vLLM and LMCache name their blocks: two prompts that share a
prefix share its blocks' entries, and a key names its whole prefix.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from .._speckv import CorruptStreamError, PredictionMismatchError
from ..store import Backend, StoreError, pack_entry, touch_chain, unpack_entry

T = TypeVar("T")


def chain_keys(namespace: bytes, input_ids: torch.Tensor, block_size: int) -> list[str]:
    """Block keys: ``k_0 = H(namespace || block_0)``, ``k_i = H(k_{i-1} || block_i)``, with H
    BLAKE2b-128 and a block its token ids as little-endian int64; hex. Only whole blocks."""
    ids = prompt_ids(input_ids)
    out = []
    previous = namespace
    for b in range(ids.shape[1] // block_size):
        block = ids[0, b * block_size : (b + 1) * block_size].numpy().astype("<i8").tobytes()
        previous = hashlib.blake2b(previous + block, digest_size=16).digest()
        out.append(previous.hex())
    return out


def prompt_ids(input_ids: torch.Tensor) -> torch.Tensor:
    """``input_ids`` as a CPU int64 ``[1, tokens]`` tensor (ValueError for another shape)."""
    ids = torch.as_tensor(input_ids).detach().cpu().to(torch.int64)
    if ids.ndim != 2 or ids.shape[0] != 1:
        raise ValueError(f"input_ids: expected shape [1, tokens], got {tuple(ids.shape)}")
    return ids.contiguous()


class BlockChain:
    """Keys, matching and counters of blocks of ``block_size`` tokens in ``backend``, under
    the namespace of ``identity`` (a JSON-able dict)."""

    def __init__(self, backend: Backend, block_size: int, identity: dict[str, Any]) -> None:
        if block_size < 1:
            raise ValueError(f"block_size: must be at least 1, got {block_size}")
        self.backend = backend
        self.block_size = int(block_size)
        self.namespace = hashlib.blake2b(json.dumps(identity, sort_keys=True).encode(), digest_size=16).digest()
        self._stats = {
            "hits": 0,
            "misses": 0,
            "tokens_put": 0,
            "tokens_deduplicated": 0,
            "corrupt_entries": 0,
            "store_errors": 0,
            # a matched prefix that ended at a missing block whose successor is stored: a
            # backend that evicted a middle block (Redis), or a writer that died mid-chain
            "holes": 0,
            # blocks a budgeted backend declined to store (no room for them)
            "declined": 0,
        }

    def keys(self, input_ids: torch.Tensor) -> list[str]:
        """The chain of keys of ``input_ids``'s whole blocks."""
        return chain_keys(self.namespace, prompt_ids(input_ids), self.block_size)

    def match(self, input_ids: torch.Tensor, *, read: bool = True) -> int:
        """Tokens of the longest stored block-aligned prefix of ``input_ids``: with ``read``,
        entries read and their checksums checked (nothing decoded), what ``get`` serves unless
        an entry changes in between; without, from the backend's index alone (``has``: no
        entry read), and a damaged entry is found when ``get`` reads it. The matched blocks
        count as used (``speckv.store.touch_chain``)."""
        keys = self.keys(input_ids)
        n = 0
        try:
            for key in keys:
                if read:
                    raw = self.backend.get(key)
                    if raw is None:
                        break
                    unpack_entry(raw, key)
                elif not self.backend.has(key):
                    break
                n += 1
            if n < len(keys) - 1 and self.backend.has(keys[n + 1]):
                self._stats["holes"] += 1
            self._used(keys[:n])
        except (CorruptStreamError, StoreError) as e:
            self._stats["corrupt_entries" if not isinstance(e, StoreError) else "store_errors"] += 1
        return n * self.block_size

    def _read_chain(self, keys: list[str], accept: Callable[[int, bytes], T], start: int = 0) -> list[T]:
        """``accept(b, entry)`` for blocks ``b = start, start + 1, ...`` of ``keys`` while they
        are stored, ``entry`` the block's payload with its checksum and key checked. The chain
        ends at the first block that is missing (a miss), damaged (``CorruptStreamError`` or
        ``PredictionMismatchError``, from the entry or from ``accept``: a corrupt entry) or
        unreadable (``StoreError``); the blocks before it are kept, counted as hits, and used."""
        out: list[T] = []
        for b in range(start, len(keys)):
            try:
                raw = self.backend.get(keys[b])
                if raw is None:
                    self._stats["misses"] += 1
                    break
                out.append(accept(b, unpack_entry(raw, keys[b])))
            except (CorruptStreamError, PredictionMismatchError, StoreError) as e:
                self._stats["corrupt_entries" if not isinstance(e, StoreError) else "store_errors"] += 1
                break
            self._stats["hits"] += 1
        self._used(keys[: start + len(out)])
        return out

    def _used(self, keys: list[str]) -> None:
        """Tells the backend a chain was used (its least-recently-used order), never failing
        the caller: an order not kept costs an eviction choice, not an entry."""
        try:
            touch_chain(self.backend, keys)
        except StoreError:
            self._stats["store_errors"] += 1

    def _put_chain(
        self,
        input_ids: torch.Tensor,
        code: Callable[[int, str], bytes],
        stored_already: Callable[[int], None] | None = None,
    ) -> int:
        """Stores block ``b`` of ``input_ids`` as ``code(b, key)`` where it is not stored intact
        yet (``stored_already(b)`` where it is; blocks in order); returns the tokens stored. A
        backend that fails (``StoreError``) ends the storing there, counted in the stats: the
        blocks after one that could not be stored are not stored either."""
        parent, new, reached = None, 0, 0
        keys = self.keys(input_ids)
        for b, key in enumerate(keys):
            try:
                intact = self._intact(key)
            except StoreError:
                self._stats["store_errors"] += 1
                break
            if intact:
                if stored_already is not None:
                    stored_already(b)
                self._stats["tokens_deduplicated"] += self.block_size
                parent, reached = key, b + 1
                continue
            if b == reached and b and not new:
                self._used(keys[:b])  # the prefix being extended is the newest: kept while it grows
            data = code(b, key)
            try:
                stored = self.backend.put(key, pack_entry(data, key), parent)
                # declined (no room, or its prefix is gone): nothing after it could be reached
                declined = not stored and not self.backend.has(key)
            except StoreError:
                self._stats["store_errors"] += 1
                break
            if declined:
                self._stats["declined"] += 1
                break
            if stored:
                new += self.block_size
            parent, reached = key, b + 1
        self._used(keys[:reached])
        self._stats["tokens_put"] += new
        return new

    def _intact(self, key: str) -> bool:
        """Whether ``key`` holds an undamaged entry; a damaged one is deleted (it is then
        stored again, and so are the blocks after it)."""
        raw = self.backend.get(key)
        if raw is None:
            return False
        try:
            unpack_entry(raw, key)
        except CorruptStreamError:
            self._stats["corrupt_entries"] += 1
            self.backend.delete(key)
            return False
        return True

    def stats_counters(self) -> dict[str, int]:
        """``stats`` without asking the backend (its blocks and bytes): this object's counters."""
        return dict(self._stats)

    def stats(self) -> dict[str, int]:
        """Blocks and bytes held, and this store object's hits, misses, tokens stored,
        tokens found already stored (deduplicated) and damaged entries met."""
        keys = self.backend.keys()
        evictions = int(getattr(self.backend, "evictions", 0))
        return {"blocks": len(keys), "bytes": self.backend.nbytes(), "evictions": evictions, **self._stats}


__all__ = ["BlockChain", "chain_keys", "prompt_ids"]
