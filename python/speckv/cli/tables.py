"""The tables the evaluating commands print: per mode, per layer, the predictors' trade-off and
the joint model's ablation (and their JSON forms)."""

from __future__ import annotations

import argparse
import json
from typing import Any


def summary_table(result: dict[str, Any]) -> str:
    head = (
        f"{'mode':5s} {'K b/s':>7s} {'V b/s':>7s} {'all b/s':>8s} {'ref ideal':>9s} {'coded/ideal':>11s} "
        f"{'vs raw':>7s} {'vs zstd19':>9s} {'enc Msym/s':>10s} {'dec Msym/s':>10s} {'exact':>5s}"
    )
    rows = [head]
    for mode, m in result["modes"].items():
        b = m["bits_per_scalar"]
        zstd = f"{m['zstd19_over_coded']:.2f}x" if m.get("zstd19_over_coded") else "n/a"
        rows.append(
            f"{mode:5s} {b['K']:7.3f} {b['V']:7.3f} {b['with_container']:8.3f} "
            f"{m['reference_ideal_bits_per_scalar']:9.3f} {m['coded_over_reference_ideal']:11.4f} "
            f"{m['ratio_vs_raw']:6.2f}x {zstd:>9s} {m['encode_msym_per_s']:10.1f} {_rate(m['decode_msym_per_s'])} "
            f"{'yes' if m['exact_round_trip'] else 'NO':>5s}"
        )
    return "\n".join(rows)


def _rate(value: float | None) -> str:
    return f"{value:10.1f}" if value is not None else f"{'n/a':>10s}"


def layer_table(result: dict[str, Any]) -> str:
    modes = list(result["modes"])
    head = f"{'layer':>5s} " + " ".join(f"{m + ' K':>8s} {m + ' V':>8s} {'ideal K':>8s} {'ideal V':>8s}" for m in modes)
    rows = [head]
    for i in range(len(result["modes"][modes[0]]["per_layer"])):
        cells = []
        for m in modes:
            r = result["modes"][m]["per_layer"][i]
            cells.append(f"{r['K']:8.3f} {r['V']:8.3f} {r['K_ideal']:8.3f} {r['V_ideal']:8.3f}")
        rows.append(f"{i:5d} " + " ".join(cells))
    return "\n".join(rows)


def print_result(args: argparse.Namespace, result: dict[str, Any], per_layer: bool) -> None:
    if args.json:
        print(json.dumps(result, indent=2, default=str))
        return
    print()
    print(summary_table(result))
    t = result["timing"]
    first = next(iter(result["modes"].values()))
    print(
        f"\npredictor ({t['predict_s']:.2f}s): {t['predictor_cost_over_prefill']:.2f}x the model's own prefill "
        f"({t['prefill_s']:.2f}s); encode+decode: {1 / first['codec_speedup_over_prefill']:.2f}x the prefill; "
        f"restore (predictor + decode): {first['restore_over_prefill']:.2f}x the prefill"
    )
    print("b/s = bits per scalar, container included; ref ideal = a single Gaussian around the predictor's mu with")
    print("the codec's sigma, integrated over each value's rounding interval in float64, floored at 2^-24;")
    print("raw = 16 (bf16) / 8 (fp8); restore = all that decompress costs, predictor included")
    coders = ", ".join(f"{mode} {m.get('coder', '?')}" for mode, m in result["modes"].items())
    print(f"residuals coded with the {coders} model (--coder)")
    if per_layer:
        print()
        print(layer_table(result))


