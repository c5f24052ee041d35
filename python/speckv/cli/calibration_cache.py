"""The calibrations the commands code with: a ``--calibration`` file, or one made from a text
and cached under ``cache_dir()``, keyed by the model, the predictor, the prompts and the text."""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .._cache_dir import cache_dir
from .common import calibration_text, say
from .predictor_spec import describe_short, make_predictor, predictor_key

if TYPE_CHECKING:  # the hf extra: imported where it is used
    from ..codec.codec import SpeculativeCodec


def calibrated_codec(
    args: argparse.Namespace, model: Any, tokenizer: Any, label: str, spec: str | None = None
) -> tuple[SpeculativeCodec, str, bool]:
    """A codec for `model` with predictor `spec` (default ``args.predictor``), calibrated from
    `args.calibration` or the (cached) bundled text: the codec, the calibration's path, and
    whether it came from the cache."""
    from ..hf import Calibration, SpeculativeCodec, model_fingerprint
    from ..models.demo import prompts

    if args.calibration and not (spec or args.predictor):
        # the predictor the calibration was made with
        return SpeculativeCodec.load(args.calibration, model), args.calibration, False
    predictor = make_predictor(spec or args.predictor or "prefix", model, args.block_size)
    fingerprint = model_fingerprint(model)
    if args.calibration:
        cal = Calibration.load(args.calibration)
        return SpeculativeCodec(model, cal, predictor, fingerprint=fingerprint), args.calibration, False
    text_name = Path(args.calibration_text).name if args.calibration_text else "bundled calibration text"
    text = calibration_text(args.calibration_text)
    # A custom text is keyed by a digest of its contents (stable across processes, unlike
    # hash(), and a changed file calibrates again).
    text_key = hashlib.sha256(text.encode()).hexdigest()[:16] if args.calibration_text else "bundled"
    fp8_scale = getattr(args, "fp8_scale", None)
    if fp8_scale is not None:  # fixed fp8 scales: another calibration than the absmax one
        text_key += f"-fp8s{fp8_scale:g}"
    path = cache_dir() / (
        f"calibration-{fingerprint[:16]}-{predictor_key(predictor)}-{args.samples}x{args.seq_len}-{text_key}.safetensors"
    )
    if path.exists() and not args.recalibrate:
        try:
            cal = Calibration.load(str(path))
            return SpeculativeCodec(model, cal, predictor, fingerprint=fingerprint), str(path), True
        except Exception as e:  # a stale or foreign file: calibrate again
            say(args, f"ignoring cached calibration {path}: {e}")
    samples = prompts(tokenizer, text, args.seq_len, args.samples)
    say(
        args,
        f"calibrating {label} ({describe_short(predictor)}) on {len(samples)} prompts x {args.seq_len} "
        f"tokens of {text_name} ...",
    )
    codec = SpeculativeCodec(model, None, predictor, fingerprint=fingerprint)
    codec.calibrate(
        samples,
        source=f"{text_name}: {len(samples)} x {args.seq_len} tokens",
        progress=not args.json,
        fp8_scale=fp8_scale,
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    codec.save(str(path))
    return codec, str(path), False
