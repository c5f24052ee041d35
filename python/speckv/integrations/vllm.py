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

import atexit
import json
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.logger import init_logger

from ..hf.free_store import FreePrefixStore, StoredBlock
from .engine import MEMORY, EngineStore, memory_tier_path
from .layer_loader import LayerLoader
from .paged import PagedLayout, UnsupportedLayoutError, host_ready
from .saver import BackgroundSaver

if TYPE_CHECKING:
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.request import Request

logger = init_logger(__name__)

_LAYER = re.compile(r"layers\.(\d+)\.")
# vLLM's kv_cache_dtype -> how its workers' buffers hold it (None: the model's dtype)
_CACHE_DTYPES: dict[str, torch.dtype | None] = {
    "auto": None,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
}
# predictor values that need no calibration -> how EngineStore codes blocks then
_FREE = {"none": "fast", "raw": "raw"}
DEFAULT_SAVE_QUEUE = 8
# loads listed in the worker's stats (request id, tokens it had, matched, served)
MAX_LOADS_KEPT = 100_000
# how long an engine shutting down waits for queued saves
SHUTDOWN_DRAIN_S = 60.0
DEFAULT_SAVE_WAIT_S = 1.0
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


class SpeckvConnector(KVConnectorBase_V1):
    """The connector (see the module docs). vLLM builds it twice: with the scheduler role
    (matching prompts against the store) and with the worker role (decoding and storing)."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        predictor = extra.get("predictor")
        if predictor is not None and predictor not in _FREE:
            raise ValueError(f"SpeckvConnector: predictor must be one of {sorted(_FREE)} or absent, got {predictor!r}")
        free = predictor is not None
        for needed in ("store",) if free else ("store", "calibration"):
            if needed not in extra:
                raise ValueError(
                    f"SpeckvConnector: kv_connector_extra_config needs {needed!r} (see speckv.integrations.vllm)"
                )
        groups = getattr(kv_cache_config, "kv_cache_groups", None) or []
        if len(groups) > 1:
            raise UnsupportedLayoutError(
                f"SpeckvConnector: the model has {len(groups)} KV cache groups (sliding-window layers); "
                "speckv's connector stores models with one"
            )
        self._block_size = int(vllm_config.cache_config.block_size)
        self._dtype = cache_dtype(vllm_config)
        queue_depth = int(extra.get("save_queue", DEFAULT_SAVE_QUEUE))
        if queue_depth < 0:
            raise ValueError(f"SpeckvConnector: save_queue must be >= 0, got {queue_depth}")
        # the memory tier is this engine's: named by its id, which every process of it shares
        name = str(self._kv_transfer_config.engine_id or "default")
        worker = self._worker = role == KVConnectorRole.WORKER

        def store(backend: Any = None, threads: int | None = None) -> EngineStore:
            return EngineStore(
                vllm_config.model_config.model,
                None if free else extra["calibration"],
                extra["store"] if backend is None else backend,
                block_size=self._block_size,
                cache_dtype=self._dtype,
                weights=worker,
                joint=extra.get("joint"),
                threads=threads,
                coding=_FREE[predictor] if predictor is not None else "fast",
                max_bytes=extra.get("max_bytes") if backend is None else None,
                name=name,
            )

        self.store = store()
        # restores layer by layer: the predictor-free stores (module docs)
        self._loader: LayerLoader | None = None
        self._layer_loads: list[_LayerLoad] = []
        if worker and free and bool(extra.get("load_by_layer", True)):
            self._loader = LayerLoader()
        # the background saver codes with a store of its own (its own predictor state), on the
        # same backend: loads never wait for a save's codec
        self._saver: BackgroundSaver | None = None
        if worker and queue_depth:
            saving = store(self.store.backend, threads=int(extra.get("save_threads", 1)))
            self._saving_store: EngineStore | None = saving
            nice = extra.get("save_nice", 19)
            self._saver = BackgroundSaver(self._save_now, depth=queue_depth, nice=None if nice is None else int(nice))
        else:
            self._saving_store = None
        self._stats_file = extra.get("stats_file")
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
        self._save_wait_s = float(extra.get("save_wait_s", DEFAULT_SAVE_WAIT_S))
        # scheduler: saves asked of the workers, [whole-block tokens, when to stop waiting for
        # them (None until the step that asked for them has run: the clock starts when the
        # worker has the blocks, not when the prefill that computes them begins), the step],
        # and requests waiting for one (request id -> when it began waiting)
        self._pending_saves: list[list[Any]] = []
        self._step = 0
        self._waiting: dict[str, float] = {}
        specs = extra["store"] if isinstance(extra["store"], (list, tuple)) else [extra["store"]]
        self._memory_tier = memory_tier_path(name) if MEMORY in specs else None
        if self._memory_tier is not None and role == KVConnectorRole.SCHEDULER:
            atexit.register(shutil.rmtree, self._memory_tier, True)
        if role == KVConnectorRole.SCHEDULER and self._stats_file:
            atexit.register(self._write_stats)
        if role == KVConnectorRole.SCHEDULER and extra.get("load_failure", "recompute") == "recompute":
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

    # ==============================
    # Scheduler side
    # ==============================
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        ids = list(request.prompt_token_ids or [])
        # vLLM computes at least the prompt's last token itself
        usable = (len(ids) - 1) // self._block_size * self._block_size
        self._counters["matches"] += 1
        if usable <= num_computed_tokens:
            return 0, False
        n = self.store.match(ids[:usable], read=False)
        if n < usable and self._save_on_its_way(request.request_id, ids[:usable], n):
            time.sleep(SAVE_POLL_S)
            return None, False  # vLLM asks again at its next step
        self._matched[request.request_id] = n
        if n <= num_computed_tokens:
            return 0, False
        self._counters["tokens_matched"] += n - num_computed_tokens
        self._need_load[request.request_id] = (num_computed_tokens, ids[:n])
        return n - num_computed_tokens, False

    def _save_on_its_way(self, req_id: str, ids: list[int], n: int) -> bool:
        """Whether ``req_id`` (its prompt's whole blocks ``ids``, ``n`` tokens of them stored)
        should wait for a save on its way that holds at least one more of its blocks: saves
        are forgotten ``save_wait_s`` after the step that computed their blocks, and a request
        waits at most that long in all."""
        now = time.monotonic()
        self._pending_saves = [p for p in self._pending_saves if p[1] is None or p[1] > now]
        began = self._waiting.get(req_id)
        if began is not None and now - began >= self._save_wait_s:
            self._stop_waiting(req_id, now)
            return False
        more = n + self._block_size
        if len(ids) >= more and any(len(t) >= more and t[:more] == ids[:more] for t, _, _ in self._pending_saves):
            if began is None:
                self._waiting[req_id] = now
                self._counters["save_waits"] += 1
            return True
        self._stop_waiting(req_id, now)
        return False

    def _stop_waiting(self, req_id: str, now: float) -> None:
        began = self._waiting.pop(req_id, None)
        if began is not None:
            self._seconds["save_wait_s"] += now - began

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        if num_external_tokens == 0:
            self._need_load.pop(request.request_id, None)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        meta = SpeckvConnectorMetadata()
        b = self._block_size
        self._step += 1
        now = time.monotonic()
        for pending in self._pending_saves:  # asked for in a step that has run since
            if pending[1] is None and pending[2] < self._step:
                pending[1] = now + self._save_wait_s
        for new in scheduler_output.scheduled_new_reqs:
            prompt = list(new.prompt_token_ids or [])
            blocks = list(new.block_ids[0])
            if new.req_id in self._need_load:
                local, tokens = self._need_load.pop(new.req_id)
                meta.loads.append(_Load(new.req_id, tokens, blocks[: len(tokens) // b], local // b))
            whole = len(prompt) // b
            if whole > self._matched.pop(new.req_id, 0) // b:  # blocks not stored yet
                self._saving[new.req_id] = {"prompt": prompt, "blocks": blocks, "done": 0}
            if new.req_id in self._saving:
                scheduled = scheduler_output.num_scheduled_tokens.get(new.req_id, 0)
                self._saving[new.req_id]["done"] = new.num_computed_tokens + scheduled
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            new_blocks = cached.new_block_ids[i]
            resumed = req_id in getattr(cached, "resumed_req_ids", set())
            if req_id in self._need_load and resumed and new_blocks is not None:
                local, tokens = self._need_load.pop(req_id)
                meta.loads.append(_Load(req_id, tokens, list(new_blocks[0])[: len(tokens) // b], local // b))
            if req_id in self._saving:
                state = self._saving[req_id]
                if new_blocks is not None:
                    state["blocks"] = list(new_blocks[0]) if resumed else state["blocks"] + list(new_blocks[0])
                state["done"] = cached.num_computed_tokens[i] + scheduler_output.num_scheduled_tokens.get(req_id, 0)
        for req_id in list(self._saving):
            state = self._saving[req_id]
            if state["done"] >= len(state["prompt"]):  # the whole prompt is computed this step
                whole = len(state["prompt"]) // b
                meta.saves.append(_Save(req_id, state["prompt"][: whole * b], state["blocks"][:whole]))
                del self._saving[req_id]
                if self._save_wait_s > 0 and whole:
                    kept = self._pending_saves[-(MAX_PENDING_SAVES - 1) :]
                    self._pending_saves = [*kept, [state["prompt"][: whole * b], None, self._step]]
        return meta

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        for table in (self._matched, self._need_load, self._saving):
            table.pop(request.request_id, None)
        self._stop_waiting(request.request_id, time.monotonic())
        return False, None

    # ==============================
    # Worker side
    # ==============================
    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        from vllm.platforms import current_platform

        n_layers, heads, dim = self.store.kv_spec
        platform = str(current_platform.device_type)
        for order, (name, buffer) in enumerate(kv_caches.items()):
            found = _LAYER.search(name)
            layer = int(found.group(1)) if found else order
            layout = PagedLayout.detect(
                buffer,
                platform=platform,
                block_size=self._block_size,
                kv_heads=heads,
                head_dim=dim,
                isa=self._attention_isa(name, dim) if platform == "cpu" else "",
                backend=self._attention_backend(name) if platform != "cpu" else "",
            )
            self._layout = self._layout or layout
            self._caches[layer] = buffer
            self._names[name] = layer
        if sorted(self._caches) != list(range(n_layers)):
            raise UnsupportedLayoutError(
                f"SpeckvConnector: vLLM registered KV caches of layers {sorted(self._caches)}, "
                f"the model has {n_layers} layers"
            )

    def _attention_backend(self, layer_name: str) -> str:
        """The name of the attention backend vLLM runs ``layer_name`` with on a GPU
        (``AttentionBackend.get_name()``: it decides how a block is laid out)."""
        attn = self._vllm_config.compilation_config.static_forward_context.get(layer_name)
        backend = getattr(attn, "attn_backend", None)
        return str(backend.get_name()) if backend is not None else "unknown"

    def _attention_isa(self, layer_name: str, head_dim: int) -> str:
        """The kernel ("ISA") vLLM's CPU attention runs ``layer_name`` with: it decides how a
        block is laid out (``speckv.integrations.paged``). Read off the layer, where vLLM's
        metadata builder set it, else asked of vLLM as that builder asks."""
        attn = self._vllm_config.compilation_config.static_forward_context.get(layer_name)
        isa = getattr(attn, "isa", None)
        if isa is None:
            from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

            isa = _get_attn_isa(
                self._vllm_config.model_config.dtype,
                self._block_size,
                head_dim,
                self._vllm_config.cache_config.cache_dtype,
            )
        return str(isa)

    def _view(self, buffer: torch.Tensor) -> torch.Tensor:
        """The buffer in the cache's own dtype (vLLM's fp8 buffers are uint8)."""
        return buffer.view(self._dtype) if buffer.dtype != self._dtype else buffer

    def _usable(self) -> bool:
        """False, logged once, where this worker cannot serve or store (fp8 scales that are
        not the calibration's)."""
        if not self._scales_checked:
            self._scales_checked = True
            try:
                self.store.check_fp8_scales(self._fp8_scales())
            except ValueError as e:
                self._unusable = str(e)
                logger.warning("speckv: connector off, every request computes its prefill: %s", e)
        return self._unusable is None

    def _fp8_scales(self) -> list[tuple[float, float]]:
        if self.store.dtype != "fp8":
            return []
        layers = self._vllm_config.compilation_config.static_forward_context
        scales: dict[int, tuple[float, float]] = {}
        for name, layer in self._names.items():
            attn = layers.get(name)
            scales[layer] = (float(getattr(attn, "_k_scale_float", 1.0)), float(getattr(attn, "_v_scale_float", 1.0)))
        return [scales[i] for i in sorted(scales)]

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, SpeckvConnectorMetadata)
        self._finish_layer_loads()  # a step whose end we did not see (never, as vLLM runs)
        if self._loader is not None:
            self._start_layer_loads(meta.loads)
            return
        b = self._block_size
        start = time.perf_counter()
        for load in meta.loads:
            served = load.first
            if self._usable() and load.token_ids and self._layout is not None:
                try:
                    kv, n = self.store.load(load.token_ids)
                    served = max(load.first, n // b)
                    for layer, (k, v) in enumerate(kv):
                        lo, hi = load.first * b, served * b
                        self._layout.write(
                            self._view(self._caches[layer]),
                            load.block_ids[load.first : served],
                            k[:, :, lo:hi].contiguous(),
                            v[:, :, lo:hi].contiguous(),
                        )
                except Exception as e:  # never the engine's error: those blocks are computed
                    self.store.fault(f"inject:{type(e).__name__}", f"writing decoded blocks failed: {e}")
                    served = load.first
            self._loaded(load, served)
        if meta.loads:
            self._seconds["load_s"] += time.perf_counter() - start

    def _loaded(self, load: _Load, served: int) -> None:
        """Counts a load that served blocks ``load.first:served`` and reports the rest of its
        blocks as failed (vLLM computes them)."""
        b = self._block_size
        self._counters["tokens_loaded"] += (served - load.first) * b
        if len(self._loads) < MAX_LOADS_KEPT:
            self._loads.append([load.req_id, load.first * b, len(load.block_ids) * b, served * b])
        failed = load.block_ids[served:]
        self._counters["blocks_failed"] += len(failed)
        if failed:
            self.store.fault(
                "partial",
                f"{len(failed)} of {len(load.block_ids) - load.first} matched blocks could not be served "
                "(a damaged, foreign or vanished entry, or a decode refused)",
            )
            self._load_errors.update(failed)

    def _start_layer_loads(self, loads: list[_Load]) -> None:
        """Reads every load's entries now (checked, not decoded), then hands the decoding to
        the loader thread, layer by layer (``_restore_layer``)."""
        assert self._loader is not None
        start = time.perf_counter()
        for load in loads:
            blocks: list[StoredBlock] = []
            if self._usable() and load.token_ids and self._layout is not None:
                blocks = self.store.read_blocks(load.token_ids, start=load.first)
            self._layer_loads.append(_LayerLoad(load, blocks, load.first + len(blocks)))
        if any(job.blocks for job in self._layer_loads):
            self._loader.start(len(self._caches), self._restore_layer)
        self._seconds["load_s"] += time.perf_counter() - start

    def _restore_layer(self, layer: int) -> None:
        """On the loader's thread: layer ``layer`` of every block read, decoded and written
        into vLLM's buffer (numpy and the core alone). A block whose layer is damaged ends its
        request's served blocks there."""
        assert self._layout is not None
        prefix = self.store.prefix
        assert isinstance(prefix, FreePrefixStore)
        buffer = self._view(self._caches[layer])
        for job in self._layer_loads:
            n = job.served - job.load.first
            words = []
            for i, block in enumerate(job.blocks[:n]):
                try:
                    words.append(prefix.decode_layers(block, layer, layer + 1)[0])
                except Exception as e:
                    prefix.damaged()
                    self.store.fault(f"inject:{type(e).__name__}", f"decoding a stored block failed: {e}")
                    n = i
                    break
            job.served = job.load.first + n
            if n:
                ids = job.load.block_ids[job.load.first : job.served]
                self._layout.put(buffer, ids, self._layout.pack(np.stack(words)))

    def _finish_layer_loads(self) -> None:
        """Waits for the loader's job and counts what each load served; an exception that
        ended the job makes every block it restored a failed one (computed)."""
        if self._loader is None or not self._layer_loads:
            return
        error = self._loader.join()
        if error is not None:
            self.store.fault(f"inject:{type(error).__name__}", f"restoring layers failed: {error}")
        for job in self._layer_loads:
            self._loaded(job.load, job.load.first if error is not None else job.served)
        self._layer_loads = []

    def wait_for_layer_load(self, layer_name: str) -> None:
        if self._loader is not None and layer_name in self._names:
            self._loader.wait(self._names[layer_name])

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, SpeckvConnectorMetadata)
        if not meta.saves or self._layout is None or layer_name not in self._names:
            return
        layer = self._names[layer_name]
        start = time.perf_counter()
        for save in meta.saves:
            try:
                blocks = self._layout.copy_blocks(self._view(kv_layer), save.block_ids)
            except Exception as e:
                self.store.fault(f"read:{type(e).__name__}", f"reading blocks to store failed: {e}")
                continue
            self._captured.setdefault(save.req_id, {})[layer] = blocks
        self._seconds["save_copy_s"] += time.perf_counter() - start

    def wait_for_save(self) -> None:
        self._finish_layer_loads()
        if not self._captured:
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, SpeckvConnectorMetadata)
        captured, self._captured = self._captured, {}
        if not self._usable():
            return
        # from a GPU, copy_blocks queued the copies to the host: they must land before the
        # saver's thread reads them (the step's forward pass is over by now)
        host_ready(next(iter(self._caches.values())).device)
        for save in meta.saves:
            layers = captured.get(save.req_id, {})
            if sorted(layers) != sorted(self._caches):
                continue  # a layer could not be read: nothing stored, a later miss
            blocks = [layers[i] for i in sorted(layers)]
            if self._saver is not None:
                self._saver.submit(save.token_ids, blocks)
            else:
                self._save_now(save.token_ids, blocks, self.store)

    def _save_now(self, token_ids: list[int], blocks: list[torch.Tensor], store: EngineStore | None = None) -> int:
        """Stores one request's blocks (per layer, as ``copy_blocks`` copied them): on the
        saver's thread unless the queue is off. The layout is undone with numpy alone: torch's
        thread pool is the engine's, and a second thread entering it contends for the cores."""
        assert self._layout is not None
        store = store or self._saving_store
        assert store is not None
        kv = [self._layout.split(b.numpy()) for b in blocks]
        return store.save(token_ids, kv)

    def get_block_ids_with_load_errors(self) -> set[int]:
        self._finish_layer_loads()
        errors, self._load_errors = self._load_errors, set()
        return errors

    def shutdown(self) -> None:
        """Finishes the queued saves (at most ``SHUTDOWN_DRAIN_S``), then writes the counters
        (``stats_file``)."""
        self._finish_layer_loads()
        if self._loader is not None:
            self._loader.close()
        if self._saver is not None:
            if not self._saver.close(SHUTDOWN_DRAIN_S):
                logger.warning("speckv: %d saves were still queued at shutdown (not stored)", self._saver.pending())
        self._write_stats()
        if self._memory_tier is not None:  # the engine is going: so is its RAM tier (the
            shutil.rmtree(self._memory_tier, ignore_errors=True)  # scheduler's atexit may not run)

    # ==============================
    # Both sides
    # ==============================
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
        tier: dict[str, Any]
        try:
            tier = dict(self.store.prefix.stats())
        except Exception as e:  # the counters still count when the store is gone
            tier = {**self.store.prefix.stats_counters(), "stats_error": str(e)}
        if self._saving_store is not None:
            for k, v in self._saving_store.prefix.stats_counters().items():
                tier[k] += v
        out["tier"] = tier
        tiers = getattr(self.store.backend, "tier_stats", None)
        if tiers is not None:
            out["tiers"] = tiers()
        if self._saver is not None:
            out["saver"] = self._saver.counters()
        if self._worker:
            out["loads"] = list(self._loads)
        return out

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


__all__ = ["SpeckvConnector", "SpeckvConnectorMetadata", "cache_dtype"]
