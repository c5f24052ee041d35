"""``ConnectorWorker``: the connector in a vLLM worker: vLLM's paged buffers registered and
their layout detected, matched blocks decoded into them (layer by layer for the predictor-free
stores), and computed blocks copied out and handed to the background saver."""

from __future__ import annotations

import shutil
import time
from typing import Any

import numpy as np
import torch
from vllm.logger import init_logger

from ...prefix.free_store import FreePrefixStore, StoredBlock
from ..engine import EngineStore
from ..layer_loader import LayerLoader
from ..paged import PagedLayout, UnsupportedLayoutError, host_ready
from ..saver import BackgroundSaver
from .context import ConnectorContext
from .metrics import SideCounters, write_stats
from .requests import _LAYER, MAX_LOADS_KEPT, SHUTDOWN_DRAIN_S, SpeckvConnectorMetadata, _LayerLoad, _Load

logger = init_logger(__name__)


class ConnectorWorker:
    """A worker's part of vLLM's ``KVConnectorBase_V1`` API (``SpeckvConnector`` hands it the
    calls, with the step's ``SpeckvConnectorMetadata``)."""

    def __init__(self, context: ConnectorContext) -> None:
        config = context.config
        self.context = context
        self.store = context.store(weights=True)
        self._block_size = context.block_size
        self._dtype = context.dtype
        # restores layer by layer: the predictor-free stores (the package's docs)
        self._loader: LayerLoader | None = LayerLoader() if config.layer_loads else None
        self._layer_loads: list[_LayerLoad] = []
        # the background saver codes with a store of its own (its own predictor state), on the
        # same backend: loads never wait for a save's codec
        self._saver: BackgroundSaver | None = None
        self._saving_store: EngineStore | None = None
        if config.save_queue:
            self._saving_store = context.store(weights=True, backend=self.store.backend, threads=config.save_threads)
            self._saver = BackgroundSaver(
                self.save_now, depth=config.save_queue, max_bytes=config.save_backlog, nice=config.save_nice
            )
        self.counters = SideCounters("worker", self.store, self._saver)
        self.counters.saving_store = self._saving_store
        # per load: request id, tokens vLLM had, tokens matched, tokens served (stats_file)
        self._loads: list[list[Any]] = []
        # vLLM's buffers by layer, their names, and their layout (``register_kv_caches``)
        self.caches: dict[int, torch.Tensor] = {}
        self._names: dict[str, int] = {}
        self.layout: PagedLayout | None = None
        # per request, per layer: its blocks copied out of vLLM's buffer (PagedLayout.copy_blocks)
        self.captured: dict[str, dict[int, torch.Tensor]] = {}
        self._load_errors: set[int] = set()
        self._unusable: str | None = None
        self._scales_checked = False

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
            self.layout = self.layout or layout
            self.caches[layer] = buffer
            self._names[name] = layer
        if sorted(self.caches) != list(range(n_layers)):
            raise UnsupportedLayoutError(
                f"SpeckvConnector: vLLM registered KV caches of layers {sorted(self.caches)}, "
                f"the model has {n_layers} layers"
            )

    def _attention_backend(self, layer_name: str) -> str:
        """The name of the attention backend vLLM runs ``layer_name`` with on a GPU
        (``AttentionBackend.get_name()``: it decides how a block is laid out)."""
        attn = self.context.vllm_config.compilation_config.static_forward_context.get(layer_name)
        backend = getattr(attn, "attn_backend", None)
        return str(backend.get_name()) if backend is not None else "unknown"

    def _attention_isa(self, layer_name: str, head_dim: int) -> str:
        """The kernel ("ISA") vLLM's CPU attention runs ``layer_name`` with: it decides how a
        block is laid out (``speckv.integrations.paged``). Read off the layer, where vLLM's
        metadata builder set it, else asked of vLLM as that builder asks."""
        attn = self.context.vllm_config.compilation_config.static_forward_context.get(layer_name)
        isa = getattr(attn, "isa", None)
        if isa is None:
            from vllm.v1.attention.backends.cpu_attn import _get_attn_isa

            isa = _get_attn_isa(
                self.context.vllm_config.model_config.dtype,
                self._block_size,
                head_dim,
                self.context.vllm_config.cache_config.cache_dtype,
            )
        return str(isa)

    def view(self, buffer: torch.Tensor) -> torch.Tensor:
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
        layers = self.context.vllm_config.compilation_config.static_forward_context
        scales: dict[int, tuple[float, float]] = {}
        for name, layer in self._names.items():
            attn = layers.get(name)
            scales[layer] = (float(getattr(attn, "_k_scale_float", 1.0)), float(getattr(attn, "_v_scale_float", 1.0)))
        return [scales[i] for i in sorted(scales)]

    def start_load_kv(self, meta: SpeckvConnectorMetadata) -> None:
        self._finish_layer_loads()  # a step whose end we did not see (never, as vLLM runs)
        if self._loader is not None:
            self._start_layer_loads(meta.loads)
            return
        b = self._block_size
        start = time.perf_counter()
        for load in meta.loads:
            served = load.first
            if self._usable() and load.token_ids and self.layout is not None:
                try:
                    kv, n = self.store.load(load.token_ids)
                    served = max(load.first, n // b)
                    for layer, (k, v) in enumerate(kv):
                        lo, hi = load.first * b, served * b
                        self.layout.write(
                            self.view(self.caches[layer]),
                            load.block_ids[load.first : served],
                            k[:, :, lo:hi].contiguous(),
                            v[:, :, lo:hi].contiguous(),
                        )
                except Exception as e:  # never the engine's error: those blocks are computed
                    self.store.fault(f"inject:{type(e).__name__}", f"writing decoded blocks failed: {e}")
                    served = load.first
            self._loaded(load, served)
        if meta.loads:
            self.counters.seconds["load_s"] += time.perf_counter() - start

    def _loaded(self, load: _Load, served: int) -> None:
        """Counts a load that served blocks ``load.first:served`` and reports the rest of its
        blocks as failed (vLLM computes them)."""
        b = self._block_size
        self.counters.counts["tokens_loaded"] += (served - load.first) * b
        if len(self._loads) < MAX_LOADS_KEPT:
            self._loads.append([load.req_id, load.first * b, len(load.block_ids) * b, served * b])
        failed = load.block_ids[served:]
        self.counters.counts["blocks_failed"] += len(failed)
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
            if self._usable() and load.token_ids and self.layout is not None:
                blocks = self.store.read_blocks(load.token_ids, start=load.first)
            self._layer_loads.append(_LayerLoad(load, blocks, load.first + len(blocks)))
        if any(job.blocks for job in self._layer_loads):
            self._loader.start(len(self.caches), self._restore_layer)
        self.counters.seconds["load_s"] += time.perf_counter() - start

    def _restore_layer(self, layer: int) -> None:
        """On the loader's thread: layer ``layer`` of every block read, decoded and written
        into vLLM's buffer (numpy and the core alone). A block whose layer is damaged ends its
        request's served blocks there."""
        assert self.layout is not None
        prefix = self.store.prefix
        assert isinstance(prefix, FreePrefixStore)
        buffer = self.view(self.caches[layer])
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
                self.layout.put(buffer, ids, self.layout.pack(np.stack(words)))

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

    def save_kv_layer(self, meta: SpeckvConnectorMetadata, layer_name: str, kv_layer: torch.Tensor) -> None:
        if not meta.saves or self.layout is None or layer_name not in self._names:
            return
        layer = self._names[layer_name]
        start = time.perf_counter()
        for save in meta.saves:
            try:
                blocks = self.layout.copy_blocks(self.view(kv_layer), save.block_ids)
            except Exception as e:
                self.store.fault(f"read:{type(e).__name__}", f"reading blocks to store failed: {e}")
                continue
            self.captured.setdefault(save.req_id, {})[layer] = blocks
        self.counters.seconds["save_copy_s"] += time.perf_counter() - start

    def wait_for_save(self, meta: SpeckvConnectorMetadata) -> None:
        self._finish_layer_loads()
        if not self.captured:
            return
        captured, self.captured = self.captured, {}
        if not self._usable():
            return
        # from a GPU, copy_blocks queued the copies to the host: they must land before the
        # saver's thread reads them (the step's forward pass is over by now)
        host_ready(next(iter(self.caches.values())).device)
        for save in meta.saves:
            layers = captured.get(save.req_id, {})
            if sorted(layers) != sorted(self.caches):
                continue  # a layer could not be read: nothing stored, a later miss
            blocks = [layers[i] for i in sorted(layers)]
            if self._saver is not None:
                self._saver.submit(save.token_ids, blocks, nbytes=sum(b.numel() * b.element_size() for b in blocks))
            else:
                self.save_now(save.token_ids, blocks, self.store)

    def save_now(self, token_ids: list[int], blocks: list[torch.Tensor], store: EngineStore | None = None) -> int:
        """Stores one request's blocks (per layer, as ``copy_blocks`` copied them): on the
        saver's thread unless the queue is off. The layout is undone with numpy alone: torch's
        thread pool is the engine's, and a second thread entering it contends for the cores."""
        assert self.layout is not None
        store = store or self._saving_store
        assert store is not None
        kv = [self.layout.split(b.numpy()) for b in blocks]
        return store.save(token_ids, kv)

    def get_block_ids_with_load_errors(self) -> set[int]:
        self._finish_layer_loads()
        errors, self._load_errors = self._load_errors, set()
        return errors

    def stats(self) -> dict[str, Any]:
        """The worker's counters (``SideCounters.stats``): tokens loaded, blocks that failed,
        the loader's time, the saver's, and every load (``MAX_LOADS_KEPT`` at most)."""
        if self._loader is not None:
            self.counters.seconds["layer_wait_s"] = self._loader.waited_s
            self.counters.seconds["loader_busy_s"] = self._loader.busy_s
        return {**self.counters.stats(), "loads": list(self._loads)}

    def write_stats(self) -> None:
        write_stats(self.context.config.stats_file, self.stats())

    def shutdown(self) -> None:
        """Finishes the queued saves (at most ``SHUTDOWN_DRAIN_S``), then writes the counters
        (``stats_file``): once before the drain too, and whatever the drain raised, so that a
        worker vLLM kills mid-drain (5 s after its SIGTERM) still leaves them."""
        self.write_stats()
        try:
            self._finish_layer_loads()
            if self._loader is not None:
                self._loader.close()
            if self._saver is not None and not self._saver.close(SHUTDOWN_DRAIN_S):
                logger.warning("speckv: %d saves were still queued at shutdown (not stored)", self._saver.pending())
        finally:
            self.write_stats()
            if self.context.memory_tier is not None:  # the engine is going: so is its RAM tier
                shutil.rmtree(self.context.memory_tier, ignore_errors=True)  # (the scheduler's atexit may not run)


__all__ = ["ConnectorWorker"]
