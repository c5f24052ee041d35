"""The connector's counters in vLLM's own shapes: ``SpeckvConnectorStats`` (a
``KVConnectorStats``: vLLM carries it from the workers and the scheduler to its stat loggers,
which log it as ``KV Transfer metrics: ...``) and ``SpeckvPromMetrics`` (the same counters on
vLLM's Prometheus endpoint, ``/metrics``, as ``vllm:speckv_<name>_total``).

Each side reports what its counters gained since its last report (``counter_deltas``), so the
loggers sum reports from every worker and the scheduler without counting anything twice."""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats
from vllm.v1.metrics.utils import create_metric_per_engine

# every counter reported -> its help text on the metrics endpoint
COUNTERS = {
    "matches": "Prompts the scheduler matched against the speckv tier.",
    "tokens_matched": "Prompt tokens the scheduler found stored in the speckv tier.",
    "tokens_loaded": "Prompt tokens the workers restored from the speckv tier (decoded into vLLM's cache).",
    "blocks_failed": "Blocks a worker could not restore (computed instead).",
    "save_waits": "Requests that waited for a save on its way to the tier.",
    "tier_hits": "Blocks found in the tier when a worker loaded them.",
    "tier_misses": "Blocks missing from the tier when a worker loaded them.",
    "tier_holes": "Matched prefixes that ended at a block evicted from their middle.",
    "tier_corrupt_entries": "Damaged or foreign entries met (dropped, computed instead).",
    "tier_store_errors": "Store operations that failed (computed instead).",
    "tier_tokens_put": "Prompt tokens coded and stored in the tier.",
    "tier_declined": "Blocks the tier's budget had no room for.",
    "saver_dropped": "Saves dropped because the background saver's backlog was full.",
    "saver_saved": "Requests the background saver stored.",
    "saver_failed": "Saves that failed.",
}


class SpeckvConnectorStats(KVConnectorStats):
    """Counter increments (``COUNTERS``' names -> int) from one or several reports."""

    def reset(self) -> None:
        self.data: dict[str, Any] = {}

    def aggregate(self, other: KVConnectorStats) -> KVConnectorStats:
        for name, value in other.data.items():
            self.data[name] = self.data.get(name, 0) + value
        return self

    def reduce(self) -> dict[str, int | float]:
        return {name: self.data[name] for name in COUNTERS if self.data.get(name)}

    def is_empty(self) -> bool:
        return not any(self.data.values())


class SpeckvPromMetrics(KVConnectorPromMetrics):
    """One Prometheus counter per ``COUNTERS`` entry, per engine."""

    def __init__(
        self,
        vllm_config: Any,
        metric_types: dict[Any, Any],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._counters = {
            name: create_metric_per_engine(
                self._counter_cls(name=f"vllm:speckv_{name}", documentation=text, labelnames=labelnames),
                per_engine_labelvalues,
            )
            for name, text in COUNTERS.items()
        }

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for name, value in transfer_stats_data.items():
            counter = self._counters.get(name, {}).get(engine_idx)
            if counter is not None and value > 0:
                counter.inc(value)


def counter_deltas(now: dict[str, int], last: dict[str, int]) -> dict[str, int]:
    """What each of ``COUNTERS`` gained from ``last`` to ``now`` (``last`` updated to ``now``)."""
    out = {name: now.get(name, 0) - last.get(name, 0) for name in COUNTERS}
    last.update({name: now.get(name, 0) for name in COUNTERS})
    return {name: value for name, value in out.items() if value}


__all__ = ["COUNTERS", "SpeckvConnectorStats", "SpeckvPromMetrics", "counter_deltas"]
