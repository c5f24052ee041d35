"""What both of the connector's sides keep on the connector (set in
``SpeckvConnector.__init__``), declared once with its types: the scheduler side's and the
worker side's methods live in their own modules and read it through ``self``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1

from ..connector_config import ConnectorConfig
from ..engine import EngineStore
from ..layer_loader import LayerLoader
from ..paged import PagedLayout
from ..saver import BackgroundSaver
from .requests import _LayerLoad


class _ConnectorState(KVConnectorBase_V1):
    """The connector's state (see ``SpeckvConnector.__init__`` for what each holds)."""

    # both sides
    _config: ConnectorConfig
    store: EngineStore
    _worker: bool
    _block_size: int
    _dtype: torch.dtype
    _seconds: dict[str, float]
    _counters: dict[str, int]
    _stats_file: str | None
    _memory_tier: Path | None
    _reported: dict[str, int]
    # scheduler side
    _save_wait_s: float
    _pending_saves: list[list[Any]]
    _step: int
    _waiting: dict[str, float]
    _matched: dict[str, int]
    _need_load: dict[str, tuple[int, list[int]]]
    _saving: dict[str, dict[str, Any]]
    # worker side
    _loader: LayerLoader | None
    _layer_loads: list[_LayerLoad]
    _saver: BackgroundSaver | None
    _saving_store: EngineStore | None
    _loads: list[list[Any]]
    _caches: dict[int, torch.Tensor]
    _names: dict[str, int]
    _layout: PagedLayout | None
    _captured: dict[str, dict[int, torch.Tensor]]
    _load_errors: set[int]
    _unusable: str | None
    _scales_checked: bool
