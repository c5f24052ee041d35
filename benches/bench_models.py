"""The frontier per model: for every model at hand (the demo model, the models
``../shared/models/fetch-models.sh`` fetched, any GGUF file or transformers folder given), bits per
scalar in bf16 and fp8 (container included) for each predictor, each predictor's cost in FLOPs
(counted from the config, as a share of a recompute: every layer, the last token's logits) and
in wall time, restore against the model's prefill (every token's logits, as ``speckv eval``) and
against a recompute (the last token's logits, as an engine prefills), the
calibration's time, and where the bits go (layers the model computes against mapped ones, K
against V). Held-out text of another genre than the calibration text (the bundled GPL-3 text).

    python benches/bench_models.py [MODEL ...] [--predictors stats,map,map+hidden,prefix:4,prefix,fp8-bf16]
        [--prompts 2] [--samples 16] [--seq-len 512] [--modes bf16,fp8]

With no MODEL: the demo model, then each model under ``$SPECKV_MODELS`` (default
``~/.cache/speckv-models``) that the fetch script put there. Needs the hf extra. Calibrations are
cached as ``speckv eval`` caches them (``--recalibrate`` to time them afresh). Each row is
checked bit for bit. Run it alone: every figure is a time ratio on a shared CPU.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path
from typing import Any

from speckv.cli import build_parser
from speckv.cli.calibration_cache import calibrated_codec
from speckv.cli.evaluation import evaluate_args
from speckv.cli.predictor_spec import make_predictor
from speckv.hf import load_demo_model, load_model
from speckv.models.demo import bundled_text, prompts
from speckv.predictors import cost
from speckv.predictors.early_exit import ModelPrefixPredictor

DEFAULT_PREDICTORS = "stats,map,map+hidden,prefix:{third},prefix,fp8-bf16"
# the early-exit frontier of F. Finn, "Speculative KV coding II" (a draft post; Qwen3-8B, ideal
# code lengths, caches by the same kernels): (share of a prefill, b/s)
FINN_BF16 = ((0.04, 9.91), (0.15, 8.58), (0.36, 6.28), (0.52, 4.54), (0.68, 2.87))
FINN_FP8 = ((0.04, 5.89), (0.20, 4.68), (0.36, 3.64), (0.52, 2.59))


def fetched_models() -> list[Path]:
    folder = Path(os.environ.get("SPECKV_MODELS", Path.home() / ".cache" / "speckv-models"))
    return sorted(p for p in folder.glob("*.gguf") if Path(f"{p}.ok").exists())


def predictor_flops(predictor: Any, config: Any, tokens: int) -> float:
    """FLOPs of a predictor's work on one prompt, as a share of a recompute (every layer, the
    last token's logits; ``speckv.predictors.cost``)."""
    return cost.predictor_flops(predictor, config, tokens) / cost.recompute_flops(config, tokens)


