"""Drives vLLM's own tiered offloading manager (``TieringOffloadingSpec``: a CPU primary tier
and secondary tiers) the way vLLM's scheduler does, with no engine: what a GPU worker would
copy into the primary's host buffer is written there by the caller. Used by the tier's tests
(``tests/vllm_tier_cases.py``) and the trace benchmark (``benches/bench_trace.py``); needs the
vLLM virtualenv (``.ci/vllm-venv``).

The calls are the scheduler connector's: ``on_new_request``, ``lookup`` per chunk in order,
``on_schedule_end`` each step (promotions from secondary tiers are submitted there),
``prepare_load`` / ``complete_load`` for chunks found, ``prepare_store`` / ``complete_store``
for chunks computed (which cascades them to every secondary tier), ``on_request_finished``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from typing import Any

import numpy as np
from vllm.v1.kv_offload.base import LookupResult, OffloadKey, ReqContext, ScheduleEndContext, make_offload_key
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

SPECKV_TIER = {"type": "SpeckvTier", "module_path": "speckv.integrations.vllm_tier"}


def offload_key(block_id: int) -> OffloadKey:
    """vLLM's key of a chunk named by an integer (a trace's hash id), group 0."""
    return make_offload_key(int(block_id).to_bytes(16, "little"), 0)


def offloading_config(
    extra: dict[str, Any],
    *,
    dtype: str = "bfloat16",
    block_bytes: int,
    tokens_per_block: int = 16,
    model: str = "HuggingFaceTB/SmolLM2-135M-Instruct",
    events: bool = False,
    engine_id: str | None = None,
) -> OffloadingConfig:
    """vLLM's normalized offloading config for one worker whose blocks are ``block_bytes``."""
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=tokens_per_block, layer_names=("layers",), group_id=0),),
        worker_kv_bytes_per_block=block_bytes,
        enable_kv_cache_events=events,
        extra_config=extra,
        engine_id=engine_id or uuid.uuid4().hex[:12],
        model=OffloadingModelConfig(name=model, dtype=dtype),
        cache=OffloadingCacheConfig(tokens_per_hash=tokens_per_block, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=1,
            tp_size=1,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=True,
        ),
    )


