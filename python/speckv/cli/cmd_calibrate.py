"""``speckv calibrate``: measure a predictor's sigmas and fp8 scales on a text and save them."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .calibration_cache import calibrated_codec
from .common import add_fp8_scale_block, load, need_hf
from .predictor_spec import PREDICTORS_HELP, parse_spec


def add_parser(sub: Any) -> None:
    p = sub.add_parser("calibrate", help="measure sigma and fp8 scales and save them")
    p.add_argument("--model", help="a local GGUF file or transformers folder (default: the demo model)")
    p.add_argument("--calibration-text", help="calibration text file (default: the bundled text)")
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=512)
    add_fp8_scale_block(p)
    p.add_argument("--predictor", default="prefix", help=f"the predictor: {PREDICTORS_HELP}")
    p.add_argument(
        "--fp8-scale",
        type=float,
        default=None,
        help="one fp8 scale for every layer's K and V (an engine's fp8 cache: vLLM's default is 1.0; "
        "default: each one's absmax / 448)",
    )
    p.add_argument("-o", "--output", help="where to write the calibration (default: the cache folder)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    need_hf()
    parse_spec(args.predictor)  # a bad name fails before the model loads
    model, tokenizer, label = load(args.model, demo_label="demo model")
    args.calibration = None
    args.recalibrate = True
    codec, path, _ = calibrated_codec(args, model, tokenizer, label)
    if args.output:
        codec.save(args.output)
        path = args.output
    meta = codec.require_calibration().metadata
    if args.json:
        print(json.dumps({"path": path, **meta}, indent=2, default=str))
    else:
        print(f"calibration written to {path} ({meta['samples']} prompts, {meta['tokens']} tokens)")
