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

``kv_connector_extra_config``:

- ``store``: ``"memory"`` (host RAM: a folder ``/dev/shm/speckv-ENGINE_ID`` that every
  process of this engine shares, removed when the engine shuts down; an engine killed outright
  leaves it behind, to be removed by hand), a folder, or ``redis://HOST:PORT/DB``; or a
  list of them, upper first (``["memory", "/var/kv"]``: RAM over disk, written through to
  both, a lower tier's hit promoted; ``speckv.tiered``);
- ``max_bytes``: the tier's budget in bytes (memory and folders; a list for a list of tiers):
  least recently used prefix tails are evicted (``speckv.store``). A Redis server's budget
  is its ``maxmemory`` with ``maxmemory-policy allkeys-lru``;
- ``calibration``: the predictor's calibration file; or ``predictor``: ``"none"`` (the
  predictor-free fast lane, no calibration) or ``"raw"`` (blocks stored uncompressed: the
  baseline tier, same keys, budget and eviction);
- ``save_queue``: saves waiting for the background saver (default 8; each holds a copy of its
  blocks). The worker copies a request's blocks out during the step and a thread of its own
  codes and stores them (``BackgroundSaver``): a full queue drops the save (counted), never
  stalls the step. ``0``: store inside the step, as a synchronous connector;
- ``save_threads``: the codec threads of a background save (default 1: the engine keeps the
  other cores); ``save_nice``: the saver thread's nice value (default 19: it takes the cores
  the engine leaves idle; None keeps the engine's);
- ``save_wait_s``: how long a request whose prompt extends a save still on its way to the
  tier (queued or being coded, so not matched yet) waits for it instead of computing those
  tokens (default 1.0, counted from the end of the step that computed the saved blocks; 0:
  never). The scheduler asks vLLM to come back to the request
  (``get_num_new_matched_tokens`` returns None) until the save shows in the tier's index or
  the time is up: a document asked for again right after its first reading is served from the
  tier, not prefilled twice;
- ``load_by_layer``: with ``predictor`` ``"none"`` or ``"raw"``, restore layer by layer
  (default True): the step reads a request's entries, and a thread of its own
  (``LayerLoader``) decodes and writes layer 0, 1, ... while the forward pass runs, which
  waits in ``wait_for_layer_load`` only for a layer not written yet. False (and the predicted
  stores, whose predictor needs the layers before): every layer before the forward pass;
- ``stats_file``: a JSON file the worker writes its counters to when it shuts down (and the
  scheduler its own next to it, ``.scheduler.json``): hits, misses, tokens served, bytes,
  evictions, saves dropped, faults, and the seconds the step spent loading and copying
  blocks out (``load_s``, ``save_copy_s``; the saver's own in ``saver.busy_s``) and waiting
  for a layer (``layer_wait_s``; the loader's own ``loader_busy_s``); the scheduler's:
  requests that waited for a save on its way (``save_waits``, ``save_wait_s``);
- ``load_failure``: ``"recompute"`` (default) or ``"fail"``.

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
