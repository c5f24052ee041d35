"""Measuring a codec on real caches: coded size per layer against the reference method's ideal
code length and zstd, and speed against the model's own prefill."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .. import _api
from ..models.cache import KV, extract_kv, last_tokens, prefill, recompute
from ..predictors.layerwise import is_layerwise
from .codec import SpeculativeCodec

SQRT1_2 = 1.0 / math.sqrt(2.0)


def _normal_mass(lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Phi(hi) - Phi(lo) in float64, accurate in both tails."""
    erfc = torch.special.erfc
    right = 0.5 * (erfc(lo * SQRT1_2) - erfc(hi * SQRT1_2))
    left = 0.5 * (erfc(-hi * SQRT1_2) - erfc(-lo * SQRT1_2))
    middle = 1.0 - 0.5 * (erfc(-lo * SQRT1_2) + erfc(hi * SQRT1_2))
    return torch.where(lo >= 0, right, torch.where(hi <= 0, left, middle))


def _all_values(dtype: torch.dtype) -> torch.Tensor:
    """Value of every bit pattern of an 8/16-bit float dtype, indexed by ordinal + offset."""
    bits = 16 if dtype in (torch.bfloat16, torch.float16) else 8
    half = 1 << (bits - 1)
    ordinals = torch.arange(-half, half, dtype=torch.int64)
    magnitude = torch.where(ordinals >= 0, ordinals, -ordinals - 1)
    patterns = torch.where(ordinals >= 0, magnitude, magnitude | half)
    word = torch.int16 if bits == 16 else torch.uint8
    if bits == 16:
        patterns = torch.where(patterns >= half, patterns - (1 << 16), patterns)
    return patterns.to(word).view(dtype).double()


def reference_ideal_bits(x: torch.Tensor, mu: torch.Tensor, sigma: torch.Tensor) -> float:
    """The reference method's ideal code length of ``x`` in bits: a single Gaussian
    ``N(mu, sigma^2)`` integrated in float64 over the interval of reals that round to each value
    (midpoints to its neighbours), probability floored at 2^-24."""
    values = _all_values(x.dtype)
    half = values.numel() // 2
    bits = 16 if values.numel() == 65536 else 8
    word = torch.int16 if bits == 16 else torch.uint8
    raw = x.contiguous().view(word).to(torch.int64) & ((1 << bits) - 1)
    sign = raw >> (bits - 1)
    mag = raw & (half - 1)
    index = torch.where(sign == 0, mag, -mag - 1) + half
    v = values[index]
    below = values[(index - 1).clamp(min=0)]
    above = values[(index + 1).clamp(max=values.numel() - 1)]
    lo = torch.where(torch.isfinite(below), (v + below) / 2, torch.full_like(v, -math.inf))
    hi = torch.where(torch.isfinite(above), (v + above) / 2, torch.full_like(v, math.inf))
    m = mu.double().expand_as(v)
    s = sigma.double().expand_as(v)
    p = _normal_mass((lo - m) / s, (hi - m) / s).clamp(min=2.0**-24)
    p = torch.where(torch.isfinite(v), p, torch.full_like(p, 2.0**-24))
    return float(-torch.log2(p).sum())


def _zstd_bits(tensors: list[torch.Tensor]) -> float | None:
    try:
        import zstandard
    except ImportError:
        return None
    word = {2: torch.int16, 1: torch.uint8}
    raw = b"".join(t.contiguous().view(word[t.element_size()]).numpy().tobytes() for t in tensors)
    return len(zstandard.ZstdCompressor(level=19).compress(raw)) * 8.0


def _timed(repeat: int, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, float]:
    """``fn(*args, **kwargs)`` and the fastest of ``repeat`` timings of it."""
    best = float("inf")
    out = None
    for _ in range(max(1, repeat)):
        t = time.perf_counter()
        out = fn(*args, **kwargs)
        best = min(best, time.perf_counter() - t)
    return out, best


@dataclass
class _Totals:
    """One storage mode's sums over the prompts (per layer and K/V where a tensor)."""

    coded_bits: torch.Tensor
    ideal_bits: torch.Tensor
    scalars: torch.Tensor
    bytes: int = 0
    zstd_bits: float | None = 0.0  # None once a prompt had no zstd figure
    encode_s: float = 0.0
    decode_s: float = 0.0
    predict_s: float = 0.0
    restore_s: float = 0.0
    raw_bytes: int = 0
    exact: bool = True
    coder: str = ""

    @classmethod
    def zeros(cls, n_layers: int) -> _Totals:
        def z() -> torch.Tensor:
            return torch.zeros(n_layers, 2, dtype=torch.float64)

        return cls(coded_bits=z(), ideal_bits=z(), scalars=z())


