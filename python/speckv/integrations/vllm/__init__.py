"""speckv as a vLLM KV connector: a lossless, compressed prefix tier under vLLM's own cache.

Every whole block of a prompt's KV cache is compressed (speckv's codec, with a predictor that
fits inside the worker: see ``EngineStore``) and stored under a hash chain over the token blocks
and the codec's identity, in host RAM, a folder or a Redis server: prompts sharing a prefix
store it once, and a restarted engine, or another one on the same store, reads what the first
stored. A new request whose prompt starts with stored blocks gets them decoded into its own
blocks instead of computing them, bit for bit the cache the storing run computed.

Configuration (``calibration``: ``speckv calibrate --model FOLDER --predictor map -o FILE``, on
the checkpoint vLLM serves; add ``--fp8-scale 1.0`` for ``kv_cache_dtype="fp8"``)::

    from vllm import LLM
    from vllm.config import KVTransferConfig

    llm = LLM(model="FOLDER", kv_transfer_config=KVTransferConfig(
        kv_connector="SpeckvConnector",
        kv_connector_module_path="speckv.integrations.vllm",
        kv_role="kv_both",
        kv_connector_extra_config={"store": "memory", "max_bytes": 8 << 30,
                                   "calibration": "cal.safetensors"}))

``kv_connector_extra_config``: every key, its type, default, unit and the process that reads
it is ``speckv.integrations.connector_config.ConnectorConfig`` (the documentation's
configuration reference is written from it). Both processes parse it before building anything:
an unknown key or a bad value fails at start-up with one line naming it.

Faults never reach the engine: a store that fails, an entry that is damaged, foreign,
evicted or missing, a decode that is refused, all make the request compute those tokens itself
(logged once per kind, counted). For that the connector sets vLLM's ``kv_load_failure_policy``
to ``"recompute"`` unless ``load_failure`` is ``"fail"``. The scheduler matches prompts
against the tier's index (``has``: no entry read); an entry damaged or evicted since is found
when the worker loads it, and those blocks are computed.

Layouts (``speckv.integrations.paged``): vLLM's CPU attention backend, with its ``vec`` and
``amx`` kernels' block layouts (run in vLLM's CPU engine in the tests), and on CUDA the
FlashAttention, FlashInfer and Triton backends in every ``KVCacheLayout`` vLLM resolves,
cross-layer ones included (tested on CPU tensors laid out by vLLM's own code; not yet run on a
GPU); any other paged layout or backend is refused at start-up (``UnsupportedLayoutError``,
naming it). Cache dtypes: the model's
bf16 / fp16, and ``fp8`` / ``fp8_e4m3`` with the calibration's fp8 scales (``fp8_e5m2`` is
refused). Models with several KV cache groups (sliding-window layers) are refused.
"""

from __future__ import annotations

from .connector import SpeckvConnector
from .requests import SpeckvConnectorMetadata, cache_dtype

__all__ = ["SpeckvConnector", "SpeckvConnectorMetadata", "cache_dtype"]
