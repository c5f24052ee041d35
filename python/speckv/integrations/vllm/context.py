"""``ConnectorContext``: what the connector's scheduler and its worker are both built from: the
typed configuration (parsed once, before anything is built, so a typo fails at start-up naming
its key) and the engine's facts (block size, cache dtype, engine id), with the one way to open
the tier's store."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ..connector_config import ConnectorConfig
from ..engine import MEMORY, EngineStore, memory_tier_path
from ..paged import UnsupportedLayoutError
from .requests import cache_dtype


@dataclass(frozen=True)
class ConnectorContext:
    """One engine's connector settings, the same in its scheduler and in every worker."""

    vllm_config: Any
    config: ConnectorConfig
    block_size: int
    """vLLM's block size (tokens): the tier's block size too"""
    dtype: torch.dtype
    """what vLLM stores the cache in (fp8 as ``float8_e4m3fn``)"""
    name: str
    """the engine's id, which every process of it shares: its memory tier's name"""
    memory_tier: Path | None
    """the engine's RAM tier folder (``store: memory``), removed when the engine stops"""

    @classmethod
    def of(cls, vllm_config: Any, kv_transfer_config: Any, kv_cache_config: Any) -> ConnectorContext:
        """Reads the connector's configuration (``kv_connector_extra_config``: every key
        checked, ``ConnectorConfigError`` naming a bad one) and refuses a model speckv does not
        store (several KV cache groups: sliding-window layers)."""
        config = ConnectorConfig.parse(kv_transfer_config.kv_connector_extra_config)
        groups = getattr(kv_cache_config, "kv_cache_groups", None) or []
        if len(groups) > 1:
            raise UnsupportedLayoutError(
                f"SpeckvConnector: the model has {len(groups)} KV cache groups (sliding-window layers); "
                "speckv's connector stores models with one"
            )
        name = str(kv_transfer_config.engine_id or "default")
        return cls(
            vllm_config=vllm_config,
            config=config,
            block_size=int(vllm_config.cache_config.block_size),
            dtype=cache_dtype(vllm_config),
            name=name,
            memory_tier=memory_tier_path(name) if MEMORY in config.stores else None,
        )

    def store(self, *, weights: bool, backend: Any = None, threads: int | None = None) -> EngineStore:
        """The tier's store: on the configured backends (their budgets), or on ``backend``, an
        open one (the saver's store shares the loads' backend). ``weights``: load the
        predictor's weights (a worker; the scheduler only matches keys)."""
        config = self.config
        return EngineStore(
            self.vllm_config.model_config.model,
            config.calibration,
            _stores(config) if backend is None else backend,
            block_size=self.block_size,
            cache_dtype=self.dtype,
            weights=weights,
            joint=config.joint,
            threads=threads,
            coding=config.coding,
            max_bytes=_budgets(config) if backend is None else None,
            name=self.name,
        )


def _stores(config: ConnectorConfig) -> str | list[str]:
    """``store`` as ``open_backend`` takes it: one spec, or a list (a stack of tiers)."""
    return config.stores[0] if isinstance(config.store, str) else list(config.stores)


def _budgets(config: ConnectorConfig) -> int | list[int | None] | None:
    """``max_bytes`` as ``open_backend`` takes it: one budget, or one per store."""
    return list(config.max_bytes) if isinstance(config.max_bytes, tuple) else config.max_bytes


__all__ = ["ConnectorContext"]