def where_bits_go(result: dict[str, Any], predictor: Any, mode: str) -> str:
    rows = result["modes"][mode]["per_layer"]
    computed = int(getattr(predictor, "layers", 0)) if isinstance(predictor, ModelPrefixPredictor) else 0
    groups = {"model": rows[:computed], "mapped": rows[computed:]} if computed else {"all": rows}
    parts = []
    for name, group in groups.items():
        if group:
            k = sum(r["K"] for r in group) / len(group)
            v = sum(r["V"] for r in group) / len(group)
            parts.append(f"{name} {len(group)} layers K {k:.2f} V {v:.2f}")
    worst = max(rows, key=lambda r: r["K"] + r["V"])
    parts.append(f"most: layer {worst['layer']} (K {worst['K']:.2f} V {worst['V']:.2f})")
    return "; ".join(parts)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="*", help="GGUF files or transformers folders (default: demo + fetched)")
    p.add_argument("--predictors", default=DEFAULT_PREDICTORS)
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--samples", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--modes", default="bf16,fp8")
    p.add_argument("--recalibrate", action="store_true")
    args = p.parse_args()
    models: list[str | None] = list(args.models) or [None, *map(str, fetched_models())]
    text = bundled_text("legal")
    table = []
    for spec_model in models:
        model, tokenizer = load_model(spec_model) if spec_model else load_demo_model()
        label = Path(spec_model).name if spec_model else "SmolLM2-135M-Instruct"
        n = int(model.config.num_hidden_layers)
        eval_args = build_parser().parse_args(
            ["eval", "--samples", str(args.samples), "--seq-len", str(args.seq_len), "--modes", args.modes]
            + ["--prompts", str(args.prompts), "--text", "legal"]
            + (["--recalibrate"] if args.recalibrate else [])
        )
        eval_args.json = True  # quiet: no progress bars between the rows
        held_out = prompts(tokenizer, text, args.seq_len, args.prompts)
        for spec in args.predictors.format(third=max(1, n // 3)).split(","):
            make_predictor(spec, model)  # a bad name fails before any work
            start = time.perf_counter()
            codec, _, cached = calibrated_codec(eval_args, model, tokenizer, label, spec)
            calibration_s = time.perf_counter() - start
            result = evaluate_args(eval_args, codec, held_out)
            exact = all(m["exact_round_trip"] for m in result["modes"].values())
            row = {
                "model": label,
                "predictor": spec,
                "flops": predictor_flops(codec.predictor, cost.text_config(model), args.seq_len),
                "predict": result["modes"]["bf16"]["predict_over_prefill"] if "bf16" in result["modes"] else None,
                "calibration": "cached" if cached else f"{calibration_s:.0f} s",
                "exact": exact,
                "where": where_bits_go(result, codec.predictor, args.modes.split(",")[0]),
            }
            for mode, m in result["modes"].items():
                row[mode] = m["bits_per_scalar"]["with_container"]
                row[f"restore_{mode}"] = m["restore_over_prefill"]
                row[f"recompute_{mode}"] = m["restore_over_recompute"]
            table.append(row)
            print(_row(row, args.modes.split(",")), flush=True)
    print()
    modes = args.modes.split(",")
    print("| model | predictor | " + " | ".join(f"{m} b/s" for m in modes), end="")
    print(" | restore / prefill | restore / recompute | FLOPs / recompute | predict / prefill | calibration | exact |")
    print("|---|---|" + "---:|" * len(modes) + "---:|---:|---:|---:|---|---|")
    for row in table:
        cells = [f"{row[m]:.3f}" for m in modes]
        cells.append(f"{row[f'restore_{modes[0]}']:.2f}x | {row[f'recompute_{modes[0]}']:.2f}x")
        print(
            f"| {row['model']} | {row['predictor']} | " + " | ".join(cells) + f" | {row['flops']:.3f} | "
            f"{row['predict']:.2f}x | {row['calibration']} | {'yes' if row['exact'] else 'NO'} |"
        )
    print()
    for row in table:
        print(f"{row['model']} {row['predictor']}: {row['where']}")
    print()
    print(
        "early-exit frontier (F. Finn, Qwen3-8B, ideal code lengths): bf16 "
        + ", ".join(f"{b} at {c}" for c, b in FINN_BF16)
    )
    print("  fp8 " + ", ".join(f"{b} at {c}" for c, b in FINN_FP8))
    if not all(row["exact"] for row in table):
        raise SystemExit("bench_models: a round trip was not exact")


def _row(row: dict[str, Any], modes: list[str]) -> str:
    cells = " ".join(
        f"{m} {row[m]:.3f} b/s restore {row[f'restore_{m}']:.2f}x ({row[f'recompute_{m}']:.2f}x recompute)"
        for m in modes
    )
    return f"{row['model']} {row['predictor']}: {cells} flops {row['flops']:.3f} ({row['calibration']})"


if __name__ == "__main__":
    main()
