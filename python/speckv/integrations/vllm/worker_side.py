"""The connector's worker side: vLLM's paged buffers registered and their layout detected,
matched blocks decoded into them (layer by layer for the predictor-free stores), and computed
blocks copied out and handed to the background saver."""

from __future__ import annotations

import shutil
import time
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm.logger import init_logger

from ...hf.stores.free_store import FreePrefixStore, StoredBlock
from ..engine import EngineStore
from ..paged import PagedLayout, UnsupportedLayoutError, host_ready
from .requests import _LAYER, MAX_LOADS_KEPT, SHUTDOWN_DRAIN_S, SpeckvConnectorMetadata, _LayerLoad, _Load
from .state import _ConnectorState

if TYPE_CHECKING:
    from vllm.forward_context import ForwardContext


logger = init_logger(__name__)


class _WorkerSide(_ConnectorState):
    """``SpeckvConnector``'s worker methods (vLLM's ``KVConnectorBase_V1`` API); the state
    they share is set up in ``SpeckvConnector.__init__``."""

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
                self._saver.submit(save.token_ids, blocks, nbytes=sum(b.numel() * b.element_size() for b in blocks))
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
        (``stats_file``): once before the drain too, and whatever the drain raised, so that a
        worker vLLM kills mid-drain (5 s after its SIGTERM) still leaves them."""
        self._write_stats()
        try:
            self._finish_layer_loads()
            if self._loader is not None:
                self._loader.close()
            if self._saver is not None and not self._saver.close(SHUTDOWN_DRAIN_S):
                logger.warning("speckv: %d saves were still queued at shutdown (not stored)", self._saver.pending())
        finally:
            self._write_stats()
            if self._memory_tier is not None:  # the engine is going: so is its RAM tier (the
                shutil.rmtree(self._memory_tier, ignore_errors=True)  # scheduler's atexit may not run)
