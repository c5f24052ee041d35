"""What the connector's scheduler side asks of its workers each step (``SpeckvConnectorMetadata``:
blocks to load, prompts to store), the settings both sides share, and ``cache_dtype``."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata

from ...prefix.free_store import StoredBlock
from ..paged import UnsupportedLayoutError

_LAYER = re.compile(r"layers\.(\d+)\.")
# vLLM's kv_cache_dtype -> how its workers' buffers hold it (None: the model's dtype)
_CACHE_DTYPES: dict[str, torch.dtype | None] = {
    "auto": None,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
}
# loads listed in the worker's stats (request id, tokens it had, matched, served)
MAX_LOADS_KEPT = 100_000
# how long an engine shutting down waits for queued saves (vLLM may kill it sooner: an engine
# core in its own process 5 s after its SIGTERM; the worker writes its counters first)
SHUTDOWN_DRAIN_S = 60.0
# a scheduler waiting for a save sleeps this long per look (vLLM's engine loop asks again at
# once: the sleep leaves the cores to the saver)
SAVE_POLL_S = 0.002
# saves the scheduler remembers as on their way (the oldest forgotten first)
MAX_PENDING_SAVES = 64


@dataclass
class _Load:
    """Decode ``token_ids`` (whole blocks) into the request's blocks ``block_ids[first:]``
    (the first ``first`` blocks were computed by vLLM's own prefix cache)."""

    req_id: str
    token_ids: list[int]
    block_ids: list[int]
    first: int


@dataclass
class _LayerLoad:
    """A ``_Load`` whose entries were read (``blocks``, from block ``load.first`` on), restored
    layer by layer: ``served`` blocks so far (it drops where a layer's stream is damaged)."""

    load: _Load
    blocks: list[StoredBlock]
    served: int


@dataclass
class _Save:
    """Store the request's whole prompt blocks: ``token_ids`` in blocks ``block_ids``."""

    req_id: str
    token_ids: list[int]
    block_ids: list[int]


@dataclass
class SpeckvConnectorMetadata(KVConnectorMetadata):
    """What one engine step asks of the workers: blocks to decode, prompts to store."""

    loads: list[_Load] = field(default_factory=list)
    saves: list[_Save] = field(default_factory=list)


def cache_dtype(vllm_config: Any) -> torch.dtype:
    """The dtype vLLM stores this engine's KV cache in (fp8 as ``float8_e4m3fn``)."""
    name = str(vllm_config.cache_config.cache_dtype)
    if name not in _CACHE_DTYPES:
        raise UnsupportedLayoutError(f"kv_cache_dtype {name!r}: speckv stores {sorted(_CACHE_DTYPES)}")
    dtype = _CACHE_DTYPES[name]
    return dtype if dtype is not None else vllm_config.model_config.dtype
