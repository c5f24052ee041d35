"""``SpeckvConnector``: the class vLLM builds, a thin front. It reads the settings once
(``ConnectorContext``), builds the object of its role, a ``ConnectorScheduler`` in the
scheduler's process or a ``ConnectorWorker`` in a worker's, and hands it vLLM's calls (with the
step's metadata, which vLLM keeps on the front)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole

from .context import ConnectorContext
from .metrics import SpeckvConnectorStats, SpeckvPromMetrics
from .requests import SpeckvConnectorMetadata
from .scheduler import ConnectorScheduler
from .worker import ConnectorWorker

if TYPE_CHECKING:
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.request import Request


class SpeckvConnector(KVConnectorBase_V1):
    """The connector (see the package docs). vLLM builds it twice: with the scheduler role
    (``scheduler``: matching prompts against the store) and with the worker role (``worker``:
    decoding and storing); the other is None. ``scheduler_class`` and ``worker_class`` are what
    it builds (a subclass may name its own)."""

    scheduler_class: type[ConnectorScheduler] = ConnectorScheduler
    worker_class: type[ConnectorWorker] = ConnectorWorker

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        # every key checked before anything is built: a typo fails here, naming it
        context = ConnectorContext.of(vllm_config, self._kv_transfer_config, kv_cache_config)
        self.scheduler: ConnectorScheduler | None = None
        self.worker: ConnectorWorker | None = None
        if role == KVConnectorRole.WORKER:
            self.worker = self.worker_class(context)
        else:
            self.scheduler = self.scheduler_class(context, self._kv_transfer_config)

    def _scheduler(self) -> ConnectorScheduler:
        if self.scheduler is None:
            raise RuntimeError("SpeckvConnector: a scheduler call on a worker's connector")
        return self.scheduler

    def _worker(self) -> ConnectorWorker:
        if self.worker is None:
            raise RuntimeError("SpeckvConnector: a worker call on the scheduler's connector")
        return self.worker

    def _meta(self) -> SpeckvConnectorMetadata:
        meta = self._get_connector_metadata()
        assert isinstance(meta, SpeckvConnectorMetadata)
        return meta

    # -- the scheduler's calls ---------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        return self._scheduler().get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        self._scheduler().update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> SpeckvConnectorMetadata:
        return self._scheduler().build_connector_meta(scheduler_output)

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return self._scheduler().request_finished(request, block_ids)

    # -- a worker's calls --------------------------------------------------------------
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        self._worker().register_kv_caches(kv_caches)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        self._worker().start_load_kv(self._meta())

    def wait_for_layer_load(self, layer_name: str) -> None:
        self._worker().wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        self._worker().save_kv_layer(self._meta(), layer_name, kv_layer)

    def wait_for_save(self) -> None:
        self._worker().wait_for_save(self._meta())

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self._worker().get_block_ids_with_load_errors()

    # -- both --------------------------------------------------------------------------
    def shutdown(self) -> None:
        (self.worker or self._scheduler()).shutdown()

    def stats(self) -> dict[str, Any]:
        """This side's counters (``ConnectorScheduler.stats``, ``ConnectorWorker.stats``)."""
        return (self.worker or self._scheduler()).stats()

    def get_kv_connector_stats(self) -> SpeckvConnectorStats | None:
        """What this side's counters gained since its last report (vLLM asks every step; its
        loggers sum the reports of the scheduler and every worker)."""
        return (self.worker or self._scheduler()).counters.report()

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


__all__ = ["SpeckvConnector"]