def evaluate(
    codec: SpeculativeCodec,
    prompts: list[torch.Tensor],
    modes: tuple[str, ...] = ("bf16", "fp8"),
    *,
    threads: int | None = None,
    progress: bool = False,
    producer: Callable[[Any, torch.Tensor], KV] | None = None,
    repeat: int = 1,
    coder: _api.Model | None = None,
) -> dict[str, Any]:
    """Compresses the model's cache of every prompt in every mode, checks the exact round trip,
    and returns sizes (per layer and K/V), the reference ideal, zstd, and timings.

    ``producer(model, input_ids)`` makes the caches to compress (default: the model's own
    ``prefill``; ``other_kernels`` measures what a user whose cache came from another machine
    or engine gets). Times are relative to the model's own prefill of the same prompt:
    ``restore`` is everything ``decompress`` costs, predictor included; each is the fastest of
    ``repeat`` runs. ``coder``: the model the residuals are coded with (``speckv.encode``'s
    ``model``; default: what ``compress`` picks, ``SpeculativeCodec.restore_model``)."""
    layerwise = is_layerwise(codec.predictor)
    cal = codec.require_calibration()
    params = codec.params
    n_layers = cal.n_layers
    result: dict[str, Any] = {"prompts": len(prompts), "tokens": sum(p.numel() for p in prompts), "modes": {}}
    timing = {"prefill_s": 0.0, "recompute_s": 0.0, "predict_s": 0.0}
    per_mode = {m: _Totals.zeros(n_layers) for m in modes}
    iterator: Any = prompts
    if progress:
        from tqdm.auto import tqdm

        iterator = tqdm(prompts, desc="evaluating", unit="prompt")
    for ids in iterator:
        own, t = _timed(repeat, prefill, codec.model, ids)
        timing["prefill_s"] += t
        _, t = _timed(repeat, recompute, codec.model, ids)
        timing["recompute_s"] += t
        true = own if producer is None else producer(codec.model, ids)
        whole = None
        predictor = codec.predictor
        if not is_layerwise(predictor):
            whole, t = _timed(repeat, predictor.predict, ids)
            timing["predict_s"] += t
        for mode in modes:
            acc = per_mode[mode]
            pred, t_pred = (whole, 0.0) if whole is not None else _timed(repeat, codec.prediction, true, ids, mode)
            model = coder or codec.restore_model(mode)
            data, t_enc = _timed(repeat, codec.compress_predicted, true, ids, pred, mode, threads=threads, model=model)
            acc.coder = model
            restored, t_dec = _timed(
                repeat, codec.decompress, data, ids, threads=threads, dequantize=False, prediction=whole
            )
            back = extract_kv(restored)
            acc.encode_s += t_enc
            acc.restore_s += t_dec
            if layerwise:
                # the walk runs the predictor inside decompress: restore is all of it, and the
                # decode's share is what remains after the predictor's own walk
                acc.predict_s += t_pred
                acc.decode_s += max(t_dec - t_pred, 0.0)
            else:
                acc.decode_s += t_dec
            acc.bytes += len(data)
            acc.raw_bytes += sum(t.numel() * (1 if mode == "fp8" else 2) for pair in true for t in pair)
            c = codec.read_header(data)
            # (stored tensor, mu, sigma) of every layer's K and V, as the codec coded them
            held = [int(k.shape[2]) for k, _ in true]
            targets = {
                (layer, which): params.measured(
                    mode, layer, which, true[layer][which], last_tokens(pred[layer][which], held[layer], layer)
                )
                for layer in range(n_layers)
                for which in (0, 1)
            }
            stored_all = []
            layer_bits = torch.zeros(n_layers, 2, dtype=torch.float64)
            own = None
            for b in range(len(c.blocks)):
                if c.layout != "stacked":
                    for layer in range(n_layers):
                        for which in (0, 1):
                            if c.layer_range(b, layer)[0] != c.layer_range(b, layer)[1]:
                                layer_bits[layer, which] += len(c.stream(b, layer, which).data) * 8
                    continue
                # A chunk holds `layers_per_chunk` layers: its bytes (and a share of the stream
                # header) go to them in proportion to their ideal code lengths under speckv's
                # own model; a layer in several chunks gets them all.
                for which in (0, 1):
                    stream = c.stream(b, 0, which)
                    info = _api.info(stream.data)
                    share = info["header_bytes"] / len(info["chunk_bytes"])
                    for i, nbytes in enumerate(info["chunk_bytes"]):
                        if stream.chunks_per_layer > 1 or stream.layers_per_chunk == 1:
                            layer_bits[i // stream.chunks_per_layer, which] += (nbytes + share) * 8
                            continue
                        if own is None:
                            own = {key: _api.ideal_bits(*t) for key, t in targets.items()}
                        members = range(i * stream.layers_per_chunk, min((i + 1) * stream.layers_per_chunk, n_layers))
                        total = sum(own[m, which] for m in members) or 1.0
                        for m in members:
                            layer_bits[m, which] += (nbytes + share) * 8 * own[m, which] / total
            for layer in range(n_layers):
                for which in (0, 1):
                    stored, mu, sigma = targets[layer, which]
                    assert stored is not None  # measured() was given the true tensor
                    stored_all.append(stored)
                    got = back[layer][which]
                    word = torch.int16 if stored.element_size() == 2 else torch.uint8
                    acc.exact &= bool(torch.equal(stored.view(word), got.view(word)))
                    acc.ideal_bits[layer, which] += reference_ideal_bits(stored, mu, sigma)
                    acc.coded_bits[layer, which] += layer_bits[layer, which]
                    acc.scalars[layer, which] += stored.numel()
            z = _zstd_bits(stored_all)
            acc.zstd_bits = None if z is None or acc.zstd_bits is None else acc.zstd_bits + z
    for mode, acc in per_mode.items():
        scalars = float(acc.scalars.sum())
        raw_bits = 16.0 if mode != "fp8" else 8.0
        out: dict[str, Any] = {
            "exact_round_trip": acc.exact,
            "coder": acc.coder,
            "bits_per_scalar": {
                "K": float(acc.coded_bits[:, 0].sum() / acc.scalars[:, 0].sum()),
                "V": float(acc.coded_bits[:, 1].sum() / acc.scalars[:, 1].sum()),
                "all": float(acc.coded_bits.sum()) / scalars,
                "with_container": acc.bytes * 8.0 / scalars,
            },
            "reference_ideal_bits_per_scalar": float(acc.ideal_bits.sum()) / scalars,
            # the whole container (headers included) against the reference ideal
            "coded_over_reference_ideal": acc.bytes * 8.0 / float(acc.ideal_bits.sum()),
            "zstd19_bits_per_scalar": None if acc.zstd_bits is None else acc.zstd_bits / scalars,
            "ratio_vs_raw": raw_bits * scalars / (acc.bytes * 8.0),
            "encode_s": acc.encode_s,
            "decode_s": acc.decode_s,
            "encode_msym_per_s": scalars / acc.encode_s / 1e6,
            # a layer-wise predictor's decode share is restore minus its walk: may round to 0
            "decode_msym_per_s": scalars / acc.decode_s / 1e6 if acc.decode_s > 0 else None,
            "codec_speedup_over_prefill": timing["prefill_s"] / (acc.encode_s + acc.decode_s),
            # restore = predictor + decode (a layer-wise predictor: decompress, all of it)
            "restore_over_prefill": (acc.restore_s + (0.0 if layerwise else timing["predict_s"])) / timing["prefill_s"],
            # against what recomputing the cache costs (the last token's logits only, as an
            # engine prefills): the fair comparison; `prefill` computes every token's logits
            "restore_over_recompute": (acc.restore_s + (0.0 if layerwise else timing["predict_s"]))
            / timing["recompute_s"],
            "predict_over_prefill": (acc.predict_s if layerwise else timing["predict_s"]) / timing["prefill_s"],
            "decode_over_prefill": acc.decode_s / timing["prefill_s"],
            "raw_bytes": acc.raw_bytes,
            "bytes": acc.bytes,
            "prefill_s": timing["prefill_s"],
            "per_layer": [
                {
                    "layer": layer,
                    "K": float(acc.coded_bits[layer, 0] / acc.scalars[layer, 0]),
                    "V": float(acc.coded_bits[layer, 1] / acc.scalars[layer, 1]),
                    "K_ideal": float(acc.ideal_bits[layer, 0] / acc.scalars[layer, 0]),
                    "V_ideal": float(acc.ideal_bits[layer, 1] / acc.scalars[layer, 1]),
                }
                for layer in range(n_layers)
            ],
        }
        if out["zstd19_bits_per_scalar"] is not None:
            out["zstd19_over_coded"] = out["zstd19_bits_per_scalar"] / out["bits_per_scalar"]["with_container"]
        result["modes"][mode] = out
    if layerwise:
        timing["predict_s"] = sum(acc.predict_s for acc in per_mode.values()) / max(len(per_mode), 1)
    result["timing"] = {**timing, "predictor_cost_over_prefill": timing["predict_s"] / timing["prefill_s"]}
    return result


__all__ = ["KV", "evaluate", "reference_ideal_bits"]
