"""``EngineStore``: a ``PrefixStore`` a serving engine can host, built from the model's
checkpoint folder and a calibration file, with no Hugging Face model in memory.

The engine holds the model; speckv needs only what its predictor reads. For the layer-wise
predictors (``map``: layer 0 from the token ids, later layers from the decoded ones;
``prefix:N``: the first N layers) that is the embedding and the first layers, read from the
checkpoint (``speckv.models.checkpoint.load_trunk``); for ``stats`` nothing at all. The codec's
identity (the checkpoint's fingerprint, the calibration, the predictor, the storage dtype, the
block size) names every stored block, so an entry made under any other is never served.

Without a calibration (``calibration=None``) the blocks are coded predictor-free with the fast
lane (``speckv.prefix.free_store.FreePrefixStore``): no calibration file, no weights, and a restore
that is decoding alone, at about twice the stored size of a predicted one (bf16 and fp16).

Every fault is the engine's cue to recompute: ``match`` answers 0 and ``load`` the tokens it
could serve (a prefix of what was asked, maybe none), with the reason logged once per kind;
neither raises for a bad store, a damaged entry or a foreign one.

>>> store = EngineStore("/models/smollm2", "cal.safetensors", "/var/kv", block_size=128)  # doctest: +SKIP
>>> n = store.match(token_ids)                    # tokens of the longest stored prefix     # doctest: +SKIP
>>> kv, n = store.load(token_ids[:n])             # per layer (K, V) [1, heads, n, dim]     # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..codec.codec import SpeculativeCodec
from ..codec.from_description import predictor_from_description
from ..models.architecture import text_config
from ..models.checkpoint import checkpoint_fingerprint, load_trunk, skeleton
from ..predictors.calibration import Calibration
from ..prefix.free_store import FreePrefixStore, StoredBlock
from ..prefix.prefix_store import PrefixStore
from ..store import Backend, DirectoryBackend, RedisBackend
from ..store.redis_backend import SCHEMES as REDIS_SCHEMES
from ..store.tiered import TieredBackend

log = logging.getLogger("speckv.engine")

# the predictors an engine can host: the model's first layers read from the checkpoint (map:
# one), or per-channel statistics (no weights)
HOSTED_PREDICTORS = ("model-prefix", "channel-stats")
# what the engine stores its cache as -> the codec's storage dtype
CACHE_DTYPES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float8_e4m3fn: "fp8"}
# the predicted store's namespace for engines: "2" since the connector reads vLLM's amx block
# layout (2026-12-02; before, blocks stored on AMX processors held scrambled caches, never to
# be served)
ENGINE_SCOPE = "engine-2"
# the store spec of the host-RAM tier (``open_backend``)
MEMORY = "memory"
# how blocks are coded without a calibration: the predictor-free fast lane, or not at all
FREE_CODINGS = ("fast", "raw")


def memory_tier_path(name: str) -> Path:
    """Where the host-RAM tier named ``name`` keeps its entries: a folder on the RAM file
    system (``/dev/shm``, else the temporary folder), so that every process of one engine
    (vLLM's scheduler and workers) sees the same entries."""
    root = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
    return root / f"speckv-{safe}"


def open_backend(
    spec: str | Backend | Sequence[str],
    *,
    max_bytes: int | Sequence[int | None] | None = None,
    name: str = "default",
) -> Backend:
    """A ``speckv.store`` backend from a spec: a folder path, a ``redis://`` / ``rediss://`` /
    ``unix://`` URL, or ``"memory"`` (the host-RAM tier ``memory_tier_path(name)``, shared by
    the processes of one engine); a list of specs stacks them, upper first
    (``speckv.store.tiered.TieredBackend``: RAM over a folder or Redis). ``max_bytes`` bounds a
    folder or the memory tier (evicting least recently used prefix tails); for a stack, one
    budget per tier (None: none). A Redis server's budget is its own ``maxmemory`` (with
    ``maxmemory-policy allkeys-lru``), so ``max_bytes`` for a URL is refused."""
    if not isinstance(spec, (str, Backend)):
        specs = list(spec)
        budgets = list(max_bytes) if isinstance(max_bytes, (list, tuple)) else [max_bytes] + [None] * (len(specs) - 1)
        if len(budgets) != len(specs):
            raise ValueError(f"max_bytes: {len(budgets)} budgets for {len(specs)} tiers")
        return TieredBackend([open_backend(s, max_bytes=b, name=name) for s, b in zip(specs, budgets)])
    if isinstance(max_bytes, (list, tuple)):
        raise ValueError("max_bytes: a list of budgets is for a list of tiers")
    if max_bytes is not None and (not isinstance(max_bytes, int) or isinstance(max_bytes, bool) or max_bytes <= 0):
        raise ValueError(f"max_bytes: expected a positive number of bytes, got {max_bytes!r}")
    if not isinstance(spec, str):
        if max_bytes is not None:
            raise ValueError("max_bytes: give the budget to the backend object itself")
        return spec
    if spec.startswith(REDIS_SCHEMES):
        if max_bytes is not None:
            raise ValueError(
                "max_bytes: a Redis server's budget is its own: set its maxmemory and "
                "maxmemory-policy allkeys-lru (see speckv.store)"
            )
        return RedisBackend(spec)
    if spec == MEMORY:
        return DirectoryBackend(memory_tier_path(name), max_bytes, durable=False)
    return DirectoryBackend(os.path.expanduser(spec), max_bytes)


class EngineStore:
    """Compressed prefix blocks of one engine's model (see the module docs).

    ``model_folder``: the transformers checkpoint the engine serves; ``calibration``: a file
    from ``speckv calibrate --model FOLDER``, or None to code predictor-free; ``store``: a backend or its spec
    (``open_backend``); ``block_size``: the engine's block size; ``cache_dtype``: the torch
    dtype the engine stores its cache in (fp8: ``float8_e4m3fn``, with the calibration's fp8
    scales); ``weights=False`` builds only what keys and matching need (the engine's
    scheduler), ``True`` the predictor too (its workers). Without a calibration, ``coding``
    says how blocks are stored: ``"fast"`` (the predictor-free lane) or ``"raw"``
    (uncompressed: the baseline tier, same keys, budget and eviction). ``max_bytes`` and
    ``name``: see ``open_backend``."""

    def __init__(
        self,
        model_folder: str | os.PathLike[str],
        calibration: str | os.PathLike[str] | None,
        store: str | Backend | Sequence[str],
        *,
        block_size: int,
        cache_dtype: torch.dtype = torch.bfloat16,
        weights: bool = True,
        joint: bool | None = None,
        threads: int | None = None,
        coding: str = "fast",
        max_bytes: int | Sequence[int | None] | None = None,
        name: str = "default",
    ) -> None:
        if cache_dtype not in CACHE_DTYPES:
            names = ", ".join(str(d).replace("torch.", "") for d in CACHE_DTYPES)
            raise ValueError(f"cache_dtype: speckv stores caches of {names}, got {cache_dtype}")
        self.dtype = CACHE_DTYPES[cache_dtype]
        self.cache_dtype = cache_dtype
        self.block_size = int(block_size)
        self._logged: set[str] = set()
        folder = Path(model_folder)
        if coding not in FREE_CODINGS:
            raise ValueError(f"coding: expected one of {FREE_CODINGS}, got {coding!r}")
        if calibration is not None and coding != "fast":
            raise ValueError(f"coding={coding!r} stores blocks without a predictor: give no calibration")
        backend = open_backend(store, max_bytes=max_bytes, name=name)
        if calibration is None:
            self._free(folder, backend, threads, coding)
            return
        cal = Calibration.load(str(calibration))
        description = dict(cal.metadata.get("predictor", {}))
        if description.get("name") not in HOSTED_PREDICTORS:
            raise ValueError(
                f"{calibration}: made with predictor {description.get('name')!r}; an engine hosts "
                f"{', '.join(HOSTED_PREDICTORS)} (speckv calibrate --predictor map|prefix:N|stats)"
            )
        layers = int(description.get("layers", 0)) if description.get("name") == "model-prefix" else 0
        model = load_trunk(folder, layers) if weights and layers else skeleton(folder, torch.bfloat16)
        predictor = predictor_from_description(model, description)
        fingerprint = checkpoint_fingerprint(folder, model)
        self.codec: SpeculativeCodec | None = SpeculativeCodec(
            model, cal, predictor, fingerprint=fingerprint, joint=joint
        )
        self.backend = backend
        self.prefix: PrefixStore | FreePrefixStore = PrefixStore(
            self.codec, self.backend, block_size=self.block_size, dtype=self.dtype, threads=threads, scope=ENGINE_SCOPE
        )
        self.fp8_scales: torch.Tensor | None = cal.fp8_scales.clone()
        heads, dim = int(cal.sigma.shape[2]), int(cal.sigma.shape[3])
        self.kv_spec = (cal.n_layers, heads, dim)

    def _free(self, folder: Path, backend: Backend, threads: int | None, coding: str) -> None:
        """The predictor-free (or raw) store (``calibration=None``): the model's config, no
        weights."""

        if self.dtype == "fp8":
            raise ValueError(
                "cache_dtype: an fp8 cache is coded with the calibration's fp8 scales; "
                "give a calibration (speckv calibrate --fp8-scale S), or store bf16/fp16"
            )
        model = skeleton(folder, torch.bfloat16)
        config = text_config(model)
        heads = int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads)
        dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
        self.kv_spec = (int(config.num_hidden_layers), heads, dim)
        self.codec = None
        self.fp8_scales = None
        self.backend = backend
        self.prefix = FreePrefixStore(
            checkpoint_fingerprint(folder, model),
            self.backend,
            block_size=self.block_size,
            dtype=self.dtype,
            threads=threads,
            coding=coding,
        )

    def fault(self, kind: str, message: str) -> None:
        """Logs a fault once per kind (an engine meets the same one on every request)."""
        if kind not in self._logged:
            self._logged.add(kind)
            log.warning("speckv: %s (falling back to recompute; logged once)", message)

    def check_fp8_scales(self, scales: list[tuple[float, float]]) -> None:
        """Raises ``ValueError`` unless the engine's per-layer (K, V) fp8 scales are the
        calibration's (a cache stored with other scales is other numbers)."""
        if self.dtype != "fp8" or self.fp8_scales is None:
            return
        for layer, (k, v) in enumerate(scales):
            mine = (float(self.fp8_scales[layer, 0]), float(self.fp8_scales[layer, 1]))
            if (float(k), float(v)) != mine:
                raise ValueError(
                    f"layer {layer}: the engine's fp8 scales are {(k, v)}, the calibration's {mine}: "
                    "calibrate with `speckv calibrate --fp8-scale S` for the engine's scale S"
                )

    def _faults_since(self, before: dict[str, int], doing: str) -> None:
        """Logs (once per kind) the store errors and damaged entries met since ``before``."""
        now = self.prefix.stats_counters()
        if now["store_errors"] > before["store_errors"]:
            self.fault(f"{doing}:store", f"{doing}: the store could not be read or written ({self.backend!r})")
        if now["corrupt_entries"] > before["corrupt_entries"]:
            self.fault(f"{doing}:entry", f"{doing}: a damaged or foreign entry ended a stored prefix")

    def match(self, token_ids: list[int] | torch.Tensor, *, read: bool = True) -> int:
        """Tokens of the longest stored block-aligned prefix of ``token_ids`` (0 on any
        fault): entries read and checked, or (``read=False``, an engine's scheduler) from the
        backend's index alone, a damaged entry then found by ``load``."""
        before = self.prefix.stats_counters()
        try:
            return self.prefix.match(_ids(token_ids), read=read)
        except Exception as e:  # a store that fails is a miss, never an engine error
            self.fault(f"match:{type(e).__name__}", f"matching a prefix failed: {e}")
            return 0
        finally:
            self._faults_since(before, "matching")

    def load(self, token_ids: list[int] | torch.Tensor) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], int]:
        """``(kv, n)``: the stored cache of ``token_ids``' longest stored prefix, per layer
        ``(K, V)`` ``[1, kv_heads, n, head_dim]`` in the engine's cache dtype, bit for bit;
        ``([], 0)`` when nothing could be served."""
        before = self.prefix.stats_counters()
        try:
            return self.prefix.get_kv(_ids(token_ids))
        except Exception as e:
            self.fault(f"load:{type(e).__name__}", f"loading a prefix failed: {e}")
            return [], 0
        finally:
            self._faults_since(before, "loading")

    def read_blocks(self, token_ids: list[int] | torch.Tensor, *, start: int = 0) -> list[StoredBlock]:
        """A predictor-free store's entries of ``token_ids``' longest stored prefix from block
        ``start`` on, read and checked, for ``prefix.decode_layers`` to restore layer by layer
        (``FreePrefixStore.read_blocks``); ``[]`` on any fault, and for a predicted store."""
        if not isinstance(self.prefix, FreePrefixStore):
            return []
        before = self.prefix.stats_counters()
        try:
            return self.prefix.read_blocks(_ids(token_ids), start=start)
        except Exception as e:
            self.fault(f"load:{type(e).__name__}", f"reading a stored prefix failed: {e}")
            return []
        finally:
            self._faults_since(before, "loading")

    def save(self, token_ids: list[int] | torch.Tensor, kv: list[tuple[Any, Any]]) -> int:
        """Stores the blocks of ``kv`` (the engine's cache of ``token_ids``, per layer ``(K, V)``
        ``[1, kv_heads, tokens, head_dim]``: tensors in the cache dtype, or numpy arrays of
        their bits as integers) not stored yet; returns how many tokens that was (0 on any
        fault: a cache not stored is a later miss, never an engine error)."""
        before = self.prefix.stats_counters()
        try:
            if self.codec is not None:  # the predicted store codes tensors
                kv = [(_tensor(k, self.cache_dtype), _tensor(v, self.cache_dtype)) for k, v in kv]
            return self.prefix.put(_ids(token_ids), kv)
        except Exception as e:
            self.fault(f"save:{type(e).__name__}", f"storing a prefix failed: {e}")
            return 0
        finally:
            self._faults_since(before, "storing")


def _tensor(t: Any, dtype: torch.dtype) -> torch.Tensor:
    """``t`` as a tensor of ``dtype``: integer bits (numpy) viewed as it, without a copy."""
    return torch.from_numpy(t).view(dtype) if isinstance(t, np.ndarray) else t


def _ids(token_ids: list[int] | torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(token_ids, dtype=torch.int64).reshape(1, -1)


__all__ = [
    "CACHE_DTYPES",
    "FREE_CODINGS",
    "HOSTED_PREDICTORS",
    "MEMORY",
    "EngineStore",
    "memory_tier_path",
    "open_backend",
]
