"""SpeculativeCodec: compress a model's KV cache against its predictor, and back.

Container ("SPKC", little-endian)::

    offset  size  field
    0       4     magic b"SPKC"
    4       2     container version (1)
    6       2     reserved, 0
    8       4     header length H
    12      8     BLAKE2b-64 of the header bytes
    20      H     header, UTF-8 JSON: mode, layout, model fingerprint, calibration digest
                  (which fixes the fp8 scales), predictor settings, digest of the prompt, and
                  the [offset, length] of each inner stream from the end of the header:
                  layout "stacked": all keys, then all values (a chunk per layer);
                  layout "per-layer": layer 0 K, layer 0 V, layer 1 K, ...
    20+H    ...   the inner speckv streams, each with its own checksums and prediction
                  fingerprint

Every identity check (model, calibration, predictor, prompt) runs before the predictor does,
and every inner stream checks its prediction fingerprint before it decodes: a mismatch raises
``PredictionMismatchError`` and no cache is returned.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import torch

from .. import _api, _speckv
from .._speckv import ChecksumError, CorruptStreamError, PredictionMismatchError
from .cache import KV, build_cache, extract_kv
from .calibration import Calibration, CalibrationMismatchError, calibrate, fp8_quantize, model_fingerprint
from .layerwise import is_layerwise, walk
from .predictors import Fp8Predictor, Predictor, describe, fixed_threads
from .prefix import ModelPrefixPredictor

MAGIC = b"SPKC"
CONTAINER_VERSION = 1
MAX_HEADER = 16 << 20
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
        predictor: Predictor | None = None,
        *,
        fingerprint: str | None = None,
    ) -> None:
        self.model = model
        self.predictor = predictor if predictor is not None else ModelPrefixPredictor(model)
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
        )
        return self.calibration

    def save(self, path: str) -> None:
        self._calibration().save(path)

    @classmethod
    def load(cls, path: str, model: Any, predictor: Predictor | None = None) -> SpeculativeCodec:
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
    def _stored(self, mode: str, layer: int, kv: int, true: torch.Tensor) -> torch.Tensor:
        """One layer's K or V as `mode` stores it."""
        if mode == "fp8":
            return fp8_quantize(true, float(self._calibration().fp8_scales[layer, kv]))
        return true.to(MODES[mode])

    def _mu(self, mode: str, layer: int, kv: int, pred: torch.Tensor) -> torch.Tensor:
        """The prediction in the stored dtype's units, float32."""
        if mode == "fp8":
            return pred.float() / float(self._calibration().fp8_scales[layer, kv])
        return pred.float()

    def _sigma_parts(self, mode: str, layer: int, kv: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-channel ``[heads, dim]`` sigma (floored) and relative sigma (None if none)."""
        cal = self._calibration()
        sigma, rel = (cal.sigma_fp8, cal.sigma_rel_fp8) if mode == "fp8" else (cal.sigma, cal.sigma_rel)
        r = rel[layer, kv].float() if rel is not None and bool(rel[layer, kv].any()) else None
        return sigma[layer, kv].clamp(min=SIGMA_FLOOR), r

    def _targets(self, mode: str, layer: int, kv: int, true: torch.Tensor | None, pred: torch.Tensor):
        """(stored tensor or None, mu, sigma as floats) of one layer's K or V in `mode`, for
        measuring (ideal code lengths). What is coded uses ``_coding``'s integer codes: torch's
        vectorised float32 sqrt is not always correctly rounded, so floats computed here could
        differ by an ulp from machine to machine."""
        x = self._stored(mode, layer, kv, true) if true is not None else None
        mu = self._mu(mode, layer, kv, pred)
        s, r = self._sigma_parts(mode, layer, kv)
        sigma = s[None, :, None, :]
        if r is not None:
            sigma = torch.sqrt(sigma * sigma + (r[None, :, None, :] * mu) ** 2)
        return x, mu, sigma

    def _coding(self, mode: str, layer: int, kv: int, true: torch.Tensor | None, pred: torch.Tensor):
        """(stored tensor or None, mu, sigma codes) of one layer's K or V in `mode`: exactly
        what encoder and decoder code with, on any machine."""
        x = self._stored(mode, layer, kv, true) if true is not None else None
        mu = self._mu(mode, layer, kv, pred)
        return x, mu, self._sigma_codes(mode, layer, kv, mu)

    def _sigma_codes(self, mode: str, layer: int, kv: int, mu: torch.Tensor) -> np.ndarray:
        """Sigma codes: per channel (``[1, heads, 1, dim]``, to broadcast), or per scalar for a
        relative sigma, ``sqrt(s^2 + (r mu)^2)`` computed in Rust with correctly rounded float32
        steps (the same codes on every machine)."""
        s, r = self._sigma_parts(mode, layer, kv)
        if r is None:
            return _api.sigma_codes(s[None, :, None, :])
        _, h, t, d = mu.shape
        flat = [np.ascontiguousarray(a.numpy()).reshape(-1) for a in (mu, s, r)]
        return _speckv.relative_sigma_codes(*flat, h, t, d).reshape(mu.shape)

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
        model: str = "exact",
    ) -> bytes:
        """Compresses ``cache`` (the model's cache of ``input_ids``) stored as ``dtype``:
        ``"bf16"``, ``"fp16"``, or ``"fp8"`` (e4m3 with one fp32 scale per layer and K/V, as
        vLLM stores it). Lossless for the cache in that storage dtype."""
        if dtype not in MODES:
            raise ValueError(f"dtype: expected one of {sorted(MODES)}, got {dtype!r}")
        kv = self._check_cache(cache)
        return self._encode(kv, input_ids, self.prediction(kv, input_ids, dtype), dtype, threads, model)

    def prediction(self, cache: Any, input_ids: torch.Tensor, dtype: str = "bf16", run: Any = None) -> KV:
        """What the predictor predicts for ``cache`` (the model's cache of ``input_ids``) stored
        as ``dtype``, per layer ``(K, V)`` in cache units: exactly the ``mu`` that ``compress``
        codes against (a layer-wise predictor observes the stored tensors as it goes; ``run``:
        a walk already started, e.g. on the next block of a prompt)."""
        if not is_layerwise(self.predictor):
            return self.predictor.predict(input_ids)
        run = run if run is not None else self.predictor.start(input_ids)

        def observed(layer: int, which: int, t: torch.Tensor) -> torch.Tensor:
            return self._observed(dtype, layer, which, self._stored(dtype, layer, which, t))

        return walk(run, extract_kv(cache), observed, _quiet_torch)

    def _check_cache(self, cache: Any) -> KV:
        cal = self._calibration()
        kv = extract_kv(cache)
        if len(kv) != cal.n_layers:
            raise ValueError(f"cache: {len(kv)} layers, the calibration has {cal.n_layers}")
        return kv

    def compress_predicted(
        self,
        cache: Any,
        input_ids: torch.Tensor,
        prediction: list[tuple[torch.Tensor, torch.Tensor]],
        dtype: str = "bf16",
        *,
        threads: int | None = None,
        model: str = "exact",
    ) -> bytes:
        """``compress`` with the predictor's output already computed (``prediction()``; for a
        whole-prompt predictor, its ``predict(input_ids)``, the same for every dtype)."""
        if dtype not in MODES:
            raise ValueError(f"dtype: expected one of {sorted(MODES)}, got {dtype!r}")
        return self._encode(self._check_cache(cache), input_ids, prediction, dtype, threads, model)

    def _encode(
        self, kv: KV, input_ids: torch.Tensor, prediction: KV, dtype: str, threads: int | None, model: str
    ) -> bytes:
        cal = self._calibration()
        jobs = []
        for layer, ((k, v), (pk, pv)) in enumerate(zip(kv, prediction)):
            for which, (t, p) in enumerate(((k, pk), (v, pv))):
                if tuple(t.shape) != tuple(p.shape):
                    raise ValueError(f"cache: layer {layer} has shape {tuple(t.shape)}, prediction {tuple(p.shape)}")
                jobs.append(self._coding(dtype, layer, which, t, p))
        layout = _layout(jobs)
        per_chunk = per_layer = 1
        if layout == "stacked":
            # One stream for all keys and one for all values, LAYERS_PER_CHUNK layers a chunk:
            # a stream per layer would cost ~0.5% of an fp8 cache in headers, a chunk per layer
            # ~0.07%. A layer-wise predictor decodes layer by layer: a chunk per layer.
            layerwise = is_layerwise(self.predictor)
            limit = 1 if layerwise else LAYERS_PER_CHUNK
            per_chunk = max(1, min(limit, MAX_CHUNK // jobs[0][0].numel(), MAX_CHUNK // jobs[1][0].numel()))
            if layerwise:
                # a layer decoded on its own (after the maps) is still split over two cores
                per_layer = CHUNKS_PER_LAYER if all(j[0].numel() % CHUNKS_PER_LAYER == 0 for j in jobs[:2]) else 1
            stacks = [_stack(jobs[which::2]) for which in (0, 1)]
            streams = [
                _api.encode(
                    stacks[which][0],
                    stacks[which][1],
                    sigma_codes=stacks[which][2],
                    threads=threads,
                    chunk_size=per_chunk * jobs[which][0].numel() // per_layer,
                    model=model,
                )
                for which in (0, 1)
            ]
        else:
            streams = _parallel(
                lambda job: _api.encode(job[0], job[1], sigma_codes=job[2], threads=1, model=model), jobs, threads
            )
        header = {
            "mode": dtype,
            "layout": layout,
            "layers_per_chunk": per_chunk,
            "chunks_per_layer": per_layer,
            "layers": len(kv),
            "model": self.fingerprint,
            "calibration": cal.digest(),
            "predictor": describe(self.predictor),
            "prompt": prompt_digest(input_ids),
            "streams": [],
        }
        offset = 0
        for s in streams:
            header["streams"].append([offset, len(s)])
            offset += len(s)
        blob = json.dumps(header, sort_keys=True).encode()
        head = MAGIC + struct.pack("<HHI", CONTAINER_VERSION, 0, len(blob)) + bytes.fromhex(_digest(blob, 8)) + blob
        return head + b"".join(streams)

    @staticmethod
    def read_header(data: bytes) -> tuple[dict[str, Any], memoryview]:
        """Validates the container and returns its header and the payload after it."""
        view = memoryview(data)
        if len(view) < 20 or bytes(view[:4]) != MAGIC:
            raise CorruptStreamError("not a speckv cache container (bad magic)")
        version, reserved, length = struct.unpack_from("<HHI", view, 4)
        if version != CONTAINER_VERSION or reserved != 0:
            raise CorruptStreamError(f"cache container version {version} is not supported")
        if length > min(MAX_HEADER, len(view) - 20):
            raise CorruptStreamError("truncated cache container header")
        blob = bytes(view[20 : 20 + length])
        if _digest(blob, 8) != bytes(view[12:20]).hex():
            raise ChecksumError("cache container header checksum does not match")
        try:
            header = json.loads(blob)
            spans = [(int(o), int(n)) for o, n in header["streams"]]
            mode = header["mode"]
            layers = int(header["layers"])
            per_chunk = int(header.get("layers_per_chunk", 1))
        except (ValueError, KeyError, TypeError) as e:
            raise CorruptStreamError(f"cache container header: {e}") from None
        if layers < 0 or per_chunk < 1:
            raise CorruptStreamError("cache container header: bad layer counts")
        payload = view[20 + length :]
        expected = 0
        for o, n in spans:
            if o != expected or n < 0:
                raise CorruptStreamError("cache container: streams are not back to back")
            expected += n
        layout = header.get("layout")
        n_streams = {"stacked": 2, "per-layer": 2 * int(header.get("layers", -1))}.get(layout, -1)
        if expected != len(payload) or mode not in MODES or len(spans) != n_streams:
            raise CorruptStreamError("cache container: stream table does not match the payload")
        return header, payload

    def _check(self, header: dict[str, Any], input_ids: torch.Tensor) -> None:
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
    ):
        header, payload = self.read_header(data)
        self._check(header, input_ids)
        mode = header["mode"]
        if is_layerwise(self.predictor):
            if prediction is not None:
                raise TypeError("prediction=: a layer-wise predictor runs inside decompress()")
            return header, self._decode_walk(header, payload, input_ids, layers, threads, pipeline, run)
        pred = prediction if prediction is not None else self.predictor.predict(input_ids)
        n_layers = header["layers"]
        wanted = list(range(n_layers)) if layers is None else layers
        for layer in wanted:
            if not 0 <= layer < n_layers:
                raise IndexError(f"layer {layer} of {n_layers}")
        if header["layout"] == "stacked":
            decoded = {}
            for which in (0, 1):
                o, n = header["streams"][which]
                targets = [self._coding(mode, layer, which, None, pred[layer][which]) for layer in range(n_layers)]
                _, mu, codes = _stack(targets)
                stream = payload[o : o + n]
                if layers is None:
                    decoded[which] = _api.decode(stream, mu, sigma_codes=codes, threads=threads)
                else:
                    # read only the chunk that holds each layer asked for
                    per_chunk = int(header.get("layers_per_chunk", 1))
                    decoded[which] = {}
                    for layer in wanted:
                        c = layer // per_chunk
                        run = _api.decode(stream, mu, sigma_codes=codes, threads=threads, chunks=(c, c + 1))
                        layers_in_run = run.reshape(-1, *mu.shape[1:])
                        decoded[which][layer] = layers_in_run[layer - c * per_chunk]
            return header, {layer: (decoded[0][layer], decoded[1][layer]) for layer in wanted}
        jobs = []
        for layer in wanted:
            for which in (0, 1):
                o, n = header["streams"][2 * layer + which]
                _, mu, codes = self._coding(mode, layer, which, None, pred[layer][which])
                jobs.append((payload[o : o + n], mu, codes))
        out = _parallel(lambda job: _api.decode(job[0], job[1], sigma_codes=job[2], threads=1), jobs, threads)
        return header, {layer: (out[2 * i], out[2 * i + 1]) for i, layer in enumerate(wanted)}

    def _decode_walk(
        self,
        header: dict[str, Any],
        payload: memoryview,
        input_ids: torch.Tensor,
        layers: list[int] | None,
        threads: int | None,
        pipeline: bool | None,
        run: Any = None,
    ) -> dict[int, tuple[Any, Any]]:
        """Decodes a layer-wise predictor's stream in the walk's order (see ``layerwise``),
        up to the last layer asked for.

        The layers a run predicts without looking at decoded ones (``independent_layers``:
        the model's own prefix) are decoded either as they are made, overlapped with the
        predictor's forward pass (``pipeline=True``; pays where spare cores exist), or all
        at once on every core when the forward pass ends (``pipeline=False``: on a machine
        whose cores the forward pass already uses, sharing them slows it more than the
        decode gains). ``None`` picks overlap when the machine has more cores than the
        predictor's threads. Either way, the same bits."""
        mode, n_layers = header["mode"], header["layers"]
        wanted = list(range(n_layers)) if layers is None else layers
        for layer in wanted:
            if not 0 <= layer < n_layers:
                raise IndexError(f"layer {layer} of {n_layers}")
        stacked = header["layout"] == "stacked"
        per_layer = int(header.get("chunks_per_layer", 1))
        if stacked and (int(header.get("layers_per_chunk", 1)) != 1 or per_layer < 1):
            raise CorruptStreamError("cache container: a layer-wise stream needs whole chunks per layer")
        n_threads = _api.resolve_threads(threads)
        if pipeline is None:
            pipeline = (os.cpu_count() or 1) > int(getattr(self.predictor, "threads", 1))
        mus: dict[int, torch.Tensor] = {}
        codes: dict[int, np.ndarray] = {}
        out: dict[int, list[Any]] = {}
        upto = max(wanted) + 1

        def prepare(layer: int, which: int, pred: torch.Tensor) -> tuple[Any, Any]:
            if stacked:
                mu = self._mu(mode, layer, which, pred)
                sigma = None
                # The stream's mu and sigma cover every layer; only the chunks decoded are
                # read (and fingerprinted), so the rest of the buffers may stay zero.
                if which not in mus:
                    mus[which] = torch.zeros((n_layers, *mu.shape), dtype=torch.float32)
                    codes[which] = np.zeros((n_layers, *mu.shape), dtype=np.int16)
                mus[which][layer] = mu
                # per-channel codes broadcast; a relative sigma's codes in one pass
                codes[which][layer] = self._sigma_codes(mode, layer, which, mu)
            else:
                _, mu, sigma = self._coding(mode, layer, which, None, pred)
            return mu, sigma

        def decode(first: int, stop: int, which: int, mu: Any, sigma: Any, n: int) -> list[Any]:
            """Layers first..stop-1 of K or V."""
            if not stacked:
                o, size = header["streams"][2 * first + which]
                return [_api.decode(payload[o : o + size], mu, sigma_codes=sigma, threads=n)]
            o, size = header["streams"][which]
            flat = _api.decode(
                payload[o : o + size],
                mus[which],
                sigma_codes=codes[which],
                threads=n,
                chunks=(first * per_layer, stop * per_layer),
            )
            shape = mus[which].shape[1:]
            return list(flat.reshape(stop - first, *shape))

        run = run if run is not None else self.predictor.start(input_ids)
        quiet = contextlib.ExitStack()
        try:
            start = 0
            independent = int(getattr(run, "independent_layers", 0))
            free = min(independent, upto) if stacked and not pipeline else 0
            if free:
                for layer in range(free):
                    for which in (0, 1):
                        prepare(layer, which, run.predict(layer, which))
                for which in (0, 1):
                    for layer, value in enumerate(decode(0, free, which, None, None, n_threads)):
                        out.setdefault(layer, []).append(value)
                for layer in range(free):
                    for which in (0, 1):
                        run.observe(layer, which, self._observed(mode, layer, which, out[layer][which]))
                start = free
            for layer in range(start, upto):
                if layer == independent:
                    quiet.enter_context(_quiet_torch(run))
                out[layer] = []
                for which in (0, 1):
                    mu, sigma = prepare(layer, which, run.predict(layer, which))
                    value = decode(layer, layer + 1, which, mu, sigma, n_threads)[0]
                    out[layer].append(value.reshape(mu.shape))
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
    ) -> Any:
        """The exact cache back as a ``DynamicCache``. In fp8 mode it holds the fp8 tensors
        dequantized (``fp8 * scale`` in bfloat16) unless ``dequantize=False``, which returns the
        stored float8_e4m3fn tensors themselves. ``prediction`` skips running the predictor
        when its output for ``input_ids`` is at hand (whole-prompt predictors). ``pipeline``:
        for a layer-wise predictor, whether decoding overlaps its forward pass (see
        ``_decode_walk``; default: where spare cores exist)."""
        header, layers = self._decode(data, input_ids, None, threads, prediction, pipeline)
        kv = [layers[i] for i in range(header["layers"])]
        if header["mode"] == "fp8" and dequantize:
            scales = self._calibration().fp8_scales
            kv = [_dequantize(k, v, float(scales[i, 0]), float(scales[i, 1])) for i, (k, v) in enumerate(kv)]
        return build_cache(kv)

    def decompress_layer(
        self,
        data: bytes,
        input_ids: torch.Tensor,
        layer: int,
        *,
        threads: int | None = None,
        pipeline: bool | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's stored ``(K, V)`` without decoding the others (a layer-wise predictor
        needs the layers below: those are decoded too, but not the ones above)."""
        _, layers = self._decode(data, input_ids, [layer], threads, None, pipeline)
        return layers[layer]


def predictor_from_description(model: Any, description: dict[str, Any]) -> Any:
    """The built-in predictor whose ``describe()`` is ``description`` (as recorded in
    calibrations and streams); ``CalibrationMismatchError`` for others."""
    name = description.get("name")
    if name == "model-prefix":
        return ModelPrefixPredictor(model, int(description["layers"]), threads=int(description["threads"]))
    if name == "fp8":
        scale = str(description.get("scale", ""))
        block = None if scale.startswith("per-tensor") else int(scale.split("x")[0])
        threads = description.get("threads", 1)
        dtype = getattr(torch, str(description.get("compute_dtype", "float32")))
        return Fp8Predictor(model, block_size=block, threads="all" if threads == "any" else int(threads), dtype=dtype)
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


def _give_state(predictor: Any, calibration: Calibration) -> None:
    """Hands a learned predictor what calibration fitted for it."""
    load = getattr(predictor, "load_state_dict", None)
    if callable(load):
        load(calibration.predictor_state)


def _dequantize(k: torch.Tensor, v: torch.Tensor, k_scale: float, v_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 values times their scale, in bfloat16 (what attention reads from a vLLM fp8 cache)."""
    return (k.float() * k_scale).to(torch.bfloat16), (v.float() * v_scale).to(torch.bfloat16)


__all__ = ["SpeculativeCodec", "PredictionMismatchError", "prompt_digest"]
