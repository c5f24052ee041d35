"""SpeculativeCodec: compress a model's KV cache against its predictor, and back.

The bytes are a cache container (``speckv.container``; layout documented in the Rust core,
``rust/speckv/src/format/container.rs``): the cache cut into blocks of ``block_size`` tokens,
each block's keys and values one speckv stream each, a run of whole chunks per layer, so a
block or a layer is read alone; its metadata (JSON) names the storage mode, the model, the
calibration (which fixes the fp8 scales), the predictor and the prompt's digest. Version-1
containers (one block, written before 2026-12) still decode.

Every identity check (model, calibration, predictor, prompt) runs before the predictor does,
and every inner stream checks its prediction fingerprint before it decodes: a mismatch raises
``PredictionMismatchError`` and no cache is returned.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import math
import os
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np
import torch

from .. import _api, _speckv, container
from .._speckv import CorruptStreamError, PredictionMismatchError
from . import cuda as speckv_cuda
from .architecture import check_architecture, layer_windows, text_config
from .cache import KV, build_cache, extract_kv, last_tokens
from .calibration import Calibration, CalibrationMismatchError, calibrate, fp8_quantize, model_fingerprint
from .cost import joint_by_default
from .early_exit import PREFILL_CHUNK, ModelPrefixPredictor
from .layerwise import is_layerwise, walk_layers
from .predictors import AnyPredictor, ChannelStatsPredictor, Fp8Predictor, describe, fixed_threads

# Tokens per block of the container: what a reader can address (and what a prefix store
# shares); a block costs one more stream header per K and V (~0.1 KB).
DEFAULT_BLOCK_SIZE = 256
MODES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}
# sigma floor: a channel the predictor got exactly right in calibration still needs a scale
SIGMA_FLOOR = 1e-6


MAX_CHUNK = 1 << 24
# Layers per chunk of the stacked layout: fewer chunk headers, still one small read per layer.
LAYERS_PER_CHUNK = 2
# Chunks per layer of a layer-wise predictor's streams: what one layer's decode can spread over.
CHUNKS_PER_LAYER = 2


def _layout(jobs: list[tuple[Any, Any, Any]]) -> str:
    """ "stacked" when every layer's keys share one shape and values another (the usual case),
    so all layers fit one stream each with a chunk per layer; otherwise "per-layer"."""
    keys, values = jobs[0::2], jobs[1::2]
    same = all(j[0].shape == keys[0][0].shape for j in keys) and all(j[0].shape == values[0][0].shape for j in values)
    small = max(keys[0][0].numel(), values[0][0].numel()) <= MAX_CHUNK
    return "stacked" if same and small else "per-layer"


def _stack(targets: list[tuple[Any, Any, Any]]) -> tuple[Any, Any, Any]:
    """Per-layer (x, mu, sigma codes) stacked along a new leading layer dimension (codes per
    scalar where any layer's are)."""
    xs = [t[0] for t in targets]
    x = torch.stack(xs) if xs[0] is not None else None
    mu = torch.stack([t[1] for t in targets])
    codes = [t[2] for t in targets]
    if isinstance(codes[0], torch.Tensor):  # on the GPU (`_coding` with ``on_device``)
        if any(c.shape != codes[0].shape for c in codes):
            codes = [c.expand(t[1].shape) for c, t in zip(codes, targets)]
        return x, mu, torch.stack(codes)
    if any(c.shape != codes[0].shape for c in codes):
        codes = [np.broadcast_to(c, tuple(t[1].shape)) for c, t in zip(codes, targets)]
    return x, mu, np.stack(codes)


def _parallel(fn: Any, jobs: list[Any], threads: int | None) -> list[Any]:
    """``[fn(job) for job in jobs]`` on up to ``threads`` threads (speckv releases the GIL), in
    order; each stream is coded on one thread, so the bytes never depend on ``threads``."""
    n = _api.resolve_threads(threads)
    if n == 1 or len(jobs) <= 1:
        return [fn(job) for job in jobs]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="speckv") as pool:
        return list(pool.map(fn, jobs))


def _block_size(block_size: int | None, tokens: int) -> int:
    """Tokens per container block: ``block_size`` (default DEFAULT_BLOCK_SIZE), never more
    than the cache holds."""
    block = DEFAULT_BLOCK_SIZE if block_size is None else block_size
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block_size: expected a positive int, got {block_size!r}")
    return max(1, min(block, tokens))


def _tokens(job: tuple[Any, Any, Any], start: int, stop: int) -> tuple[Any, Any, Any]:
    """Tokens ``start:stop`` of one layer's (x or None, mu, sigma codes), ``[batch, heads,
    tokens, dim]``; per-channel codes (one token long) broadcast to every block as they are."""
    x, mu, codes = job
    if start == 0 and stop >= mu.shape[2]:
        return job
    if start >= stop:
        start = stop = 0  # an empty run (a layer that holds none of a block's tokens)
    if codes.shape[2] != 1:
        codes = codes[:, :, start:stop]
    return (x[:, :, start:stop] if x is not None else None), mu[:, :, start:stop], codes


def _joint_key(mode: str) -> str:
    """The calibration's joint model for a storage mode: fp8's own; the 16-bit modes share
    bf16's (fp16 values differ from bf16's by less than the residuals)."""
    return "fp8" if mode == "fp8" else "bf16"


def _joint_layers(cal: Calibration) -> set[int]:
    """Layers the calibration has a joint residual model for."""
    if not cal.joint:
        return set()
    return {int(layer) for layer in cal.metadata.get("joint", {}).get("layers", [])}


def _channel_major(job: tuple[Any, Any, Any]) -> tuple[Any, Any, Any]:
    """One layer's (x, mu, codes) ``[batch, heads, tokens, dim]`` as ``[batch, heads, dim,
    tokens]``: the joint model codes a channel's tokens one after another."""
    x, mu, codes = job
    x = x.transpose(-1, -2) if x is not None else None
    codes = codes.transpose(-1, -2) if isinstance(codes, torch.Tensor) else np.swapaxes(codes, -1, -2)
    return x, mu.transpose(-1, -2), codes


def _wanted(layers: list[int] | None, n_layers: int) -> list[int]:
    wanted = list(range(n_layers)) if layers is None else list(layers)
    for layer in wanted:
        if not 0 <= layer < n_layers:
            raise IndexError(f"layer {layer} of {n_layers}")
    return wanted


