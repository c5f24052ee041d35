"""``speckv eval --ablate``: one calibration, then the held-out caches coded with each component
of the joint residual model added in turn (bits, coder speeds, calibration size)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import tempfile
from pathlib import Path
from typing import Any

from .._api import TokenScale
from .common import CommandError, calibration_text, say, text, text_name
from .evaluation import evaluate_args
from .predictor_spec import describe_short, make_predictor
from .tables import ablation_table

# (component, JointFit structure, adaptive token scale)
ABLATION = (
    ("static per-channel sigma (reference model)", None, False),
    ("+ mean residual per channel", "offset", False),
    ("+ a gain on each channel's prediction", "affine", False),
    ("+ earlier channels of the same K or V", "within", False),
    ("+ the keys, for the values", "full", False),
    ("+ token scale (full joint model)", "full", True),
)


def ablate(args: argparse.Namespace, model: Any, tokenizer: Any, label: str) -> None:
    """``speckv eval --ablate``: one fresh calibration, then the held-out caches coded with each
    component of the joint residual model added in turn (bits, speeds, calibration size)."""
    from ..hf import SpeculativeCodec, model_fingerprint
    from ..models.demo import prompts
    from ..predictors.joint_fit import JOINT_SHRINKAGE

    spec = args.predictor or "prefix"
    predictor = make_predictor(spec, model, args.block_size)
    fingerprint = model_fingerprint(model)
    cal_text = calibration_text(args.calibration_text)
    samples = prompts(tokenizer, cal_text, args.seq_len, args.samples)
    held_out = prompts(tokenizer, text(args.text), args.seq_len, args.prompts)
    say(args, f"calibrating {label} ({describe_short(predictor)}) on {len(samples)} x {args.seq_len} tokens ...")
    base = SpeculativeCodec(model, None, predictor, fingerprint=fingerprint)
    cal = base.calibrate(samples, progress=not args.json, keep_joint_fits=True)
    if not cal.joint_fits:
        raise CommandError("--ablate: the calibration fitted no joint model (every layer has a relative sigma)")
    layers = cal.metadata["joint"]["layers"]
    rows: list[dict[str, Any]] = []
    for name, structure, scaled in ABLATION:
        variant = cal
        if structure is not None:
            solved = {m: fit.solve(layers, JOINT_SHRINKAGE, structure) for m, fit in cal.joint_fits.items()}
            variant = dataclasses.replace(cal, joint=solved, joint_fits={})
        codec = SpeculativeCodec(
            model,
            variant,
            predictor,
            fingerprint=fingerprint,
            joint=structure is not None,
            token_scale=TokenScale() if scaled else None,
        )
        say(args, f"evaluating: {name} ...")
        result = evaluate_args(args, codec, held_out)
        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "cal.safetensors"
            (variant if structure is not None else dataclasses.replace(cal, joint={})).save(str(path))
            size = path.stat().st_size
        modes = {
            mode: {
                "K": m["bits_per_scalar"]["K"],
                "V": m["bits_per_scalar"]["V"],
                "all": m["bits_per_scalar"]["with_container"],
                "encode_msym_per_s": m["encode_msym_per_s"],
                "decode_msym_per_s": m["decode_msym_per_s"],
                "exact": m["exact_round_trip"],
            }
            for mode, m in result["modes"].items()
        }
        rows.append(
            {
                "component": name,
                "structure": structure,
                "token_scale": scaled,
                "calibration_bytes": size,
                "modes": modes,
            }
        )
    if args.json:
        print(json.dumps({"model": label, "predictor": spec, "text": text_name(args.text), "ablation": rows}, indent=2))
    else:
        print()
        print(ablation_table(rows))
        print(
            f"b/s = bits per scalar (K, V, all with the container); Msym/s = encode / decode speed of the coder "
            f"alone; held-out: {text_name(args.text)}; predictor: {describe_short(predictor)}"
        )
    if not all(m["exact"] for r in rows for m in r["modes"].values()):
        raise CommandError("a round trip was not exact")
