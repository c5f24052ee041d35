"""The connector's counters in vLLM's own shapes: ``SpeckvConnectorStats`` (a
``KVConnectorStats``: vLLM carries it from the workers and the scheduler to its stat loggers,
which log it as ``KV Transfer metrics: ...``) and ``SpeckvPromMetrics`` (the same counters on
vLLM's Prometheus endpoint, ``/metrics``, as ``vllm:speckv_<name>_total``).

Each side reports what its counters gained since its last report (``counter_deltas``), so the
loggers sum reports from every worker and the scheduler without counting anything twice.
``SideCounters`` is one side's own counters and the stats it writes (``stats_file``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorPromMetrics, KVConnectorStats
from vllm.logger import init_logger
from vllm.v1.metrics.utils import create_metric_per_engine

from ..engine import EngineStore
from ..saver import BackgroundSaver

logger = init_logger(__name__)

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


class SideCounters:
    """One side's counters (the scheduler's or a worker's): what it counts, the time it spends
    inside the engine's steps, its tier's counters (its store's and its saver's store's), and
    what it last reported to vLLM. ``stats`` is what ``stats_file`` holds."""

    def __init__(self, role: str, store: EngineStore, saver: BackgroundSaver | None = None) -> None:
        self.role = role
        self.store = store
        self.saver = saver
        self.saving_store: EngineStore | None = None
        self.counts = {"matches": 0, "tokens_matched": 0, "tokens_loaded": 0, "blocks_failed": 0, "save_waits": 0}
        # time inside the engine's step: loading (decode and write), copying blocks out to
        # store, the engine waiting for a layer, the loader working, requests waiting for a save
        self.seconds = {
            "load_s": 0.0,
            "save_copy_s": 0.0,
            "layer_wait_s": 0.0,
            "loader_busy_s": 0.0,
            "save_wait_s": 0.0,
        }
        self._reported: dict[str, int] = {}

    def tier(self) -> dict[str, int]:
        """The tier's counters of this process: its store's and its saver's store's."""
        tier = self.store.prefix.stats_counters()
        if self.saving_store is not None:
            for k, v in self.saving_store.prefix.stats_counters().items():
                tier[k] = tier.get(k, 0) + v
        return tier

    def totals(self) -> dict[str, int]:
        """The counters as flat totals (``COUNTERS``' names): this side's, the tier's
        (``tier_*``) and the saver's (``saver_*``)."""
        out = dict(self.counts)
        out.update({f"tier_{k}": v for k, v in self.tier().items()})
        if self.saver is not None:
            out.update({f"saver_{k}": v for k, v in self.saver.counters().items() if isinstance(v, int)})
        return out

    def report(self) -> SpeckvConnectorStats | None:
        """What the totals gained since the last report (None: nothing)."""
        deltas = counter_deltas(self.totals(), self._reported)
        return SpeckvConnectorStats(data=deltas) if deltas else None

    def stats(self) -> dict[str, Any]:
        """The role, the counters, the seconds, the tier's counters with its blocks, bytes and
        evictions (``BlockChain.stats``), each tier's of a stack, and the saver's."""
        out: dict[str, Any] = {"role": self.role}
        out.update(self.counts)
        out.update({k: round(v, 4) for k, v in self.seconds.items()})
        tier: dict[str, Any] = self.tier()
        try:
            held = self.store.prefix.stats()
            tier.update(blocks=held["blocks"], bytes=held["bytes"], evictions=held["evictions"])
        except Exception as e:  # the counters still count when the store is gone
            tier["stats_error"] = str(e)
        out["tier"] = tier
        tiers = getattr(self.store.backend, "tier_stats", None)
        if tiers is not None:
            out["tiers"] = tiers()
        if self.saver is not None:
            out["saver"] = self.saver.counters()
        return out


def write_stats(stats_file: str | None, stats: dict[str, Any]) -> None:
    """Writes a side's ``stats`` to ``stats_file`` (the scheduler's beside it, as
    ``.scheduler.json``); a failure is logged, never raised."""
    if not stats_file:
        return
    path = Path(stats_file)
    if stats["role"] == "scheduler":
        path = path.with_suffix(".scheduler.json")
    try:
        path.write_text(json.dumps(stats, indent=1))
    except OSError as e:
        logger.warning("speckv: could not write stats_file %s: %s", path, e)


__all__ = ["COUNTERS", "SideCounters", "SpeckvConnectorStats", "SpeckvPromMetrics", "counter_deltas", "write_stats"]
