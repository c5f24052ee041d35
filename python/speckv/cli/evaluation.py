"""What ``speckv demo`` and ``speckv eval`` share: their arguments, and one evaluation of a
predictor (calibrate or load, code the held-out prompts' caches, measure) as a result dict."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from .calibration_cache import calibrated_codec
from .common import add_fp8_scale_block, say, text, text_name
from .predictor_spec import PREDICTORS_HELP, describe_short

if TYPE_CHECKING:  # the hf extra: imported where it is used
    import torch

    from ..codec.codec import SpeculativeCodec

PRODUCERS = {
    "other-kernels": "the model with other attention kernels than the predictor's",
    "same": "the model itself, as the predictor runs it",
}


def add_eval_arguments(p: argparse.ArgumentParser, demo: bool) -> None:
    """The options of ``demo`` and (with a model, a text and more) ``eval``."""
    if not demo:
        p.add_argument("--model", help="a local GGUF file or transformers folder (default: the demo model)")
        p.add_argument("--calibration", help="a calibration file from `speckv calibrate`")
        p.add_argument(
            "--text",
            help="held-out text: a file, or a bundled text: evaluation (default; Python docs) or legal (GPL-3)",
        )
    else:
        p.set_defaults(model=None, calibration=None, text=None)
    p.add_argument("--prompts", type=int, default=2, help="held-out prompts to compress (default 2)")
    p.add_argument("--seq-len", type=int, default=512, help="tokens per prompt (default 512)")
    p.add_argument("--samples", type=int, default=32, help="calibration prompts (default 32)")
    p.add_argument("--calibration-text", help="calibration text file (default: the bundled text)")
    add_fp8_scale_block(p)
    p.add_argument("--predictor", help=f"the predictor: {PREDICTORS_HELP}; default prefix, or the --calibration file's")
    if not demo:
        p.add_argument("--predictors", help="several predictors, comma-separated: prints their trade-off table")
        p.add_argument(
            "--ablate",
            action="store_true",
            help="calibrate afresh, then code with each component of the joint residual model added in turn",
        )
    p.add_argument(
        "--producer",
        choices=("other-kernels", "same"),
        default="other-kernels",
        help="who makes the caches compressed: the model with other attention kernels than the predictor's "
        "(default: a cache from another machine or engine) or the model itself, as the predictor runs it",
    )
    p.add_argument(
        "--repeat", type=int, default=2 if demo else 3, help="time each step this many times, keep the fastest"
    )
    joint = p.add_mutually_exclusive_group()
    joint.add_argument(
        "--joint",
        action="store_true",
        help="code with the calibration's joint residual model (default: for whole-prompt predictors)",
    )
    joint.add_argument("--no-joint", action="store_true", help="code every scalar on its own (no joint residual model)")
    p.add_argument("--modes", default="bf16,fp8", help="cache storage dtypes to test (bf16, fp16, fp8)")
    p.add_argument(
        "--coder",
        choices=("auto", "exact", "bins"),
        default="auto",
        help="how residuals are coded: auto (default: what compress picks, the bins model for 16-bit "
        "caches of the statistics predictor, else the exact model), the exact model (smallest) or the "
        "bins model (static tables, several times faster to decode)",
    )
    p.add_argument("--threads", type=int, default=None, help="coder threads (default: all cores)")
    p.add_argument("--recalibrate", action="store_true", help="ignore a cached calibration")
    p.add_argument("--json", action="store_true", help="print the results as JSON")


def producer(args: argparse.Namespace) -> Any:
    """``--producer``: the function that makes the caches coded."""
    from ..models.cache import other_kernels, prefill

    return other_kernels if args.producer == "other-kernels" else prefill


def run_eval(
    args: argparse.Namespace, model: Any, tokenizer: Any, label: str, spec: str | None = None
) -> dict[str, Any]:
    """One predictor (``spec``, default ``args.predictor``) evaluated on the held-out prompts:
    ``hf.evaluate``'s result with the predictor's FLOPs and the run's settings."""
    from ..models.demo import prompts

    held_out = prompts(tokenizer, text(args.text), args.seq_len, args.prompts)
    codec, cal_path, cached = calibrated_codec(args, model, tokenizer, label, spec)
    if getattr(args, "no_joint", False) or getattr(args, "joint", False):
        codec.joint = bool(getattr(args, "joint", False))
    cfg = model.config
    say(
        args,
        f"{label}: {cfg.num_hidden_layers} layers, {cfg.num_key_value_heads} kv heads x "
        f"{getattr(cfg, 'head_dim', None) or cfg.hidden_size // cfg.num_attention_heads}; "
        f"predictor: {describe_short(codec.predictor)}",
    )
    say(args, f"calibration: {cal_path}{' (cached)' if cached else ''}")
    say(
        args,
        f"evaluating {len(held_out)} held-out prompt(s) x {args.seq_len} tokens of "
        f"{text_name(args.text)}, caches made by "
        f"{PRODUCERS[args.producer]} ...",
    )
    result = evaluate_args(args, codec, held_out)
    from ..predictors.cost import predictor_flops, recompute_flops, text_config

    config = text_config(model)
    flops = predictor_flops(codec.predictor, config, args.seq_len)
    result["predict_gflop"] = flops / 1e9
    result["predict_over_recompute_flops"] = flops / recompute_flops(config, args.seq_len)
    result["model"] = label
    result["predictor"] = spec or args.predictor or ("from-calibration" if args.calibration else "prefix")
    result["producer"] = args.producer
    result["calibration"] = {"path": cal_path, **codec.require_calibration().metadata}
    return result


def evaluate_args(args: argparse.Namespace, codec: SpeculativeCodec, held_out: list[torch.Tensor]) -> dict[str, Any]:
    """``hf.evaluate.evaluate`` with the command line's modes, threads, producer and repeats."""
    from ..codec.evaluate import evaluate

    return evaluate(
        codec,
        held_out,
        tuple(args.modes.split(",")),
        threads=args.threads,
        progress=not args.json,
        producer=producer(args),
        repeat=args.repeat,
        coder=None if args.coder == "auto" else args.coder,
    )
