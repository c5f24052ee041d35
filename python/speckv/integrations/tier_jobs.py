"""``TierJobs``: the work of an offload tier behind a serving engine's host buffer, with no
engine in it: store jobs code chunks from the host buffer into a ``speckv.store`` backend,
load jobs decode entries back into it, on a pool of threads, with counters and
back-pressure.

The engine side (``speckv.integrations.vllm_tier.SpeckvTier`` for vLLM's tiered offloading)
only translates: the engine's keys and slots in, finished jobs out. Everything that decides
what is stored, served or refused is here, and is tested without vLLM.

Guarantees (each tested in ``tests/integrations/test_tier_jobs.py``):

- a load writes a chunk's slot only with the bytes that were stored under its key: an entry
  missing, damaged (checksum), foreign (another namespace's key or codec) or unreadable ends
  the job there; the chunks before it are kept (``successful_keys``), the rest recomputed by
  the engine, and a damaged entry is deleted so that it is never offered again;
- a store job never blocks the caller: beyond ``max_pending`` jobs queued or running, a new
  one finishes at once as failed (counted in ``stores_dropped``); loads are never dropped;
- a backend that fails (``StoreError``: I/O, a lost Redis) is counted and then left alone
  for ``PAUSE_S`` seconds: lookups answer "absent" without asking it and stores are dropped,
  so that a dead server costs the engine recomputation, not a stalled scheduler;
- an exception of any other kind fails its job and is logged with its traceback, never
  raised into the engine.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from .._speckv import CorruptStreamError
from ..store import Backend, StoreError, pack_entry, touch_chain, unpack_entry
from .chunk_codec import ChunkCodec

log = logging.getLogger("speckv.tier")

# seconds a failed backend is left alone before it is asked again
PAUSE_S = 5.0
COUNTERS = (
    "chunks_stored",
    "raw_bytes_stored",
    "coded_bytes_stored",
    "chunks_present",
    "chunks_loaded",
    "bytes_loaded",
    "lookups",
    "hits",
    "faults",
    "stores_dropped",
    "encode_seconds",
    "decode_seconds",
    "load_seconds",
)


@dataclass(frozen=True)
class Finished:
    """A finished job: ``success`` when every chunk was done; ``done`` the keys that were
    (a load's prefix of its keys, in order), ``seconds`` its wall time on the pool, ``raw_bytes``
    the chunk bytes it moved."""

    job_id: int
    success: bool
    done: tuple[bytes, ...]
    seconds: float
    raw_bytes: int


class TierJobs:
    """Store and load jobs between ``primary`` (a ``[chunks, chunk_bytes]`` uint8 or int8 array
    over the engine's host buffer) and ``backend``, coded by ``codec`` (module docs).

    ``on_stored(keys)``: called on the pool's thread with the engine keys a store job put."""

    def __init__(
        self,
        primary: np.ndarray,
        backend: Backend,
        codec: ChunkCodec,
        *,
        workers: int = 2,
        max_pending: int = 64,
        on_stored: Callable[[list[bytes]], None] | None = None,
    ) -> None:
        if primary.ndim != 2 or primary.dtype.itemsize != 1 or primary.shape[1] != codec.chunk_bytes:
            got = f"{primary.dtype} {list(primary.shape)}"
            raise ValueError(f"primary: expected [chunks, {codec.chunk_bytes}] bytes, got {got}")
        self.primary = primary
        self.backend = backend
        self.codec = codec
        self.max_pending = max_pending
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="speckv-tier")
        self._lock = threading.Lock()
        self._finished: list[Finished] = []
        self._futures: set[Future[None]] = set()
        self._pending_stores = 0
        self._paused_until = 0.0
        self._counters: dict[str, float] = dict.fromkeys(COUNTERS, 0)
        self._on_stored = on_stored

    # -- the scheduler's calls: quick, never blocking on the backend's data ------------------

    def has(self, key: bytes) -> bool:
        """Whether ``key``'s chunk is stored (the backend asked for presence, no entry read)."""
        self._count("lookups")
        if self._paused():
            return False
        try:
            found = self.backend.has(self.codec.key(key))
        except StoreError as e:
            self._fault("lookup", e)
            return False
        if found:
            self._count("hits")
        return found

    def touch(self, keys: Sequence[bytes]) -> None:
        """Marks ``keys`` as just used (where the backend keeps a least-recently-used order)."""
        if self._paused() or not keys:
            return
        try:
            touch_chain(self.backend, [self.codec.key(k) for k in keys])
        except StoreError as e:
            self._fault("touch", e)

    def submit_store(self, job_id: int, keys: Sequence[bytes], slots: Sequence[int]) -> None:
        """Codes the chunks in ``slots`` of the host buffer under ``keys``, off the caller's
        thread (or drops the job: module docs)."""
        keys, slots = list(keys), [int(s) for s in slots]
        if len(keys) != len(slots):
            raise ValueError(f"submit_store: {len(keys)} keys for {len(slots)} slots")
        with self._lock:
            drop = self._pending_stores >= self.max_pending or time.monotonic() < self._paused_until
            if not drop:
                self._pending_stores += 1
        if drop:
            self._count("stores_dropped", len(keys))
            self._finish(Finished(job_id, False, (), 0.0, 0))
            return
        self._submit(self._store, job_id, keys, slots)

    def submit_load(self, job_id: int, keys: Sequence[bytes], slots: Sequence[int]) -> None:
        """Decodes ``keys``' entries into ``slots`` of the host buffer, off the caller's thread."""
        keys, slots = list(keys), [int(s) for s in slots]
        if len(keys) != len(slots):
            raise ValueError(f"submit_load: {len(keys)} keys for {len(slots)} slots")
        self._submit(self._load, job_id, keys, slots)

    def finished(self) -> list[Finished]:
        """The jobs finished since the last call."""
        with self._lock:
            out, self._finished = self._finished, []
        return out

    def pending(self) -> int:
        """Jobs queued or running."""
        with self._lock:
            return len(self._futures)

    def drain(self) -> None:
        """Waits for every submitted job (their results stay for ``finished``)."""
        while True:
            with self._lock:
                futures = list(self._futures)
            if not futures:
                return
            for f in futures:
                f.exception()

    def counters(self) -> dict[str, float]:
        """Totals since start (``COUNTERS``), plus ``resident_bytes`` where the backend keeps
        a budget (it then counts its bytes; elsewhere, a folder or Redis, counting would read
        every entry's size) and ``evictions``."""
        with self._lock:
            out = dict(self._counters)
        if getattr(self.backend, "max_bytes", None) is not None and not self._paused():
            try:
                out["resident_bytes"] = int(self.backend.nbytes())
            except StoreError:
                pass
        out["evictions"] = int(getattr(self.backend, "evictions", 0))
        return out

    def shutdown(self) -> None:
        """Waits for every job, then lets go of the host buffer (the engine unmaps it)."""
        self.drain()
        self._pool.shutdown(wait=True)
        self.primary = np.empty((0, self.codec.chunk_bytes), dtype=np.uint8)

    # -- the pool's side ----------------------------------------------------------------------

    def _submit(self, fn: Callable[[int, list[bytes], list[int]], Finished], *args: Any) -> None:
        def run() -> None:
            job_id = args[0]
            try:
                result = fn(*args)
            except Exception:  # a bug must fail one job, never the engine
                log.exception("speckv tier: job %s failed", job_id)
                result = Finished(job_id, False, (), 0.0, 0)
            self._finish(result)

        with self._lock:
            future = self._pool.submit(run)
            self._futures.add(future)
        future.add_done_callback(self._forget)

    def _forget(self, future: Future[None]) -> None:
        with self._lock:
            self._futures.discard(future)

    def _store(self, job_id: int, keys: list[bytes], slots: list[int]) -> Finished:
        start = time.perf_counter()
        stored: list[bytes] = []
        ok = True
        try:
            for key, slot in zip(keys, slots):
                name = self.codec.key(key)
                if self.backend.has(name):
                    self._count("chunks_present")
                    continue
                t0 = time.perf_counter()
                payload = self.codec.encode(self.primary[slot])
                self._count("encode_seconds", time.perf_counter() - t0)
                if self.backend.put(name, pack_entry(payload, name)):
                    stored.append(key)
                    self._count("chunks_stored")
                    self._count("raw_bytes_stored", self.codec.chunk_bytes)
                    self._count("coded_bytes_stored", len(payload))
        except StoreError as e:
            self._fault("store", e)
            ok = False
        finally:
            with self._lock:
                self._pending_stores -= 1
        if stored and self._on_stored is not None:
            self._on_stored(stored)
        return Finished(job_id, ok, tuple(stored), time.perf_counter() - start, len(keys) * self.codec.chunk_bytes)

    def _load(self, job_id: int, keys: list[bytes], slots: list[int]) -> Finished:
        start = time.perf_counter()
        done: list[bytes] = []
        for key, slot in zip(keys, slots):
            name = self.codec.key(key)
            try:
                raw = self.backend.get(name)
                if raw is None:  # evicted since the lookup, or never there
                    self._count("faults")
                    break
                t0 = time.perf_counter()
                self.codec.decode_into(unpack_entry(raw, name), self.primary[slot])
                self._count("decode_seconds", time.perf_counter() - t0)
            except CorruptStreamError as e:
                self._fault("load", e)
                try:
                    self.backend.delete(name)  # never offered again
                except StoreError:
                    pass
                break
            except StoreError as e:
                self._fault("load", e)
                break
            done.append(key)
            self._count("chunks_loaded")
            self._count("bytes_loaded", len(raw))
        ok = len(done) == len(keys)
        seconds = time.perf_counter() - start
        self._count("load_seconds", seconds)
        return Finished(job_id, ok, tuple(done), seconds, len(done) * self.codec.chunk_bytes)

    # -- bookkeeping ------------------------------------------------------------------------------

    def _finish(self, result: Finished) -> None:
        with self._lock:
            self._finished.append(result)

    def _count(self, name: str, by: float = 1) -> None:
        with self._lock:
            self._counters[name] += by

    def _paused(self) -> bool:
        return time.monotonic() < self._paused_until

    def _fault(self, what: str, e: Exception) -> None:
        self._count("faults")
        if isinstance(e, StoreError):
            with self._lock:
                self._paused_until = time.monotonic() + PAUSE_S
            log.warning("speckv tier: %s: %s (the backend is left alone for %.0f s)", what, e, PAUSE_S)
        else:
            log.warning("speckv tier: %s: %s (the entry is deleted; the engine recomputes it)", what, e)


__all__ = ["COUNTERS", "PAUSE_S", "Finished", "TierJobs"]
