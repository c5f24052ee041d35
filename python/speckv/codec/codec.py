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

The codec holds what a user chooses (model, predictor, calibration, joint model, device) and
delegates the work: ``identity`` (what a container records and the checks),
``plan`` (a container's coding plan: each layer's stored tensor, ``mu`` and sigma codes,
through the host/GPU seam of ``kernels``), ``encode_walk`` and ``decode_walk`` (the cache to
streams and back, reading the plan),
``block_layout`` and ``target`` (the container's layout and the cuts of a layer),
``calibration`` and ``from_description`` (calibrating, and rebuilding a recorded predictor).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from .. import _api, container
from .. import cuda as speckv_cuda
from .._speckv import PredictionMismatchError
from ..models.architecture import check_architecture, layer_windows, text_config
from ..models.cache import KV, build_cache, extract_kv, restore_device
from ..predictors.base import AnyPredictor, ChannelStatsPredictor
from ..predictors.calibration import Calibration, calibrate, model_fingerprint
from ..predictors.cost import joint_by_default
from ..predictors.early_exit import ModelPrefixPredictor
from ..predictors.layerwise import is_layerwise, overlap_pays, walk_layers
from . import identity
from .block_layout import held, wanted
from .decode_walk import decode_layerwise, decode_whole, quiet_torch
from .encode_walk import encode_container
from .from_description import predictor_from_description
from .modes import MODES
from .modes import dequantize as dequantize_fp8
from .plan import CodingParams, ParamsCache

prompt_digest = identity.prompt_digest


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
        # the coding parameters, rebuilt when the calibration, device or token scale change
        self._params = ParamsCache()
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
        self.require_calibration().save(path)

    @classmethod
    def load(cls, path: str, model: Any, predictor: AnyPredictor | None = None) -> SpeculativeCodec:
        """A codec from a saved calibration. Without ``predictor``, the one the calibration was
        made with is rebuilt from its recorded settings (built-in predictors only)."""
        calibration = Calibration.load(path)
        if predictor is None:
            predictor = predictor_from_description(model, calibration.metadata.get("predictor", {}))
        return cls(model, calibration, predictor, fingerprint=model_fingerprint(model))

    def require_calibration(self) -> Calibration:
        """The codec's calibration; ``ValueError`` where it has none yet."""
        if self.calibration is None:
            raise ValueError("this codec has no calibration: call calibrate() or load() first")
        return self.calibration

    @property
    def params(self) -> CodingParams:
        """The coding parameters of the current calibration (``plan``; ``ParamsCache``)."""
        return self._params.get(self.require_calibration(), self.device, self.token_scale)

    # -- coding -------------------------------------------------------------------------
    def compress(
        self,
        cache: Any,
        input_ids: torch.Tensor,
        dtype: str = "bf16",
        *,
        threads: int | None = None,
        model: _api.Model | None = None,
        block_size: int | None = None,
    ) -> bytes:
        """Compresses ``cache`` (the model's cache of ``input_ids``) stored as ``dtype``:
        ``"bf16"``, ``"fp16"``, or ``"fp8"`` (e4m3 with one fp32 scale per layer and K/V, as
        vLLM stores it). Lossless for the cache in that storage dtype. ``block_size``: tokens
        per block of the container (default ``DEFAULT_BLOCK_SIZE``; ``speckv.info`` lists
        them). ``model``: how residuals are coded (``speckv.encode``'s; default
        ``restore_model``'s pick for this predictor and dtype)."""
        if dtype not in MODES:
            raise ValueError(f"dtype: expected one of {sorted(MODES)}, got {dtype!r}")
        kv = self.check_cache(cache)
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
        wait = getattr(run, "wait", None)
        if callable(wait) and not overlap_pays(int(getattr(self.predictor, "threads", 1))):
            wait()  # the forward pass first, on this thread (``overlap_pays``)
        plan = self.params.plan(dtype, joint=False, threads=1)

        def observed(layer: int, which: int, t: torch.Tensor) -> torch.Tensor:
            return plan.observed(layer, which, plan.stored(layer, which, t))

        yield from walk_layers(run, kv, observed, quiet_torch)

    def check_cache(self, cache: Any) -> KV:
        """``cache``'s per-layer ``(K, V)``; ``ValueError`` unless it has the calibration's layers."""
        cal = self.require_calibration()
        kv = extract_kv(cache)
        if len(kv) != cal.n_layers:
            raise ValueError(f"cache: {len(kv)} layers, the calibration has {cal.n_layers}")
        held(kv)
        return kv

    def compress_predicted(
        self,
        cache: Any,
        input_ids: torch.Tensor,
        prediction: list[tuple[torch.Tensor, torch.Tensor]],
        dtype: str = "bf16",
        *,
        threads: int | None = None,
        model: _api.Model | None = None,
        block_size: int | None = None,
    ) -> bytes:
        """``compress`` with the predictor's output already computed (``prediction()``; for a
        whole-prompt predictor, its ``predict(input_ids)``, the same for every dtype)."""
        if dtype not in MODES:
            raise ValueError(f"dtype: expected one of {sorted(MODES)}, got {dtype!r}")
        kv = self.check_cache(cache)
        return self._encode(kv, input_ids, prediction, dtype, threads, model, block_size)

    def _encode(
        self,
        kv: KV,
        input_ids: torch.Tensor,
        prediction: Iterable[tuple[torch.Tensor, torch.Tensor]],
        dtype: str,
        threads: int | None,
        model: _api.Model | None,
        block_size: int | None = None,
    ) -> bytes:
        """The container of ``kv`` coded against ``prediction`` (``encode_walk``)."""
        params = self.params
        model = self.restore_model(dtype) if model is None else model
        layerwise = is_layerwise(self.predictor)
        plan = params.plan(dtype, joint=self.joint, threads=threads, model=model, layerwise=layerwise)
        meta = identity.metadata(dtype, self.fingerprint, params.calibration, self.predictor, input_ids)
        return encode_container(plan, kv, prediction, meta, block_size)

    def restore_model(self, dtype: str) -> _api.Model:
        """The model residuals are coded with by default (``speckv.restore_model``'s rule): the
        bins model for 16-bit caches, whatever the predictor (demo model, AMD: +0.30% bits
        with the default predictor, its restore ~0.2x the prefill sooner; +0.23% with ``map``,
        +0.09% with statistics), the exact model for fp8 (where bins cost 1-3% and decode no
        faster). ``compress(model=...)`` overrides it."""
        return _api.restore_model(dtype)

    @staticmethod
    def read_header(data: bytes) -> container.Container:
        """Validates the container's header and stream index (``speckv.container.parse``);
        the streams' payloads are checked as they are decoded."""
        return identity.read_header(data)

    def _checked(self, data: bytes, input_ids: torch.Tensor) -> container.Container:
        """The container's header, refused unless made with this model, calibration,
        predictor and prompt."""
        c = self.read_header(data)
        identity.check(c.metadata, self.fingerprint, self.require_calibration(), self.predictor, input_ids)
        return c

    def _decode(
        self,
        c: container.Container,
        input_ids: torch.Tensor,
        layers: list[int] | None,
        threads: int | None,
        prediction: list[tuple[torch.Tensor, torch.Tensor]] | None,
        pipeline: bool | None,
        run: Any,
    ) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """The wanted layers of ``c`` (``_checked``) against ``prediction``, or the predictor's
        (``run``: a layer-wise walk already started, None to start one)."""
        want = wanted(layers, c.layers)
        # the plan's checks (reading) run before the predictor does
        if is_layerwise(self.predictor):
            if prediction is not None:
                raise TypeError("prediction=: a layer-wise predictor runs inside decompress()")
            plan = self.params.reading(c, threads, layerwise=True)
            predictor, own_threads = self.predictor, int(getattr(self.predictor, "threads", 1))
            start = functools.partial(predictor.start, input_ids)
            return decode_layerwise(plan, c, want, pipeline, own_threads, run, start)
        plan = self.params.reading(c, threads, layerwise=False)
        pred = prediction if prediction is not None else self.predictor.predict(input_ids)
        return decode_whole(plan, c, pred, want, layers)

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
        ``decode_walk.decode_layerwise``; default: where spare cores exist). ``device``: where
        the cache's tensors go (default: ``input_ids``' device, so a GPU prompt gets a GPU
        cache; decoding itself runs on the host)."""
        target = restore_device(device, input_ids)
        c = self._checked(data, input_ids)
        layers = self._decode(c, input_ids, None, threads, prediction, pipeline, None)
        kv = [(k.to(target), v.to(target)) for k, v in (layers[i] for i in range(c.layers))]
        if c.metadata["mode"] == "fp8" and dequantize:
            scales = self.require_calibration().fp8_scales
            kv = [dequantize_fp8(k, v, float(scales[i, 0]), float(scales[i, 1])) for i, (k, v) in enumerate(kv)]
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
        target = restore_device(device, input_ids)
        c = self._checked(data, input_ids)
        layers = self._decode(c, input_ids, [layer], threads, None, pipeline, None)
        k, v = layers[layer]
        return k.to(target), v.to(target)


def _give_state(predictor: Any, calibration: Calibration) -> None:
    """Hands a learned predictor what calibration fitted for it.

    A version-1 calibration of the statistics predictor holds no means of its own: version 1's
    ``ChannelStatsPredictor`` was built from the calibration's ``means`` (the only ones it
    offered), so those are handed over; they are covered by the calibration's digest too."""
    load = getattr(predictor, "load_state_dict", None)
    if callable(load):
        load(calibration.predictor_state)
    if isinstance(predictor, ChannelStatsPredictor) and predictor.means is None:
        predictor.load_state_dict({"means": calibration.means})


__all__ = ["SpeculativeCodec", "PredictionMismatchError", "prompt_digest"]