class TieringDriver:
    """vLLM's ``TieringOffloadingManager`` with a CPU primary of ``cpu_chunks`` chunks and
    ``tiers`` (secondary tier configs), scheduler calls made as vLLM makes them."""

    def __init__(self, tiers: Sequence[dict[str, Any]], *, cpu_chunks: int, block_bytes: int, **config: Any) -> None:
        chunk = (
            -(-block_bytes // TieringOffloadingSpec.BLOCK_SIZE_ALIGNMENT) * TieringOffloadingSpec.BLOCK_SIZE_ALIGNMENT
        )
        extra = {"cpu_bytes_to_use": cpu_chunks * chunk, "secondary_tiers": [dict(t) for t in tiers]}
        self.spec = TieringOffloadingSpec(offloading_config(extra, block_bytes=block_bytes, **config))
        self.manager = self.spec.get_manager()
        self.view = np.asarray(self.manager.primary_tier.get_kv_memoryview()).view(np.uint8)
        self.block_bytes = block_bytes
        self._requests = 0

    @property
    def tiers(self) -> list[Any]:
        return self.manager.secondary_tiers

    def _context(self) -> ReqContext:
        self._requests += 1
        ctx = ReqContext(req_id=f"req-{self._requests}")
        self.manager.on_new_request(ctx)
        return ctx

    def step(self) -> None:
        self.manager.on_schedule_end(ScheduleEndContext((), ()))

    def settle(self, timeout: float = 60.0) -> None:
        """Steps until no transfer between tiers is in flight."""
        deadline = time.monotonic() + timeout
        self.step()
        while self.manager.has_pending_work():
            if time.monotonic() > deadline:
                raise TimeoutError("tier transfers still in flight")
            time.sleep(0.0005)
            self.step()

    def store(self, keys: Sequence[OffloadKey], rows: Sequence[np.ndarray]) -> int:
        """Computed chunks into the primary (as a GPU worker would copy them), then cascaded to
        the secondary tiers; returns how many the primary took."""
        ctx = self._context()
        out = self.manager.prepare_store(list(keys), ctx)
        stored = 0
        if out is not None and out.keys_to_store:
            row_of = dict(zip(keys, rows))
            for key, slot in zip(out.keys_to_store, out.store_spec.chunk_ids):
                row = row_of[key]
                self.view[int(slot), : row.nbytes] = row.reshape(-1).view(np.uint8)
            self.manager.complete_store(out.keys_to_store, ctx)
            stored = len(out.keys_to_store)
        self.manager.on_request_finished(ctx)
        self.step()
        return stored

    def lookup(self, keys: Sequence[OffloadKey], timeout: float = 60.0) -> tuple[int, dict[OffloadKey, str]]:
        """How many leading ``keys`` the tiers can serve (promoting from secondary tiers until
        they are ready in the primary), and where each came from (``"primary"`` or a tier's
        type); the request stays open for ``load``."""
        ctx = self._context()
        sources: dict[OffloadKey, str] = {}
        deadline = time.monotonic() + timeout
        while True:
            ready, waiting = 0, False
            for key in keys:
                result = self.manager.lookup(key, ctx)
                if result is LookupResult.HIT:
                    ready += 1
                    continue
                if result is LookupResult.MISS:
                    break
                waiting = True
                break
            if not waiting or time.monotonic() > deadline:
                break
            time.sleep(0.0005)
            self.step()
        for key in keys[:ready]:
            sources[key] = str(self.manager.get_load_source(key, ctx).name).lower()
        self._open = ctx
        return ready, sources

    def load(self, keys: Sequence[OffloadKey]) -> list[np.ndarray]:
        """The primary's rows of ``keys`` (found by the last ``lookup``), copied out as a GPU
        worker would, then the request finished."""
        ctx = self._open
        rows = []
        if keys:
            spec = self.manager.prepare_load(list(keys), ctx)
            rows = [self.view[int(slot), : self.block_bytes].copy() for slot in spec.chunk_ids]
            self.manager.complete_load(list(keys), ctx)
        self.manager.on_request_finished(ctx)
        self.step()
        return rows

    def shutdown(self) -> None:
        self.settle()
        self.view = np.empty((0, 0), dtype=np.uint8)  # the engine unmaps its buffer: no view may remain
        self.manager.shutdown()


def kv_rows(kv: Sequence[tuple[Any, Any]], tokens_per_block: int, layout: str = "NHD") -> list[np.ndarray]:
    """A model's cache (per layer ``(K, V)`` ``[1, heads, tokens, dim]``, numpy or torch) as the
    bytes of the primary's chunks, one block of ``tokens_per_block`` tokens a chunk, every
    layer's block in turn: ``NHD`` per layer ``[2, tokens, heads, dim]`` (FlashAttention's
    block), ``HND`` ``[2, heads, tokens, dim]``, ``cross-layer`` ``[tokens, layers, 2, heads,
    dim]`` (every layer of a token together)."""
    layers = [(np.asarray(_bits(k))[0], np.asarray(_bits(v))[0]) for k, v in kv]
    tokens = layers[0][0].shape[1]
    rows = []
    for start in range(0, tokens - tokens_per_block + 1, tokens_per_block):
        cut = slice(start, start + tokens_per_block)
        stacked = np.stack([np.stack([k[:, cut], v[:, cut]]) for k, v in layers])  # [L, 2, H, T, D]
        if layout == "NHD":
            block = stacked.transpose(0, 1, 3, 2, 4)
        elif layout == "HND":
            block = stacked
        elif layout == "cross-layer":
            block = stacked.transpose(3, 0, 1, 2, 4)
        else:
            raise ValueError(f"layout: expected NHD, HND or cross-layer, got {layout!r}")
        rows.append(np.ascontiguousarray(block).reshape(-1).view(np.uint8))
    return rows


def _bits(t: Any) -> Any:
    """A torch tensor's bits as a numpy integer array (numpy has no bf16/fp8 of torch's)."""
    if hasattr(t, "view") and hasattr(t, "element_size") and hasattr(t, "numpy"):
        import torch

        word = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[t.element_size()]
        return t.contiguous().view(word).numpy()
    return t
