"""``SpeckvTier``: a compressed secondary tier for vLLM's tiered KV offloading
(``OffloadingConnector`` with ``TieringOffloadingSpec``), out of tree, named in the config.

vLLM copies KV blocks from the GPU into its CPU primary tier (its own, GPU-tested code); when
a chunk lands there, vLLM hands it to each secondary tier, and when a request needs a chunk
the primary no longer holds, a secondary tier writes it back into a primary slot. This tier
codes those chunks losslessly (the predictor-free fast lane by default) into a
``speckv.store`` backend: host memory under a byte budget, a folder, or a Redis server that
many servers share. It never touches a GPU tensor; all its work runs on its own threads in
vLLM's scheduler process (``speckv.integrations.tier_jobs.TierJobs``).

Configuration (every key: ``speckv.integrations.tier_config.TierConfig``)::

    --kv-transfer-config '{"kv_connector": "OffloadingConnector", "kv_role": "kv_both",
      "kv_connector_extra_config": {"spec_name": "TieringOffloadingSpec",
        "cpu_bytes_to_use": 4000000000,
        "secondary_tiers": [{"type": "SpeckvTier", "module_path": "speckv.integrations.vllm_tier",
                             "store": "memory", "max_bytes": "16GB"}]}}'

A chunk is named by vLLM's own key for it and this tier's namespace (the model, the cache
dtype, the chunk's bytes and tokens, the parallel layout and ``name``): servers of one
configuration share entries; any other configuration misses. A missing, damaged or foreign
entry is a miss: vLLM recomputes the chunk, never reads a wrong one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Collection, Iterable
from typing import Any, ClassVar

import numpy as np
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats
from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingCounterMetadata,
    OffloadingEvent,
    OffloadingGaugeMetadata,
    OffloadingMetricMetadata,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

from .chunk_codec import ChunkCodec, engine_dtype
from .tier_config import TierConfig
from .tier_jobs import TierJobs

log = logging.getLogger("speckv.tier")

# vLLM's metric names for this tier (counters unless said), labelled by the tier's ``name``
METRICS = {
    "chunks_stored": "vllm:kv_offload_speckv_chunks_stored",
    "raw_bytes_stored": "vllm:kv_offload_speckv_raw_bytes_stored",
    "coded_bytes_stored": "vllm:kv_offload_speckv_coded_bytes_stored",
    "chunks_loaded": "vllm:kv_offload_speckv_chunks_loaded",
    "bytes_loaded": "vllm:kv_offload_speckv_bytes_read",
    "hits": "vllm:kv_offload_speckv_hits",
    "faults": "vllm:kv_offload_speckv_faults",
    "stores_dropped": "vllm:kv_offload_speckv_stores_dropped",
    "evictions": "vllm:kv_offload_speckv_evictions",
    "encode_seconds": "vllm:kv_offload_speckv_encode_seconds",
    "decode_seconds": "vllm:kv_offload_speckv_decode_seconds",
}
RESIDENT = "vllm:kv_offload_speckv_resident_bytes"
_DOCS = {
    "chunks_stored": "Chunks the speckv tier stored.",
    "raw_bytes_stored": "Bytes of the chunks the speckv tier stored, as the primary tier holds them.",
    "coded_bytes_stored": "Bytes the speckv tier wrote for those chunks (coded).",
    "chunks_loaded": "Chunks the speckv tier decoded back into the primary tier.",
    "bytes_loaded": "Bytes of entries the speckv tier read to load chunks.",
    "hits": "Lookups the speckv tier answered present.",
    "faults": "Missing, damaged or unreadable entries and backend errors (each a chunk recomputed).",
    "stores_dropped": "Chunks not stored because the speckv tier's queue was full (back-pressure).",
    "evictions": "Entries the speckv tier's backend evicted for its budget.",
    "encode_seconds": "Seconds the speckv tier spent coding chunks.",
    "decode_seconds": "Seconds the speckv tier spent decoding chunks.",
}


class SpeckvTier(SecondaryTierManager):
    """vLLM's ``SecondaryTierManager`` over ``TierJobs`` (module docs). vLLM builds it from
    the tier's config entry; ``options`` are the keys of ``TierConfig``."""

    medium: ClassVar[Medium] = Medium.CPU

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        backpressure_detector: Any = None,
        **options: Any,
    ) -> None:
        self.config = TierConfig.parse(options)  # first: a bad key fails before anything starts
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.locality = None if self.config.locality is None else Locality(self.config.locality.upper())
        primary = np.asarray(primary_kv_view)
        primary = primary.view(np.uint8).reshape(primary.shape[0], -1)
        cfg = offloading_spec.config
        namespace = {
            "model": cfg.model.name,
            "tokens_per_hash": cfg.cache.tokens_per_hash,
            "blocks_per_chunk": cfg.cache.blocks_per_chunk,
            "tokens_per_block": list(offloading_spec.tokens_per_block),
            "world_size": cfg.parallel.world_size,
            "tp": cfg.parallel.tp_size,
            "pp": cfg.parallel.pp_size,
            "kv_cache_layout": cfg.kv_cache_layout,
            "canonical_layout": cfg.canonical_layout,
            "replicated_layout": cfg.replicated_layout,
            "name": self.config.name,
        }
        try:
            dtype = engine_dtype(cfg.model.dtype)
        except ValueError:  # a cache format speckv has no float type for: its bytes, as they are
            log.warning("speckv tier: cache dtype %r is stored uncoded (no speckv dtype for it)", cfg.model.dtype)
            dtype = "uint8"
        codec = ChunkCodec(
            dtype, int(primary.shape[1]), namespace, coding=self.config.codec, channels=self.config.channels
        )
        events = self.config.enable_kv_events and offloading_spec.kv_events_config.enable_kv_cache_events
        self._events: list[OffloadingEvent] | None = [] if events else None
        self._events_lock = threading.Lock()  # stores finish on the pool's threads
        self.jobs = TierJobs(
            primary,
            self.config.open_backend(),
            codec,
            workers=self.config.workers,
            max_pending=self.config.max_pending,
            on_stored=self._stored if events else None,
        )
        self._reported: dict[str, float] = {}
        log.info(
            "speckv tier %r: %s, budget %s, codec %s (%s chunks of %d bytes)",
            self.config.name,
            self.config.store,
            self.config.max_bytes,
            codec.coding,
            codec.dtype,
            codec.chunk_bytes,
        )

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        return LookupResult.HIT if self.jobs.has(bytes(key)) else LookupResult.MISS

    def submit_store(self, job_metadata: TransferJob) -> None:
        self.jobs.submit_store(job_metadata.job_id, [bytes(k) for k in job_metadata.keys], job_metadata.chunk_ids)

    def submit_load(self, job_metadata: TransferJob) -> None:
        self.jobs.submit_load(job_metadata.job_id, [bytes(k) for k in job_metadata.keys], job_metadata.chunk_ids)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        out = []
        for f in self.jobs.finished():
            done = [OffloadKey(k) for k in f.done]
            out.append(
                JobResult(
                    job_id=f.job_id,
                    success=f.success,
                    successful_keys=None if f.success or not done else done,
                    transfer_time=f.seconds,
                    transfer_bytes=f.raw_bytes or None,
                )
            )
        return out

    def has_pending_work(self) -> bool:
        return self.jobs.pending() > 0

    def touch(self, keys: Collection[OffloadKey], req_context: ReqContext) -> None:
        self.jobs.touch([bytes(k) for k in keys])

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self._events is None:
            return ()
        with self._events_lock:
            out, self._events = self._events, []
        return out

    def drain_jobs(self) -> None:
        self.jobs.drain()

    def shutdown(self) -> None:
        self.jobs.shutdown()

    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, OffloadingMetricMetadata]:
        out: dict[str, OffloadingMetricMetadata] = {
            name: OffloadingCounterMetadata(documentation=_DOCS[key], labelnames=("name",))
            for key, name in METRICS.items()
        }
        out[RESIDENT] = OffloadingGaugeMetadata(
            documentation="Bytes of entries the speckv tier's backend holds.", labelnames=("name",)
        )
        return out

    def get_stats(self) -> OffloadingConnectorStats | None:
        """The counters' increases since the last call, and the resident bytes, in vLLM's
        connector stats (logged by vLLM and exported to Prometheus)."""
        now = self.jobs.counters()
        stats = OffloadingConnectorStats()
        label = (self.config.name,)
        for key, name in METRICS.items():
            delta = now.get(key, 0) - self._reported.get(key, 0)
            if delta:
                stats.increase_counter(name, delta, label)
        if "resident_bytes" in now:
            stats.set_gauge(RESIDENT, now["resident_bytes"], label)
        self._reported = now
        return None if stats.is_empty() else stats

    def _stored(self, keys: list[bytes]) -> None:
        event = OffloadingEvent(
            keys=[OffloadKey(k) for k in keys], medium=self.medium, removed=False, locality=self.locality
        )
        with self._events_lock:
            if self._events is not None:
                self._events.append(event)


__all__ = ["METRICS", "SpeckvTier"]
