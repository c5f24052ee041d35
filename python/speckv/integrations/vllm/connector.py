"""``SpeckvConnector``: the class vLLM builds, its settings read once (the module docs of
``speckv.integrations.vllm``), its two roles' methods from ``scheduler_side`` and
``worker_side``, and its counters."""

from __future__ import annotations

import atexit
import json
import shutil
from pathlib import Path
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.logger import init_logger

from ..connector_config import ConnectorConfig
from ..engine import MEMORY, EngineStore, memory_tier_path
from ..layer_loader import LayerLoader
from ..paged import PagedLayout, UnsupportedLayoutError
from ..saver import BackgroundSaver
from .metrics import SpeckvConnectorStats, SpeckvPromMetrics, counter_deltas
from .requests import _LayerLoad, cache_dtype
from .scheduler_side import _SchedulerSide
from .worker_side import _WorkerSide

logger = init_logger(__name__)


class SpeckvConnector(_SchedulerSide, _WorkerSide):
    """The connector (see the module docs). vLLM builds it twice: with the scheduler role
    (matching prompts against the store) and with the worker role (decoding and storing)."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        # every key checked before anything is built: a typo fails here, naming it
        config = self._config = ConnectorConfig.parse(self._kv_transfer_config.kv_connector_extra_config)
        groups = getattr(kv_cache_config, "kv_cache_groups", None) or []
        if len(groups) > 1:
            raise UnsupportedLayoutError(
                f"SpeckvConnector: the model has {len(groups)} KV cache groups (sliding-window layers); "
                "speckv's connector stores models with one"
            )
        self._block_size = int(vllm_config.cache_config.block_size)
        self._dtype = cache_dtype(vllm_config)
        # the memory tier is this engine's: named by its id, which every process of it shares
        name = str(self._kv_transfer_config.engine_id or "default")
        worker = self._worker = role == KVConnectorRole.WORKER

        def store(backend: Any = None, threads: int | None = None) -> EngineStore:
            return EngineStore(
                vllm_config.model_config.model,
                config.calibration,
                _stores(config) if backend is None else backend,
                block_size=self._block_size,
                cache_dtype=self._dtype,
                weights=worker,
                joint=config.joint,
                threads=threads,
                coding=config.coding,
                max_bytes=_budgets(config) if backend is None else None,
                name=name,
            )

        self.store = store()
        # restores layer by layer: the predictor-free stores (module docs)
        self._loader: LayerLoader | None = None
        self._layer_loads: list[_LayerLoad] = []
        if worker and config.layer_loads:
            self._loader = LayerLoader()
        # the background saver codes with a store of its own (its own predictor state), on the
        # same backend: loads never wait for a save's codec
        self._saver: BackgroundSaver | None = None
        if worker and config.save_queue:
            saving = store(self.store.backend, threads=config.save_threads)
            self._saving_store: EngineStore | None = saving
            self._saver = BackgroundSaver(
                self._save_now, depth=config.save_queue, max_bytes=config.save_backlog, nice=config.save_nice
            )
        else:
            self._saving_store = None
        self._stats_file = config.stats_file
        # per load: request id, tokens vLLM had, tokens matched, tokens served (stats_file)
        self._loads: list[list[Any]] = []
        # time inside the engine's step: loading (decode and write), copying blocks out to store
        self._seconds = {
            "load_s": 0.0,
            "save_copy_s": 0.0,
            "layer_wait_s": 0.0,
            "loader_busy_s": 0.0,
            "save_wait_s": 0.0,
        }
        self._counters = {
            "matches": 0,
            "tokens_matched": 0,
            "tokens_loaded": 0,
            "blocks_failed": 0,
            "save_waits": 0,
        }
        self._save_wait_s = float(config.save_wait_s)
        # the counters as last reported to vLLM (get_kv_connector_stats)
        self._reported: dict[str, int] = {}
        # scheduler: saves asked of the workers, [whole-block tokens, when to stop waiting for
        # them (None until the step that asked for them has run: the clock starts when the
        # worker has the blocks, not when the prefill that computes them begins), the step],
        # and requests waiting for one (request id -> when it began waiting)
        self._pending_saves: list[list[Any]] = []
        self._step = 0
        self._waiting: dict[str, float] = {}
        self._memory_tier = memory_tier_path(name) if MEMORY in config.stores else None
        if self._memory_tier is not None and role == KVConnectorRole.SCHEDULER:
            atexit.register(shutil.rmtree, self._memory_tier, True)
        if role == KVConnectorRole.SCHEDULER and self._stats_file:
            atexit.register(self._write_stats)
        if role == KVConnectorRole.SCHEDULER and config.load_failure == "recompute":
            if self._kv_transfer_config.kv_load_failure_policy != "recompute":
                self._kv_transfer_config.kv_load_failure_policy = "recompute"
                logger.info(
                    "speckv: kv_load_failure_policy set to 'recompute' (a block speckv cannot serve is computed)"
                )
        # scheduler side
        self._matched: dict[str, int] = {}
        self._need_load: dict[str, tuple[int, list[int]]] = {}
        self._saving: dict[str, dict[str, Any]] = {}
        # worker side
        self._caches: dict[int, torch.Tensor] = {}
        self._names: dict[str, int] = {}
        self._layout: PagedLayout | None = None
        # per request, per layer: its blocks copied out of vLLM's buffer (PagedLayout.copy_blocks)
        self._captured: dict[str, dict[int, torch.Tensor]] = {}
        self._load_errors: set[int] = set()
        self._unusable: str | None = None
        self._scales_checked = False

    def stats(self) -> dict[str, Any]:
        """This side's counters: prompts matched and tokens matched (scheduler), tokens loaded and
        blocks that failed (worker), the saver's, and the tier's (``BlockChain.stats``: hits,
        misses, holes, declined, corrupt entries, store errors; blocks, bytes, evictions)."""
        out: dict[str, Any] = {"role": "worker" if self._worker else "scheduler"}
        out.update(self._counters)
        if self._loader is not None:
            self._seconds["layer_wait_s"] = self._loader.waited_s
            self._seconds["loader_busy_s"] = self._loader.busy_s
        out.update({k: round(v, 4) for k, v in self._seconds.items()})
        tier: dict[str, Any] = self._tier_counters()
        try:
            held = self.store.prefix.stats()
            tier.update(blocks=held["blocks"], bytes=held["bytes"], evictions=held["evictions"])
        except Exception as e:  # the counters still count when the store is gone
            tier["stats_error"] = str(e)
        out["tier"] = tier
        tiers = getattr(self.store.backend, "tier_stats", None)
        if tiers is not None:
            out["tiers"] = tiers()
        if self._saver is not None:
            out["saver"] = self._saver.counters()
        if self._worker:
            out["loads"] = list(self._loads)
        return out

    def counter_totals(self) -> dict[str, int]:
        """This side's counters as flat totals (``metrics.COUNTERS``' names): its own, the
        tier's (``tier_*``, this process's store objects) and the saver's (``saver_*``)."""
        out = dict(self._counters)
        out.update({f"tier_{k}": v for k, v in self._tier_counters().items()})
        if self._saver is not None:
            out.update({f"saver_{k}": v for k, v in self._saver.counters().items() if isinstance(v, int)})
        return out

    def _tier_counters(self) -> dict[str, int]:
        """The tier's counters of this process: its store's and its saver's store's."""
        tier = self.store.prefix.stats_counters()
        if self._saving_store is not None:
            for k, v in self._saving_store.prefix.stats_counters().items():
                tier[k] = tier.get(k, 0) + v
        return tier

    def get_kv_connector_stats(self) -> SpeckvConnectorStats | None:
        """What this side's counters gained since its last report (vLLM asks every step; its
        loggers sum the reports of the scheduler and every worker)."""
        deltas = counter_deltas(self.counter_totals(), self._reported)
        return SpeckvConnectorStats(data=deltas) if deltas else None

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None) -> SpeckvConnectorStats:
        return SpeckvConnectorStats(data=dict(data or {}))

    @classmethod
    def build_prom_metrics(
        cls,
        vllm_config: Any,
        metric_types: dict[Any, Any],
        labelnames: list[str],
        per_engine_labelvalues: dict[int, list[object]],
    ) -> SpeckvPromMetrics:
        return SpeckvPromMetrics(vllm_config, metric_types, labelnames, per_engine_labelvalues)

    def _write_stats(self) -> None:
        if not self._stats_file:
            return
        stats = self.stats()
        path = Path(self._stats_file)
        if stats["role"] == "scheduler":
            path = path.with_suffix(".scheduler.json")
        try:
            path.write_text(json.dumps(stats, indent=1))
        except OSError as e:
            logger.warning("speckv: could not write stats_file %s: %s", path, e)


def _stores(config: ConnectorConfig) -> str | list[str]:
    """``store`` as ``open_backend`` takes it: one spec, or a list (a stack of tiers)."""
    return config.stores[0] if isinstance(config.store, str) else list(config.stores)


def _budgets(config: ConnectorConfig) -> int | list[int | None] | None:
    """``max_bytes`` as ``open_backend`` takes it: one budget, or one per store."""
    return list(config.max_bytes) if isinstance(config.max_bytes, tuple) else config.max_bytes
