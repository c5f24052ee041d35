"""The CUDA module on a GPU: each elementwise kernel's throughput (parameters, calibration
statistics) against the device's own copy bandwidth, the GPU coder against the Rust encoder
on the host, a calibration on the GPU against one on the host, and the bytes a compress call
sends to the host: copying target and prediction, the parameter kernels' arrays, the GPU
coder's chunks.

    python benches/bench_cuda.py [--scalars 67108864] [--layers 30] [--tokens 512] [--json FILE]
    python benches/bench_cuda.py --traffic [legal|evaluation]

``--traffic`` needs no GPU: it compresses real caches of the demo model (fp8 predictor, two
512-token prompts of a bundled text, the calibration cached by ``speckv eval --predictor fp8``
or made here) and counts what the GPU path would send to the host for them: every stream's
chunk payloads plus a length and a fingerprint per chunk (the bytes are the same on either
path, so the count is exact), against copying target and prediction.

Needs a CUDA device (exits with the reason otherwise). The coder runs on a synthetic cache of
the demo model's shape (layers x 3 heads x tokens x 64 channels, K or V) whose residuals are
Gaussian with per-channel sigmas, and checks that its bytes are the host encoder's. The
calibration runs on a randomly initialised model of the demo model's shape (nothing to
download), fp8 predictor, 8 prompts.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

import numpy as np


def _time(fn, repeat: int = 20, device: str = "cuda") -> float:
    """Fastest of ``repeat`` runs of ``fn`` after a warm-up, in seconds (CUDA events on a GPU;
    the clock on the CPU, where the tests drive `_coder` through the kernels' host build)."""
    import torch

    fn()  # warm-up (and the module's first load)
    if device != "cuda":
        best = float("inf")
        for _ in range(repeat):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        return best
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    best = float("inf")
    for _ in range(repeat):
        start.record()
        fn()
        end.record()
        end.synchronize()
        best = min(best, start.elapsed_time(end) / 1e3)
    return best


def _kernel_times(fn) -> dict[str, float] | str:
    """Device time per speckv kernel of one call of ``fn`` (torch's profiler: CUPTI sees the
    driver API's launches too), in milliseconds; where the profiler cannot say, why, as a
    string (a breakdown is a hint for the next optimisation, never a reason to fail the run)."""
    import torch

    try:
        from torch.profiler import ProfilerActivity, profile

        fn()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        times: dict[str, float] = {}
        for event in prof.key_averages():
            if event.key.startswith("speckv_"):
                us = getattr(event, "device_time_total", None) or getattr(event, "cuda_time_total", 0.0)
                times[event.key] = times.get(event.key, 0.0) + float(us) / 1e3
        return times or "the profiler saw no speckv kernel"
    except Exception as e:  # noqa: BLE001 - any failure only costs the breakdown
        return f"{type(e).__name__}: {e}"


def _coder(layers: int, tokens: int, device: str = "cuda") -> list[dict]:
    """The GPU coder (``speckv.cuda.encode``) on a synthetic K cache of the demo model's shape
    in both storage modes and at three chunk sizes, against ``speckv.encode`` on the host (every
    core), with the bytes compared."""
    import torch

    import speckv
    import speckv.cuda

    g = torch.Generator(device=device).manual_seed(1)
    shape = (layers, 1, 3, tokens, 64)
    sigma = torch.exp2(torch.rand((layers, 1, 3, 1, 64), device=device, generator=g) * 4 - 7)
    pred = torch.randn(shape, device=device, generator=g)
    true = pred + sigma * torch.randn(shape, device=device, generator=g)
    scale = float(true.abs().max()) / 448
    # a joint model of the keys' shape: lower-triangular coefficients over a layer's 192
    # channels (channel-major layers, as the codec codes them)
    channels = 3 * 64
    coef = torch.randn((layers, channels, channels), generator=torch.Generator().manual_seed(2)) * 0.05
    joint = speckv.Joint(channels, tokens, torch.tril(coef, -1).numpy(), np.zeros((layers, channels), np.float32))
    rows = []
    for mode in ("bf16", "fp8", "bf16 joint"):
        if mode == "fp8":
            x, mu, s = speckv.cuda.fp8_quantize(true, scale), speckv.cuda.coding_mu(pred, scale), sigma / scale
        else:
            x, mu, s = true.to(torch.bfloat16), pred.to(torch.bfloat16).float(), sigma
        codes = speckv.cuda.sigma_codes(s).expand(shape)
        with_joint = joint if mode.endswith("joint") else None
        if with_joint is not None:  # channel-major
            x, mu, codes = (a.transpose(-1, -2).contiguous() for a in (x, mu, codes))
        host = (x.cpu(), mu.cpu(), codes.cpu())
        layer = 3 * tokens * 64
        for chunk in (2 * layer, 16384, 4096) if with_joint is None else (2 * layer, layer):
            encode = functools.partial(speckv.cuda.encode, x, mu, codes, chunk_size=chunk, joint=with_joint)
            data = encode()
            gpu_s = _time(encode, repeat=5, device=device)
            t0 = time.perf_counter()
            want = speckv.encode(
                *host[:2], sigma_codes=host[2], chunk_size=chunk, threads=os.cpu_count(), joint=with_joint
            )
            host_s = time.perf_counter() - t0
            n = x.numel()
            chunks = -(-n // chunk)
            header = 24 + 8 * len(shape) + 48 + 32 * chunks + 8  # format/header.rs
            rows.append(
                {
                    "mode": mode,
                    "chunk": chunk,
                    "gpu_s": gpu_s,
                    "gpu_msym_s": n / gpu_s / 1e6,
                    "host_s": host_s,
                    "bits_per_scalar": 8 * len(data) / n,
                    # the coded chunks, a length and a fingerprint per chunk
                    "host_bytes": (len(data) - header + 12 * chunks) / n,
                    "same_bytes": data == want,
                    # where the GPU coder's time goes (GPU only)
                    "kernel_ms": _kernel_times(encode) if device == "cuda" else "not on a GPU",
                }
            )
    return rows


def demo_traffic(text: str) -> dict:
    """Host-bound bytes per cache scalar of a compress call with the GPU coder, on the demo
    model's caches (see the module's notes)."""
    from speckv import container
    from speckv.cli.calibration_cache import calibrated_codec
    from speckv.models.cache import other_kernels
    from speckv.models.demo import bundled_text, load_demo_model, prompts

    settings = argparse.Namespace(
        calibration=None,
        predictor="fp8",
        block_size=None,
        calibration_text=None,
        samples=32,
        seq_len=512,
        recalibrate=False,
        quiet=True,
    )
    import speckv

    model, tokenizer = load_demo_model()
    codec, _, _ = calibrated_codec(settings, model, tokenizer, "demo model")
    report = {}
    for mode in ("bf16", "fp8"):
        scalars = payload = chunks = 0
        for prompt in prompts(tokenizer, bundled_text(text), 512, 2):
            data = codec.compress(other_kernels(model, prompt), prompt, mode)
            for block in container.parse(data).blocks:
                for stream in block:
                    facts = speckv.info(bytes(stream.data))
                    scalars += facts["n_scalars"]
                    payload += facts["payload_bytes"]
                    chunks += facts["chunks"]
        coder = (payload + 12 * chunks) / scalars
        arrays = 2 + 4 if mode == "bf16" else 1 + 4
        report[mode] = {"scalars": scalars, "chunks": chunks, "gpu_coder": coder, "copy": 4, "arrays": arrays}
        print(
            f"{text}, {mode} mode ({'joint' if codec.joint else 'plain'} model): to the host per cache scalar, "
            f"GPU coder {coder:.3f} B; copying target and prediction 4 B (x{4 / coder:.2f}); "
            f"the parameter kernels' arrays {arrays} B (x{arrays / coder:.2f})"
        )
    return report


def _kernels(n: int, device: str = "cuda") -> tuple[float, list[dict]]:
    """The device's copy bandwidth (read + write, GB/s) and each elementwise kernel's
    throughput on ``n`` scalars, as GB/s and as a fraction of the copy."""
    import torch

    import speckv.cuda
    from speckv.predictors.calibration import fp8_quantize

    g = torch.Generator(device=device).manual_seed(0)
    pred = torch.randn(n // 64, 64, device=device, generator=g, dtype=torch.float32)
    true = (pred + 0.01 * torch.randn(pred.shape, device=device, generator=g)).to(torch.bfloat16)
    gain = torch.ones(64, device=device)
    sigma = torch.rand(n, device=device, generator=g) + 0.01
    copy_s = _time(lambda: pred.clone(), device=device)
    copy_gbs = 2 * 4 * n / copy_s / 1e9  # read + write
    rows = []

    def add(name: str, fn, bytes_moved: int) -> None:
        s = _time(fn, device=device)
        gbs = bytes_moved / s / 1e9
        rows.append({"kernel": name, "seconds": s, "gb_per_s": gbs, "of_copy": gbs / copy_gbs})

    true32 = true.float()
    add("fp8_quantize (f32 -> e4m3)", lambda: speckv.cuda.fp8_quantize(true32, 0.0123), 5 * n)
    add("coding_mu (fp8: / scale * gain)", lambda: speckv.cuda.coding_mu(pred, 0.0123, gain), 8 * n)
    add("sigma_codes (f32 -> i16)", lambda: speckv.cuda.sigma_codes(sigma), 6 * n)
    # calibration statistics: a [1, 4, tokens, 64] cache with its predictions, exact sums
    cache = true32.reshape(1, 4, -1, 64)
    p8, q = pred.reshape(cache.shape), fp8_quantize(cache.cpu(), 0.0123).float().to(device)
    stats = (cache, pred.reshape(cache.shape), p8, q, 0.0123)
    add("channel_sums (4 x f32 -> exact sums)", lambda: speckv.cuda.channel_sums(*stats), 16 * n)
    return copy_gbs, rows


def _calibration(layers: int, tokens: int, samples: int, device: str) -> float:
    """Seconds to calibrate a randomly initialised model of the demo model's shape
    (SmolLM2-135M: hidden 576, 9 heads, 3 KV heads of 64; ``layers`` layers) with the fp8
    predictor on ``samples`` prompts of ``tokens`` random tokens, model and predictor on
    ``device`` (statistics summed there: ``speckv.cuda.channel_sums``)."""
    import torch
    import transformers

    from speckv.hf import Fp8Predictor
    from speckv.predictors.calibration import calibrate

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,
        max_position_embeddings=max(2048, tokens),
    )
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval().to(device)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 49152, (1, tokens), generator=g).to(device) for _ in range(samples)]
    predictor = Fp8Predictor(model, device=device) if device == "cuda" else Fp8Predictor(model)
    calibrate(model, predictor, prompts[:1], fingerprint="bench")  # warm-up
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    calibrate(model, predictor, prompts, fingerprint="bench")
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def run(n: int, layers: int, tokens: int, device: str = "cuda", samples: int = 8) -> dict:
    """Every figure of the GPU benchmark (see the module's notes), printed and returned."""
    import torch

    import speckv.cuda

    t0 = time.perf_counter()
    speckv.cuda.coding_mu(torch.zeros(64, device=device))  # compiles (or loads the cached cubins)
    first_use = time.perf_counter() - t0
    copy_gbs, rows = _kernels(n, device)
    coder = _coder(layers, tokens, device)
    calibration = {
        "layers": layers,
        "tokens": tokens,
        "samples": samples,
        "host_s": _calibration(layers, tokens, samples, "cpu"),
    }
    if device == "cuda":
        calibration["gpu_s"] = _calibration(layers, tokens, samples, "cuda")
    # bytes per cache scalar that cross to the host in a compress call
    traffic = {
        "bf16 mode, copying target (bf16) and prediction (bf16)": 2 + 2,
        "bf16 mode, the parameter kernels' arrays (bf16 words + f32 mu)": 2 + 4,
        "fp8 mode, copying target (bf16) and prediction (bf16)": 2 + 2,
        "fp8 mode, the parameter kernels' arrays (e4m3 words + f32 mu)": 1 + 4,
    }
    for row in coder:
        traffic[f"{row['mode']} mode, the GPU coder's chunks ({row['chunk']} scalars a chunk)"] = row["host_bytes"]
    report = {
        "device": torch.cuda.get_device_name() if device == "cuda" else device,
        "scalars": n,
        "first_use_s": first_use,
        "copy_gb_per_s": copy_gbs,
        "kernels": rows,
        "coder": coder,
        "calibration": calibration,
        "host_bytes_per_scalar": traffic,
    }
    print(f"{report['device']}: device copy {copy_gbs:.0f} GB/s (read + write); first use {first_use:.2f} s")
    for r in rows:
        print(f"  {r['kernel']:38s} {r['gb_per_s']:8.0f} GB/s  {r['of_copy']:6.1%} of the copy")
    print(f"GPU coder vs the Rust encoder ({os.cpu_count()} threads), {layers} layers x {tokens} tokens:")
    for r in coder:
        gpu = f"GPU {r['gpu_s'] * 1e3:7.1f} ms ({r['gpu_msym_s']:6.0f} Msym/s)"
        host = f"host {r['host_s'] * 1e3:7.1f} ms: x{r['host_s'] / r['gpu_s']:.1f}"
        size = f"{r['bits_per_scalar']:.3f} b/s, same bytes: {r['same_bytes']}"
        print(f"  {r['mode']:10s} chunks of {r['chunk']:6d}: {gpu}, {host}; {size}")
        steps = r["kernel_ms"]
        if isinstance(steps, dict):
            print("    " + ", ".join(f"{k.removeprefix('speckv_')} {v:.3f} ms" for k, v in steps.items()))
        else:
            print(f"    kernels: {steps}")
    where = f"{samples} prompts x {tokens} tokens, {layers} layers of the demo model's shape, fp8 predictor"
    host = f"host {calibration['host_s']:.2f} s ({os.cpu_count()} threads)"
    gpu = (
        f", GPU {calibration['gpu_s']:.2f} s: x{calibration['host_s'] / calibration['gpu_s']:.1f}"
        if "gpu_s" in calibration
        else ""
    )
    print(f"calibration ({where}): {host}{gpu}")
    print("bytes per cache scalar sent to the host (and the cut against copying target and prediction):")
    for what, b in traffic.items():
        print(f"  {what:72s} {b:6.3f}  x{4 / b:.1f}")
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scalars", type=int, default=1 << 26)
    parser.add_argument("--layers", type=int, default=30, help="layers of the coder's synthetic cache")
    parser.add_argument("--tokens", type=int, default=512, help="tokens of the coder's synthetic cache")
    parser.add_argument("--json", help="also write the figures to this file")
    parser.add_argument("--traffic", nargs="?", const="legal", help="count host-bound bytes on the demo model (no GPU)")
    args = parser.parse_args()
    if args.traffic:
        report = demo_traffic(args.traffic)
    else:
        import speckv.cuda

        if not speckv.cuda.available():
            sys.exit("bench_cuda: no CUDA device (or no cuda-bindings): nothing to measure")
        report = run(args.scalars, args.layers, args.tokens)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