def tradeoff_rows(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per predictor and mode: bits, predict / decode / restore cost as x prefill, and the link
    bandwidth below which sending speckv bytes and restoring beats sending the raw cache
    (``raw / B > coded / B + restore``, i.e. ``B < (raw - coded) / restore``)."""
    rows = []
    for r in results:
        for mode, m in r["modes"].items():
            prompts = max(r["prompts"], 1)
            restore_s = m["restore_over_prefill"] * m["prefill_s"] / prompts
            saved = (m["raw_bytes"] - m["bytes"]) / prompts
            rows.append(
                {
                    "predictor": r["predictor"],
                    "mode": mode,
                    "bits_per_scalar": m["bits_per_scalar"]["with_container"],
                    "predict_gflop": r.get("predict_gflop"),
                    "predict_over_recompute_flops": r.get("predict_over_recompute_flops"),
                    "predict_over_prefill": m["predict_over_prefill"],
                    "decode_over_prefill": m["decode_over_prefill"],
                    "restore_over_prefill": m["restore_over_prefill"],
                    "break_even_gbit_s": saved * 8 / restore_s / 1e9 if restore_s > 0 else None,
                    "beats_recompute": m["restore_over_prefill"] < 1.0,
                    "exact": m["exact_round_trip"],
                }
            )
    return rows


def tradeoff_table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'predictor':10s} {'mode':5s} {'b/s':>6s} {'GFLOP':>6s} {'FLOPs':>6s} "
        f"{'predict':>8s} {'decode':>7s} {'restore':>8s} "
        f"{'pays below':>11s} {'vs recompute':>12s} {'exact':>5s}"
    )
    out = [head]
    for r in rows:
        link = f"{r['break_even_gbit_s']:.2f} Gb/s" if r["break_even_gbit_s"] is not None else "n/a"
        gflop = f"{r['predict_gflop']:6.2f}" if r.get("predict_gflop") is not None else f"{'n/a':>6s}"
        share = (
            f"{r['predict_over_recompute_flops']:5.3f}x"
            if r.get("predict_over_recompute_flops") is not None
            else "   n/a"
        )
        out.append(
            f"{r['predictor']:10s} {r['mode']:5s} {r['bits_per_scalar']:6.3f} {gflop} {share} "
            f"{r['predict_over_prefill']:7.2f}x "
            f"{r['decode_over_prefill']:6.2f}x {r['restore_over_prefill']:7.2f}x {link:>11s} "
            f"{'cheaper' if r['beats_recompute'] else 'dearer':>12s} {'yes' if r['exact'] else 'NO':>5s}"
        )
    return "\n".join(out)


def print_tradeoff(args: argparse.Namespace, results: list[dict[str, Any]]) -> None:
    rows = tradeoff_rows(results)
    if args.json:
        print(json.dumps({"tradeoff": rows, "results": results}, indent=2, default=str))
        return
    print()
    print(tradeoff_table(rows))
    print(
        "b/s = bits per scalar (container included); GFLOP = what the predictor computes per prompt, counted\n"
        "from the config; FLOPs = that as x a recompute's (the published frontier's cost axis); predict /\n"
        "decode / restore = time as x the model's own prefill of the same prompt (restore = predict + decode:\n"
        "what decompress costs); pays below = the link bandwidth under which sending speckv bytes and restoring\n"
        "beats sending the raw cache; vs recompute = whether restoring is cheaper than running the prefill again"
    )


def ablation_table(rows: list[dict[str, Any]]) -> str:
    modes = list(rows[0]["modes"])
    head = f"{'component':46s} " + " ".join(
        f"{m + ' K':>7s} {m + ' V':>7s} {m + ' all':>8s} {'enc/dec':>11s}" for m in modes
    )
    out = [head + f" {'calibration':>12s}"]
    for r in rows:
        cells = []
        for m in modes:
            x = r["modes"][m]
            dec = x["decode_msym_per_s"] or 0.0
            cells.append(f"{x['K']:7.3f} {x['V']:7.3f} {x['all']:8.3f} {x['encode_msym_per_s']:5.0f}/{dec:<5.0f}")
        out.append(f"{r['component']:46s} " + " ".join(cells) + f" {r['calibration_bytes'] / 1e6:9.1f} MB")
    return "\n".join(out)