def _held(kv: KV) -> list[int]:
    """Per layer, the tokens its cache holds (a sliding-window layer: fewer than the prompt);
    K and V of a layer hold the same tokens, and every layer some."""
    held = []
    for layer, (k, v) in enumerate(kv):
        if k.ndim != 4 or v.ndim != 4 or k.shape[2] != v.shape[2] or k.shape[2] < 1:
            raise ValueError(
                f"cache: layer {layer}'s keys {tuple(k.shape)} and values {tuple(v.shape)} are not "
                "[batch, heads, tokens, dim] of the same (non-zero) tokens"
            )
        held.append(int(k.shape[2]))
    return held


def _per_layer_batch(threads: int, blocks: int) -> int:
    """Layers a per-layer container is coded or decoded at a time: enough streams (K and V of
    each block) for every thread, and no more layers' parameters than that."""
    return max(1, -(-2 * threads // blocks))


def _join(blocks: list[Any]) -> Any:
    """One layer's K or V from its blocks' pieces (``[batch, heads, tokens, dim]``)."""
    return blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=2)


def _digest(data: bytes, size: int = 16) -> str:
    return hashlib.blake2b(data, digest_size=size).hexdigest()


def prompt_digest(input_ids: torch.Tensor) -> str:
    ids = input_ids.detach().cpu().to(torch.int64).contiguous()
    return _digest(str(tuple(ids.shape)).encode() + ids.numpy().tobytes())


class SpeculativeCodec:
    """Lossless KV-cache compression for one model, one predictor and one calibration.

    ``model`` is the Hugging Face causal LM whose caches are compressed; ``predictor``
    defaults to ``ModelPrefixPredictor(model)`` (the model's own first layers, then maps from
    the decoded layers: restoring costs less than the model's prefill; see the README's
    "Restore cost" for the others); ``calibration`` comes from ``calibrate`` or ``load``.
    """

    def __init__(
        self,
        model: Any,
        calibration: Calibration | None = None,
        predictor: AnyPredictor | None = None,
        *,
        fingerprint: str | None = None,
        joint: bool | None = None,
        token_scale: _api.TokenScale | None = _api.DEFAULT_TOKEN_SCALE,
        device: str | None = None,
    ) -> None:
        if device not in (None, "cpu", "cuda"):
            raise ValueError(f"device: expected None, 'cpu' or 'cuda', got {device!r}")
        if device == "cuda" and not speckv_cuda.available():
            raise speckv_cuda.CudaUnavailableError("device='cuda': no CUDA device, or no cuda-bindings package")
        # where the coding parameters of CUDA tensors are computed: None uses the CUDA module
        # when it can run (else copies the tensors to the host first), "cpu" always copies,
        # "cuda" insists on the module (same bits either way: cuda/README.md)
        self.device = device
        check_architecture(model)
        self.model = model
        self.predictor: AnyPredictor = predictor if predictor is not None else ModelPrefixPredictor(model)
        # Code with the calibration's joint residual model where it has one (decoders follow
        # what the container says). Default: for whole-prompt predictors (the fp8 copy: 6% /
        # 9% fewer bits, the predictor dominates the restore anyway); for the model's prefix
        # only where the coder is a small share of a recompute (``cost.joint_by_default``:
        # Qwen2.5-0.5B, not the demo model, whose restore it would take to about the
        # prefill's; README, "Joint model").
        if joint is None:
            joint = not is_layerwise(self.predictor) or (
                isinstance(self.predictor, ModelPrefixPredictor) and joint_by_default(text_config(model))
            )
        self.joint = bool(joint)
        # with the joint model: each token's sigmas follow its residuals so far (README,
        # "Joint model"; None codes with the calibrated sigmas); the container records it
        self.token_scale = token_scale
        # per mode and K/V: the joint model's arrays as the core takes them, for the
        # calibration they were made from
        self._joint_source: Calibration | None = None
        self._joint_arrays: dict[tuple[str, int], tuple[int, np.ndarray, np.ndarray]] = {}
        self.fingerprint = fingerprint if fingerprint is not None else model_fingerprint(model)
        self.calibration = calibration
        if calibration is not None:
            calibration.check(self.fingerprint, self.predictor)
            _give_state(self.predictor, calibration)

    # -- calibration -------------------------------------------------------------------
    def calibrate(
        self,
        samples: Iterable[torch.Tensor],
        *,
        source: str = "",
        progress: bool = False,
        producer: Any = None,
        keep_joint_fits: bool = False,
        fp8_scale: float | None = None,
    ) -> Calibration:
        """Measures sigma and fp8 scales on prompts (``input_ids`` of shape ``[1, seq]``), and
        fits a learned predictor's maps (see ``calibrate``)."""
        self.calibration = calibrate(
            self.model,
            self.predictor,
            samples,
            fingerprint=self.fingerprint,
            source=source,
            progress=progress,
            producer=producer,
            keep_joint_fits=keep_joint_fits,
            fp8_scale=fp8_scale,
        )
        return self.calibration

    def save(self, path: str) -> None:
        self._calibration().save(path)

    @classmethod
    def load(cls, path: str, model: Any, predictor: AnyPredictor | None = None) -> SpeculativeCodec:
        """A codec from a saved calibration. Without ``predictor``, the one the calibration was
        made with is rebuilt from its recorded settings (built-in predictors only)."""
        calibration = Calibration.load(path)
        if predictor is None:
            predictor = predictor_from_description(model, calibration.metadata.get("predictor", {}))
        return cls(model, calibration, predictor, fingerprint=model_fingerprint(model))

    def _calibration(self) -> Calibration:
        if self.calibration is None:
            raise ValueError("this codec has no calibration: call calibrate() or load() first")
        return self.calibration

    # -- coding -------------------------------------------------------------------------
    def _on_gpu(self, t: torch.Tensor) -> bool:
        """Whether `t`'s coding parameters are computed on its GPU (``device``)."""
        if not t.is_cuda or self.device == "cpu":
            return False
        return self.device == "cuda" or speckv_cuda.available()

    def _stored(self, mode: str, layer: int, kv: int, true: torch.Tensor, on_device: bool = False) -> torch.Tensor:
        """One layer's K or V as `mode` stores it, on the host (``on_device``: on its GPU)."""
        if self._on_gpu(true):
            if mode == "fp8":
                scale = float(self._calibration().fp8_scales[layer, kv])
                stored = speckv_cuda.fp8_quantize(true, scale)
            else:
                stored = true.to(MODES[mode])  # bf16 / fp16 from their own dtype: exact
            return stored if on_device else stored.cpu()
        true = true.cpu()
        if true.dtype == MODES[mode]:
            # stored already (an engine's fp8 cache, with the calibration's scale): its bits
            return true
        if mode == "fp8":
            return fp8_quantize(true, float(self._calibration().fp8_scales[layer, kv]))
        return true.to(MODES[mode])

    def _mu(
        self, mode: str, layer: int, kv: int, pred: torch.Tensor, joint: bool = False, on_device: bool = False
    ) -> torch.Tensor:
        """The prediction in the stored dtype's units, float32; with the joint model, times its
        per-channel gain (one correctly rounded float32 product per scalar: the same on every
        machine), on the host. On a GPU (``_on_gpu``) the CUDA module computes the same bits and
        only the result crosses (``on_device``: it stays on the GPU, for the GPU coder)."""
        cal = self._calibration()
        fp8_scale = float(cal.fp8_scales[layer, kv]) if mode == "fp8" else None
        gain = None
        if joint and layer in _joint_layers(cal) and "scale" in cal.joint[_joint_key(mode)]:
            heads, dim = pred.shape[1], pred.shape[3]
            gain = cal.joint[_joint_key(mode)]["scale"][layer, kv * heads * dim : (kv + 1) * heads * dim]
            gain = gain.reshape(heads, dim)
        if self._on_gpu(pred):
            if gain is None:
                mu = speckv_cuda.coding_mu(pred, fp8_scale)
                return mu if on_device else mu.cpu()
            g = gain.to(pred.device)
            per_head = [speckv_cuda.coding_mu(pred[:, h : h + 1], fp8_scale, g[h]) for h in range(pred.shape[1])]
            mu = torch.cat(per_head, dim=1)
            return mu if on_device else mu.cpu()
        pred = pred.cpu()
        mu = pred.float() / fp8_scale if fp8_scale is not None else pred.float()
        if gain is not None:
            mu = mu * gain[None, :, None, :]
        return mu

    def _sigma_parts(
        self, mode: str, layer: int, kv: int, joint: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-channel ``[heads, dim]`` sigma (floored) and relative sigma (None if none)."""
        cal = self._calibration()
        sigma, rel = (cal.sigma_fp8, cal.sigma_rel_fp8) if mode == "fp8" else (cal.sigma, cal.sigma_rel)
        if joint and layer in _joint_layers(cal):
            # the conditional sigma given the channels coded before (JointFit)
            sigma = cal.joint[_joint_key(mode)]["sigma"]
        r = rel[layer, kv].float() if rel is not None and bool(rel[layer, kv].any()) else None
        return sigma[layer, kv].clamp(min=SIGMA_FLOOR), r

    def _targets(
        self, mode: str, layer: int, kv: int, true: torch.Tensor | None, pred: torch.Tensor, joint: bool = False
    ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        """(stored tensor or None, mu, sigma as floats) of one layer's K or V in `mode`, for
        measuring (ideal code lengths). What is coded uses ``_coding``'s integer codes: torch's
        vectorised float32 sqrt is not always correctly rounded, so floats computed here could
        differ by an ulp from machine to machine."""
        x = self._stored(mode, layer, kv, true) if true is not None else None
        mu = self._mu(mode, layer, kv, pred)
        s, r = self._sigma_parts(mode, layer, kv, joint)
        sigma = s[None, :, None, :]
        if r is not None:
            sigma = torch.sqrt(sigma * sigma + (r[None, :, None, :] * mu) ** 2)
        return x, mu, sigma

    def _coding(
        self,
        mode: str,
        layer: int,
        kv: int,
        true: torch.Tensor | None,
        pred: torch.Tensor,
        joint: bool = False,
        on_device: bool = False,
    ) -> tuple[torch.Tensor | None, torch.Tensor, Any]:
        """(stored tensor or None, mu, sigma codes) of one layer's K or V in `mode`: exactly
        what encoder and decoder code with, on any machine. ``on_device``: all three stay on
        the GPU the cache and prediction are on (for the GPU coder)."""
        x = self._stored(mode, layer, kv, true, on_device) if true is not None else None
        mu = self._mu(mode, layer, kv, pred, joint, on_device)
        return x, mu, self._sigma_codes(mode, layer, kv, mu, joint, on_device)

    def _sigma_codes(
        self, mode: str, layer: int, kv: int, mu: torch.Tensor, joint: bool = False, on_device: bool = False
    ) -> Any:
        """Sigma codes: per channel (``[1, heads, 1, dim]``, to broadcast), or per scalar for a
        relative sigma, ``sqrt(s^2 + (r mu)^2)`` computed in Rust with correctly rounded float32
        steps (the same codes on every machine). ``on_device``: a tensor where ``mu`` is (the
        per-scalar codes from the CUDA module's kernel for a GPU's ``mu``, the same integers)."""
        s, r = self._sigma_parts(mode, layer, kv, joint)
        if on_device and r is not None and mu.is_cuda:
            parts = [
                speckv_cuda.relative_sigma_codes(mu[:, h : h + 1], s[h].to(mu.device), r[h].to(mu.device))
                for h in range(mu.shape[1])
            ]
            return torch.cat(parts, dim=1)
        if on_device:  # per channel; or a host mu (tests)
            return torch.from_numpy(self._sigma_codes(mode, layer, kv, mu, joint)).to(mu.device)
        if r is None:
            return _api.sigma_codes(s[None, :, None, :])
        _, h, t, d = mu.shape
        m, sf, rf = (np.ascontiguousarray(a.numpy()).reshape(-1) for a in (mu, s, r))
        return _speckv.relative_sigma_codes(m, sf, rf, h, t, d).reshape(mu.shape)

    def _observed(self, mode: str, layer: int, which: int, stored: torch.Tensor) -> torch.Tensor:
        """What a layer-wise predictor observes of a stored tensor: its values in cache units
        (fp8 times its scale), float32. Encoder and decoder compute it from the same bits."""
        if mode == "fp8":
            return stored.float() * float(self._calibration().fp8_scales[layer, which])
        return stored.float()

    def compress(
        self,
        cache: Any,
        input_ids: torch.Tensor,
        dtype: str = "bf16",
        *,
        threads: int | None = None,
        model: _api.Model = "exact",
        block_size: int | None = None,
    ) -> bytes:
        """Compresses ``cache`` (the model's cache of ``input_ids``) stored as ``dtype``:
        ``"bf16"``, ``"fp16"``, or ``"fp8"`` (e4m3 with one fp32 scale per layer and K/V, as
        vLLM stores it). Lossless for the cache in that storage dtype. ``block_size``: tokens
        per block of the container (default ``DEFAULT_BLOCK_SIZE``; ``speckv.info`` lists
        them)."""
        if dtype not in MODES:
            raise ValueError(f"dtype: expected one of {sorted(MODES)}, got {dtype!r}")
        kv = self._check_cache(cache)
        return self._encode(kv, input_ids, self._predictions(kv, input_ids, dtype), dtype, threads, model, block_size)

    def prediction(self, cache: Any, input_ids: torch.Tensor, dtype: str = "bf16", run: Any = None) -> KV:
        """What the predictor predicts for ``cache`` (the model's cache of ``input_ids``) stored
        as ``dtype``, per layer ``(K, V)`` in cache units: exactly the ``mu`` that ``compress``
        codes against (a layer-wise predictor observes the stored tensors as it goes; ``run``:
        a walk already started, e.g. on the next block of a prompt)."""
        return list(self._predictions(extract_kv(cache), input_ids, dtype, run))

    def _predictions(
        self, kv: KV, input_ids: torch.Tensor, dtype: str, run: Any = None
    ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """``prediction`` layer by layer, as a layer-wise predictor's walk makes them (what
        ``compress`` codes as they come, holding one layer's at a time)."""
        if not is_layerwise(self.predictor):
            yield from self.predictor.predict(input_ids)
            return
        run = run if run is not None else self.predictor.start(input_ids)

        def observed(layer: int, which: int, t: torch.Tensor) -> torch.Tensor:
            return self._observed(dtype, layer, which, self._stored(dtype, layer, which, t))

        yield from walk_layers(run, kv, observed, _quiet_torch)

    def _check_cache(self, cache: Any) -> KV:
        cal = self._calibration()
        kv = extract_kv(cache)
        if len(kv) != cal.n_layers:
            raise ValueError(f"cache: {len(kv)} layers, the calibration has {cal.n_layers}")
        _held(kv)
        return kv

    def compress_predicted(
        self,
        cache: Any,
        input_ids: torch.Tensor,
        prediction: list[tuple[torch.Tensor, torch.Tensor]],
        dtype: str = "bf16",
        *,
        threads: int | None = None,
        model: _api.Model = "exact",
        block_size: int | None = None,
    ) -> bytes:
        """``compress`` with the predictor's output already computed (``prediction()``; for a
        whole-prompt predictor, its ``predict(input_ids)``, the same for every dtype)."""
        if dtype not in MODES:
            raise ValueError(f"dtype: expected one of {sorted(MODES)}, got {dtype!r}")
        kv = self._check_cache(cache)
        return self._encode(kv, input_ids, prediction, dtype, threads, model, block_size)

    def _encode(
        self,
        kv: KV,
        input_ids: torch.Tensor,
        prediction: Iterable[tuple[torch.Tensor, torch.Tensor]],
        dtype: str,
        threads: int | None,
        model: _api.Model,
        block_size: int | None = None,
    ) -> bytes:
        """The container of ``kv`` coded against ``prediction`` (per layer ``(K, V)``, in
        cache units), consumed layer by layer: a few layers' coding parameters are held at a
        time, never the whole cache's. A block's stacked stream is coded a group of layers
        (whole chunks) at a time and the groups' streams joined (``speckv.join_streams``:
        the bytes of one call over every layer)."""
        cal = self._calibration()
        layout = _layout([(t, None, None) for pair in kv for t in pair])
        joint = self.joint and bool(_joint_layers(cal))
        held = _held(kv)
        tokens = max(held)
        block = _block_size(block_size, tokens)
        starts = list(range(0, tokens, block))
        layerwise = is_layerwise(self.predictor)
        joint_mode = dtype if joint else None
        n_layers = len(kv)
        layers = iter(prediction)
        first = next(layers, None)
        if first is None:
            raise ValueError(f"prediction: no layers, the cache has {n_layers}")
        # the GPU coder (speckv.hf.cuda.encode) where cache and prediction are on a GPU the CUDA
        # module runs on: only coded bytes cross to the host. The exact model (the fast one
        # codes on the host); the bytes are the host's either way.
        on_device = layout == "stacked" and model == "exact" and self._codes_on_gpu(kv, [first])
        device = kv[0][0].device
        if layout == "stacked":
            # whole chunks per group: a whole-prompt predictor's chunks hold LAYERS_PER_CHUNK
            # layers (or one), a layer-wise one's a layer (or half)
            group = 1 if layerwise else LAYERS_PER_CHUNK
        else:
            # enough streams at once for every thread
            group = _per_layer_batch(_api.resolve_threads(threads), len(starts))
        # per block: stacked, K's and V's streams of each group; per layer, every stream
        streams: list[list[Any]] = [[[], []] if layout == "stacked" else [] for _ in starts]
        pending: list[tuple[int, Any, Any]] = []
        count = 0
        for layer, (pk, pv) in enumerate(itertools.chain([first], layers)):
            if layer >= n_layers:
                raise ValueError(f"prediction: more layers than the cache's {n_layers}")
            jobs = []
            for which, (t, p) in enumerate(((kv[layer][0], pk), (kv[layer][1], pv))):
                p = last_tokens(p, held[layer], layer)
                if tuple(t.shape) != tuple(p.shape):
                    raise ValueError(f"cache: layer {layer} has shape {tuple(t.shape)}, prediction {tuple(p.shape)}")
                if on_device and p.device != device:
                    p = p.to(device)
                jobs.append(self._coding(dtype, layer, which, t, p, joint, on_device))
            pending.append((layer, jobs[0], jobs[1]))
            count += 1
            if len(pending) < group and layer + 1 < n_layers:
                continue
            if layout == "stacked":
                for b, start in enumerate(starts):
                    part = [_tokens(job, start, start + block) for _, k, v in pending for job in (k, v)]
                    first_layer = pending[0][0]
                    coded = self._encode_stacked(
                        part,
                        range(first_layer, first_layer + len(pending)),
                        layerwise,
                        threads,
                        model,
                        joint_mode,
                        on_device,
                    )
                    streams[b][0].append(coded[0])
                    streams[b][1].append(coded[1])
            else:
                # per layer: the block's tokens that each layer holds (none: no stream)
                pieces = []
                for b, start in enumerate(starts):
                    for lay, k, v in pending:
                        lo, hi = container.held_range(start, min(start + block, tokens), tokens, held[lay])
                        pieces.append((b, lay, _tokens(k, lo, hi), _tokens(v, lo, hi)))
                coded = _parallel(lambda p: self._encode_layer(p[1], p[2], p[3], joint_mode, model), pieces, threads)
                for (b, _, _, _), pair in zip(pieces, coded):
                    streams[b].extend(pair)
            pending = []
        if count != n_layers:
            raise ValueError(f"prediction: {count} layers, the cache has {n_layers}")
        if layout == "stacked":
            blocks = []
            for kv_streams in streams:  # each group's streams let go once joined
                blocks.append([_api.join_streams(kv_streams[0]), _api.join_streams(kv_streams[1])])
                kv_streams.clear()
        else:
            blocks = streams
        metadata: dict[str, Any] = {
            "mode": dtype,
            "model": self.fingerprint,
            "calibration": cal.digest(),
            "predictor": describe(self.predictor),
            "prompt": prompt_digest(input_ids),
        }
        if joint:
            metadata["joint"] = True
        return container.pack(metadata, layout, n_layers, block, tokens, blocks, held)

    def _codes_on_gpu(self, kv: KV, prediction: KV) -> bool:
        """Whether the GPU coder (``speckv.hf.cuda.encode``) codes this cache: it and its
        prediction are on one GPU the CUDA module runs on (``device``)."""
        tensors = [t for pair in (*kv, *prediction) for t in pair]
        return all(t.is_cuda and t.device == tensors[0].device for t in tensors) and self._on_gpu(tensors[0])

    def _encode_stacked(
        self,
        jobs: list[Any],
        layers: range,
        layerwise: bool,
        threads: int | None,
        model: _api.Model,
        joint_mode: str | None,
        on_device: bool = False,
    ) -> list[bytes]:
        """A block's keys, then its values, of ``layers`` (``jobs``: their K, V, K, V, ...),
        each one stream of those layers, which ``_encode`` joins with the other groups' into
        one stream of every layer: a stream per layer would cost ~0.5% of an fp8 cache in
        headers, a chunk per layer ~0.07%. Whole-prompt predictors: LAYERS_PER_CHUNK layers a
        chunk; a layer-wise predictor decodes layer by layer: CHUNKS_PER_LAYER chunks a
        layer, so one layer's decode still spreads over cores. With the joint model
        (``joint_mode``: the storage mode) each layer is stored channel-major and coded as a
        whole (its channels follow each other), the values conditioned on the keys'
        residuals. ``on_device``: the jobs' tensors are on a GPU and the CUDA module codes
        them there."""
        layer = [jobs[which][0].numel() for which in (0, 1)]
        per_chunk = 1 if layerwise else max(1, min(LAYERS_PER_CHUNK, MAX_CHUNK // max(layer)))
        split = layerwise and joint_mode is None and all(n % CHUNKS_PER_LAYER == 0 for n in layer)
        per_layer = CHUNKS_PER_LAYER if split else 1
        streams = []
        outside = None
        for which in (0, 1):
            mine = jobs[which::2]
            if joint_mode is not None:
                mine = [_channel_major(job) for job in mine]
            x, mu, codes = _stack(mine)
            size = per_chunk * layer[which] // per_layer
            joint = None
            if joint_mode is not None:
                joint = self._joint_model(joint_mode, which, int(mu.shape[-1]), outside, layers)
            if on_device:  # the GPU coder, the same bytes
                data, residuals = speckv_cuda.encode_joint(x, mu, codes, joint, chunk_size=size)
                streams.append(data)
                if joint_mode is not None and which == 0:  # the values condition on these, on the GPU
                    outside = residuals.reshape(mu.shape[0], -1, mu.shape[-1])
                continue
            if joint_mode is not None and which == 0:
                outside = _api.residuals(x, mu).reshape(mu.shape[0], -1, mu.shape[-1])
            streams.append(
                _api.encode(x, mu, sigma_codes=codes, threads=threads, chunk_size=size, model=model, joint=joint)
            )
        return streams

    def _encode_layer(
        self, layer: int, k: Any, v: Any, joint_mode: str | None, model: _api.Model
    ) -> tuple[bytes, bytes]:
        """A block's stream of one layer's K and of its V (per-layer layout; ``b""`` where the
        layer holds none of the block's tokens). With the joint model (``joint_mode``: the
        storage mode) where the calibration has one for the layer, both channel-major, each
        one chunk, V conditioned on K's residuals; else each scalar on its own."""
        if k[1].shape[2] == 0:
            return b"", b""
        if joint_mode is None or layer not in _joint_layers(self._calibration()):
            return (
                _api.encode(k[0], k[1], sigma_codes=k[2], threads=1, model=model),
                _api.encode(v[0], v[1], sigma_codes=v[2], threads=1, model=model),
            )
        out, outside = [], None
        for which, job in enumerate((k, v)):
            x, mu, codes = _channel_major(job)
            tokens = int(mu.shape[-1])
            joint = self._joint_model(joint_mode, which, tokens, outside, range(layer, layer + 1))
            out.append(
                _api.encode(x, mu, sigma_codes=codes, threads=1, chunk_size=mu.numel(), model=model, joint=joint)
            )
            outside = _api.residuals(x, mu).reshape(1, -1, tokens)
        return out[0], out[1]

    def _decode_layer(
        self, c: container.Container, b: int, layer: int, targets: Any, joint: bool, threads: int = 1
    ) -> list[torch.Tensor]:
        """Block ``b``'s K and V of one layer (per-layer layout; ``targets``: the layer's K
        and V ``(None, mu, sigma codes)``, cut to the block here); empty where the layer holds
        none of the block's tokens. See ``_encode_layer``."""
        outside: dict[int, np.ndarray] = {}
        pieces = [self._decode_piece(c, b, layer, which, t, joint, outside, threads) for which, t in enumerate(targets)]
        return [p for p in pieces if p is not None]

    def _decode_piece(
        self,
        c: container.Container,
        b: int,
        layer: int,
        which: int,
        target: Any,
        joint: bool,
        outside: dict[int, np.ndarray],
        threads: int,
    ) -> torch.Tensor | None:
        """Block ``b``'s K (``which=0``) or V of one layer of a per-layer container
        (``target``: the layer's ``(None, mu, sigma codes)``, cut to the block here); None
        where the layer holds none of the block's tokens. A joint layer is channel-major, its
        V given the block's K residuals, which its K leaves in ``outside[b]``."""
        lo, hi = c.layer_range(b, layer)
        if lo == hi:
            return None
        data = c.stream(b, layer, which).data
        job = _tokens(target, lo, hi)
        if not (joint and layer in _joint_layers(self._calibration())):
            return _api.decode(data, job[1], sigma_codes=job[2], threads=threads)
        _, mu, codes = _channel_major(job)
        given = outside.get(b) if which else None
        model = self._joint_model(c.metadata["mode"], which, hi - lo, given, range(layer, layer + 1))
        got = _api.decode(data, mu, sigma_codes=codes, threads=threads, joint=model)
        if which == 0:
            outside[b] = _api.residuals(got, mu).reshape(1, -1, hi - lo)
        return got.transpose(-1, -2)

    def _joint_model(self, mode: str, which: int, tokens: int, outside: Any, layers: range) -> _api.Joint:
        """The joint model of a block's K (``which=0``) or V stream of ``layers``: the
        calibration's coefficients of those layers (zero for layers without one), V
        conditioned on the block's K residuals of the same layers ``outside`` (``[layers,
        channels, tokens]``)."""
        cal = self._calibration()
        if self._joint_source is not cal:
            # another calibration (holding it keeps its id from being reused by a new one)
            self._joint_source, self._joint_arrays = cal, {}
        key = (_joint_key(mode), which)
        if key not in self._joint_arrays:
            # contiguous float32 copies made once: a decode asks for them per layer and block
            m = cal.joint[_joint_key(mode)]
            c = m["coef"].shape[1] // 2
            rows = slice(0, c) if which == 0 else slice(c, 2 * c)
            cols = slice(0, c) if which == 0 else slice(0, 2 * c)
            coef = np.ascontiguousarray(m["coef"][:, rows, cols].numpy(), dtype=np.float32)
            offset = np.ascontiguousarray(m["offset"][:, rows].numpy(), dtype=np.float32)
            self._joint_arrays[key] = (c, coef, offset)
        c, coef, offset = self._joint_arrays[key]
        coef, offset = coef[layers.start : layers.stop], offset[layers.start : layers.stop]
        return _api.Joint(c, tokens, coef, offset, outside if which == 1 else None, self.token_scale)

    @staticmethod
    def read_header(data: bytes) -> container.Container:
        """Validates the container's header and stream index (``speckv.container.parse``);
        the streams' payloads are checked as they are decoded."""
        c = container.parse(data)
        mode = c.metadata.get("mode")
        if not isinstance(mode, str) or mode not in MODES:  # JSON: could be a list, unhashable
            raise CorruptStreamError(f"cache container: unknown storage mode {mode!r}")
        return c

    def _check(self, header: dict[str, Any], input_ids: torch.Tensor) -> None:
        """Refuses a container made with another model, calibration, predictor or prompt
        (``header``: its metadata)."""
        cal = self._calibration()
        for key, mine, what in (
            ("model", self.fingerprint, "model"),
            ("calibration", cal.digest(), "calibration"),
            ("prompt", prompt_digest(input_ids), "prompt (input_ids)"),
        ):
            if header.get(key) != mine:
                raise CalibrationMismatchError(f"the stream was made with another {what}")
        if header.get("predictor") != describe(self.predictor):
            raise CalibrationMismatchError(
                f"the stream was made with predictor {header.get('predictor')}, not {describe(self.predictor)}"
            )

    def _decode(
        self,
        data: bytes,
        input_ids: torch.Tensor,
        layers: list[int] | None,
        threads: int | None,
        prediction: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
        pipeline: bool | None = None,
        run: Any = None,
    ) -> tuple[container.Container, dict[int, tuple[Any, Any]]]:
        c = self.read_header(data)
        self._check(c.metadata, input_ids)
        wanted = _wanted(layers, c.layers)
        if is_layerwise(self.predictor):
            if prediction is not None:
                raise TypeError("prediction=: a layer-wise predictor runs inside decompress()")
            return c, self._decode_walk(c, input_ids, wanted, threads, pipeline, run)
        mode = c.metadata["mode"]
        joint = self._reads_joint(c)
        pred = prediction if prediction is not None else self.predictor.predict(input_ids)
        if len(pred) != c.layers:
            raise ValueError(f"prediction: {len(pred)} layers, the container has {c.layers}")
        n = _api.resolve_threads(threads)

        def target(layer: int, which: int) -> Any:
            return self._coding(mode, layer, which, None, last_tokens(pred[layer][which], c.held(layer), layer), joint)

        parts: dict[int, list[list[Any]]] = {layer: [[], []] for layer in wanted}
        # torch on one thread while the coder's threads decode: the small tensor operations
        # between decode calls would otherwise wake torch's OpenMP workers, which then spin
        # for milliseconds on the cores the coder runs on (measured: 1.2-1.3x slower restores)
        with fixed_threads(1):
            self._decode_whole(c, wanted, layers, threads, n, target, joint, parts)
        return c, {layer: (_join(k), _join(v)) for layer, (k, v) in parts.items()}

    def _decode_whole(
        self,
        c: container.Container,
        wanted: list[int],
        layers: list[int] | None,
        threads: int | None,
        n: int,
        target: Callable[[int, int], Any],
        joint: bool,
        parts: dict[int, list[list[Any]]],
    ) -> None:
        """``_decode``'s whole-prompt walk: every wanted layer's pieces into ``parts``."""
        # a few layers at a time: their coding parameters, not the whole cache's
        if c.layout == "stacked":
            # whole chunks of every block's streams; all layers: enough chunks for the threads
            group = math.lcm(*(s.layers_per_chunk for block in c.blocks for s in block if s is not None))
            span = group * (n if layers is None else 1)
            for first in sorted({layer // span * span for layer in wanted}):
                stop = min(first + span, c.layers)
                targets = [[target(layer, which) for layer in range(first, stop)] for which in (0, 1)]
                outside: dict[int, np.ndarray] = {}
                for b in range(len(c.blocks)):
                    for which in (0, 1):
                        got = self._decode_stacked(c, b, which, first, targets[which], joint, outside, n)
                        for layer, piece in zip(range(first, stop), got):
                            if layer in parts:
                                parts[layer][which].append(piece)
        else:
            span = _per_layer_batch(n, len(c.blocks))
            for i in range(0, len(wanted), span):
                jobs = []
                for layer in wanted[i : i + span]:
                    pair = [target(layer, which) for which in (0, 1)]
                    jobs += [(b, layer, pair) for b in range(len(c.blocks))]
                out = _parallel(lambda job: self._decode_layer(c, job[0], job[1], job[2], joint), jobs, threads)
                for (_, layer, _), got in zip(jobs, out):
                    for which, piece in enumerate(got):
                        parts[layer][which].append(piece)

    def _decode_stacked(
        self,
        c: container.Container,
        b: int,
        which: int,
        first: int,
        targets: list[Any],
        joint: bool,
        outside: dict[int, np.ndarray],
        threads: int,
    ) -> list[torch.Tensor]:
        """Block ``b``'s K (``which=0``) or V of layers ``first, first + 1, ...`` of a stacked
        container, one ``[batch, heads, tokens, dim]`` tensor per target (the layers' ``(None,
        mu, sigma codes)`` over all their tokens, cut to the block here). Only those layers'
        chunks are read: cut out of the block's stream (``speckv.cut_stream``) and decoded
        against these layers' parameters alone. A jointly coded V reads its layers' K
        residuals in ``outside[b]``, which K's call leaves there."""
        stop = first + len(targets)
        lo, hi = c.token_range(b)
        part = [_tokens(t, lo, hi) for t in targets]
        if joint:
            part = [_channel_major(t) for t in part]
        _, mu, codes = _stack(part)
        stream = c.stream(b, first, which)
        (start, _), skip = stream.chunks_of(first)
        (_, end), _ = stream.chunks_of(stop - 1)
        try:
            data = _api.cut_stream(stream.data, (start, end)) if not skip else b""
            shape = _speckv.info(np.frombuffer(data, dtype=np.uint8))["shape"] if data else None
        except ValueError:
            shape = None
        if shape != list(mu.shape):
            raise CorruptStreamError(
                f"cache container: block {b}'s stream does not hold layers {first}..{stop - 1} in whole chunks"
            )
        model = None
        if joint:
            model = self._joint_model(c.metadata["mode"], which, hi - lo, outside.get(b), range(first, stop))
        got = _api.decode(data, mu, sigma_codes=codes, threads=threads, joint=model)
        if joint:
            if which == 0:
                outside[b] = _api.residuals(got, mu).reshape(len(targets), -1, hi - lo)
            got = got.transpose(-1, -2)
        return list(got)

    def _reads_joint(self, c: container.Container) -> bool:
        """Whether the container was coded with the joint model (then the calibration, already
        checked to be the encoder's, has it)."""
        joint = bool(c.metadata.get("joint"))
        if joint and not _joint_layers(self._calibration()):
            raise CorruptStreamError("cache container: joint coding without a joint calibration")
        return joint

    def _decode_walk(
        self,
        c: container.Container,
        input_ids: torch.Tensor,
        wanted: list[int],
        threads: int | None,
        pipeline: bool | None,
        run: Any = None,
    ) -> dict[int, tuple[Any, Any]]:
        """Decodes a layer-wise predictor's container in the walk's order (see ``layerwise``),
        up to the last layer asked for, block by block within each layer.

        The layers a run predicts without looking at decoded ones (``independent_layers``:
        the model's own prefix) are decoded either as they are made, overlapped with the
        predictor's forward pass (``pipeline=True``; pays where spare cores exist), or once
        the forward pass ends, a few layers per call on every core (``pipeline=False``: on a
        machine whose cores the forward pass already uses, sharing them slows it more than
        the decode gains). ``None`` picks overlap when the machine has more cores than the
        predictor's threads. Either way, the same bits; only a few layers' coding
        parameters are held at a time."""
        mode = c.metadata["mode"]
        stacked = c.layout == "stacked"
        if stacked and any(s is None or s.layers_per_chunk != 1 for block in c.blocks for s in block):
            raise CorruptStreamError("cache container: a layer-wise stream needs whole chunks per layer")
        n_threads = _api.resolve_threads(threads)
        if pipeline is None:
            pipeline = (os.cpu_count() or 1) > int(getattr(self.predictor, "threads", 1))
        out: dict[int, list[Any]] = {}
        upto = max(wanted) + 1
        joint = self._reads_joint(c)
        # joint: per block, the keys' residuals of the layers being decoded (the values'
        # outside channels)
        outside: dict[int, np.ndarray] = {}

        def prepare(layer: int, which: int, pred: torch.Tensor) -> Any:
            return self._coding(mode, layer, which, None, last_tokens(pred, c.held(layer), layer), joint)

        def decode(first: int, which: int, targets: list[Any], n: int) -> list[Any]:
            """K or V of layers first.., every block of each joined."""

            def block(b: int, n: int) -> list[Any]:
                if stacked:
                    return self._decode_stacked(c, b, which, first, targets, joint, outside, n)
                piece = self._decode_piece(c, b, first, which, targets[0], joint, outside, n)
                return [] if piece is None else [piece]

            if joint and len(c.blocks) > 1 and n > 1:
                # a jointly coded layer is one chunk, which one thread decodes: spread the
                # token blocks over the threads instead (a block's values read only its own
                # keys' residuals)
                share = max(1, n // len(c.blocks))
                blocks = _parallel(lambda b: block(b, share), list(range(len(c.blocks))), n)
            else:
                blocks = [block(b, n) for b in range(len(c.blocks))]
            return [_join([blk[i] for blk in blocks if blk]) for i in range(len(targets))]

        if run is None:
            predictor = self.predictor
            assert is_layerwise(predictor)  # only layer-wise predictors' streams are walked
            run = predictor.start(input_ids)
        quiet = contextlib.ExitStack()
        try:
            start = 0
            independent = int(getattr(run, "independent_layers", 0))
            free = min(independent, upto) if stacked and not pipeline else 0
            if free:
                wait = getattr(run, "wait", None)
                if callable(wait):
                    wait()  # the forward pass first: it has the cores
                # a few layers a call: chunks enough for every thread
                per_layer = min(s.chunks_per_layer for block in c.blocks for s in block if s is not None)
                span = max(1, -(-n_threads // per_layer))
                for first in range(0, free, span):
                    layers = range(first, min(first + span, free))
                    for which in (0, 1):
                        targets = [prepare(layer, which, run.predict(layer, which)) for layer in layers]
                        for layer, value in zip(layers, decode(first, which, targets, n_threads)):
                            out.setdefault(layer, []).append(value)
                    for layer in layers:
                        for which in (0, 1):
                            run.observe(layer, which, self._observed(mode, layer, which, out[layer][which]))
                start = free
            for layer in range(start, upto):
                if layer == independent:
                    quiet.enter_context(_quiet_torch(run))
                out[layer] = []
                for which in (0, 1):
                    target = prepare(layer, which, run.predict(layer, which))
                    value = decode(layer, which, [target], n_threads)[0]
                    out[layer].append(value.reshape(target[1].shape))
                    run.observe(layer, which, self._observed(mode, layer, which, out[layer][which]))
        finally:
            quiet.close()
            run.close()
        return {layer: (out[layer][0], out[layer][1]) for layer in wanted}

    def decompress(
        self,
        data: bytes,
        input_ids: torch.Tensor,
        *,
        threads: int | None = None,
        dequantize: bool = True,
        prediction: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
        pipeline: bool | None = None,
        device: str | torch.device | None = None,
    ) -> Any:
        """The exact cache back as a ``DynamicCache``. In fp8 mode it holds the fp8 tensors
        dequantized (``fp8 * scale`` in bfloat16) unless ``dequantize=False``, which returns the
        stored float8_e4m3fn tensors themselves. ``prediction`` skips running the predictor
        when its output for ``input_ids`` is at hand (whole-prompt predictors). ``pipeline``:
        for a layer-wise predictor, whether decoding overlaps its forward pass (see
        ``_decode_walk``; default: where spare cores exist). ``device``: where the cache's
        tensors go (default: ``input_ids``' device, so a GPU prompt gets a GPU cache; decoding
        itself runs on the host)."""
        target = _restore_device(device, input_ids)
        c, layers = self._decode(data, input_ids, None, threads, prediction, pipeline)
        kv = [(k.to(target), v.to(target)) for k, v in (layers[i] for i in range(c.layers))]
        if c.metadata["mode"] == "fp8" and dequantize:
            scales = self._calibration().fp8_scales
            kv = [_dequantize(k, v, float(scales[i, 0]), float(scales[i, 1])) for i, (k, v) in enumerate(kv)]
        return self._build(kv, input_ids)

    def _build(self, kv: KV, input_ids: torch.Tensor) -> Any:
        """The restored cache as the model would have made it: for a model with sliding-window
        layers, its kind of layer each (``build_cache``)."""
        config = text_config(self.model)
        windowed = any(w is not None for w in layer_windows(config))
        return build_cache(kv, config, int(input_ids.shape[-1])) if windowed else build_cache(kv)

    def decompress_layer(
        self,
        data: bytes,
        input_ids: torch.Tensor,
        layer: int,
        *,
        threads: int | None = None,
        pipeline: bool | None = None,
        device: str | torch.device | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's stored ``(K, V)`` without decoding the others (a layer-wise predictor
        needs the layers below: those are decoded too, but not the ones above), on ``device``
        (default: ``input_ids``' device)."""
        target = _restore_device(device, input_ids)
        _, layers = self._decode(data, input_ids, [layer], threads, None, pipeline)
        k, v = layers[layer]
        return k.to(target), v.to(target)


def predictor_from_description(model: Any, description: dict[str, Any]) -> Any:
    """The built-in predictor whose ``describe()`` is ``description`` (as recorded in
    calibrations and streams); ``CalibrationMismatchError`` for others."""
    name = description.get("name")
    if name == "model-prefix":
        chunk = int(description.get("prefill_chunk", PREFILL_CHUNK))
        return ModelPrefixPredictor(
            model,
            int(description["layers"]),
            threads=int(description["threads"]),
            prefill_chunk=chunk,
            hidden="hidden" in description,
        )
    if name == "fp8":
        scale = str(description.get("scale", ""))
        block = None if scale.startswith("per-tensor") else int(scale.split("x")[0])
        threads = description.get("threads", 1)
        dtype = getattr(torch, str(description.get("compute_dtype", "float32")))
        # made on a GPU: on one here if there is one, else on the CPU (the prediction
        # fingerprint then says whether the bits agree)
        device = "cuda" if "device" in description and torch.cuda.is_available() else None
        threads = "all" if threads == "any" else int(threads)
        return Fp8Predictor(model, block_size=block, threads=threads, dtype=dtype, device=device)
    if name == "channel-stats":
        return ChannelStatsPredictor()  # its means come from the calibration's state
    raise CalibrationMismatchError(f"the calibration's predictor {description} is not built in: pass predictor=")


@contextlib.contextmanager
def _quiet_torch(run: Any) -> Iterator[None]:
    """The walk past a run's independent layers (its maps, one layer at a time): torch on one
    thread once the run's background work is over. A layer's products are small; with more
    threads, torch's workers keep spinning on the cores the decoder's threads need next
    (measured: a layer's decode 1.3 ms instead of 2.4). Thread counts are process-wide in
    torch, so this waits for the forward pass to end first."""
    wait = getattr(run, "wait", None)
    if callable(wait):
        wait()
    with fixed_threads(1):
        yield


def _restore_device(device: str | torch.device | None, input_ids: Any) -> torch.device:
    """Where restored tensors go: ``device``, else the prompt's device (checked before any
    decoding, so a bad name costs nothing)."""
    if device is None:
        return input_ids.device if isinstance(input_ids, torch.Tensor) else torch.device("cpu")
    try:
        target = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"device: expected a torch device such as 'cpu' or 'cuda:0', got {device!r}") from e
    if target.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r}, but there is no CUDA device here")
    return target


def _give_state(predictor: Any, calibration: Calibration) -> None:
    """Hands a learned predictor what calibration fitted for it."""
    load = getattr(predictor, "load_state_dict", None)
    if callable(load):
        load(calibration.predictor_state)


def _dequantize(k: torch.Tensor, v: torch.Tensor, k_scale: float, v_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 values times their scale, in bfloat16 (what attention reads from a vLLM fp8 cache)."""
    return (k.float() * k_scale).to(torch.bfloat16), (v.float() * v_scale).to(torch.bfloat16)


__all__ = ["SpeculativeCodec", "PredictionMismatchError", "prompt_digest"]
