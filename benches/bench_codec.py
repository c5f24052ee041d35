"""Side-by-side benchmark of the speckv codec on a synthetic KV-like workload.

Everything is measured in one run on the same data, and reported as ratios, because absolute
times on a shared machine are noisy:

* bits/scalar: speckv coded stream, speckv's `ideal_bits` (its own fixed-point model), the
  continuous ideal of the same mixture (float64, integrated over each value's rounding
  interval), the single-Gaussian reference (floored at 2^-24), zstd-19, and the predictor-free
  table of ``predictor_free.py`` (speckv's fast and adaptive lanes, zipnn, zstd -3/-19,
  constriction's ANS, each round trip checked);
* encode/decode throughput of speckv (1 thread, all threads; the exact model also with its
  portable kernels, `SPECKV_SIMD=0`, in a child process) and of constriction's
  `stream.queue.RangeEncoder` with `QuantizedGaussian` on the same ordinal residuals and scales.

Usage: python benches/bench_codec.py [--scalars N] [--json out.json] [--repeat K]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time

import machine
import ml_dtypes
import numpy as np
import predictor_free

import speckv
from speckv._synthetic import workload

SQRT1_2 = 0.7071067811865476


def _erfc(z):
    from scipy.special import erfc

    return erfc(z)


def interval_mass(lo, hi):
    """Phi(hi) - Phi(lo), accurate in both tails."""
    out = np.empty_like(lo)
    right = lo >= 0
    left = hi <= 0
    mid = ~(right | left)
    out[right] = 0.5 * (_erfc(lo[right] * SQRT1_2) - _erfc(hi[right] * SQRT1_2))
    out[left] = 0.5 * (_erfc(-hi[left] * SQRT1_2) - _erfc(-lo[left] * SQRT1_2))
    out[mid] = 1.0 - 0.5 * (_erfc(-lo[mid] * SQRT1_2) + _erfc(hi[mid] * SQRT1_2))
    return out


def rounding_interval(x):
    """[lo, hi] of the reals that round to each bf16 value (float64)."""
    bits = x.view(np.uint16).astype(np.int32)
    sign = bits >> 15
    mag = bits & 0x7FFF
    ordinal = np.where(sign == 0, mag, -mag - 1)

    def from_ordinal(o):
        o = np.clip(o, -0x7F80, 0x7F80)
        b = np.where(o >= 0, o, (-(o + 1)) | 0x8000).astype(np.uint16)
        return b.view(ml_dtypes.bfloat16).astype(np.float64)

    v = x.astype(np.float64)
    below = from_ordinal(ordinal - 1)
    above = from_ordinal(ordinal + 1)
    return (v + below) / 2, (v + above) / 2


def continuous_ideals(x, mu, sigma):
    """Bits of the continuous mixture (same weights, uniform escape) and of the single-Gaussian
    reference method, both integrated over each value's rounding interval in float64."""
    lo, hi = rounding_interval(x.reshape(-1))
    m = np.broadcast_to(mu, x.shape).reshape(-1).astype(np.float64)
    s = np.broadcast_to(sigma, x.shape).reshape(-1).astype(np.float64)
    finite = np.isfinite(lo) & np.isfinite(hi)
    lo, hi, m, s = lo[finite], hi[finite], m[finite], s[finite]
    narrow = interval_mass((lo - m) / s, (hi - m) / s)
    wide = interval_mass((lo - m) / (3 * s), (hi - m) / (3 * s))
    wn, ww, we = (w / 65536 for w in speckv._speckv.DEFAULT_WEIGHTS)
    mixture = wn * narrow + ww * wide + we * 2.0**-16
    single = np.maximum(narrow, 2.0**-24)
    return float(-np.log2(mixture).sum()), float(-np.log2(single).sum())


def best_time(fn, repeat):
    best = float("inf")
    out = None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def ordinal_residuals_and_scales(x, mu, sigma):
    """The same integer view speckv codes: d = ord(x) - ord(bf16(mu)), s = sigma / ulp(mu)."""

    def ordinal(a):
        b = a.view(np.uint16).astype(np.int64)
        return np.where(b >> 15 == 0, b & 0x7FFF, -(b & 0x7FFF) - 1)

    mu16 = mu.astype(ml_dtypes.bfloat16)
    d = (ordinal(x) - ordinal(mu16)).reshape(-1)
    exponent = (mu16.view(np.uint16).astype(np.int64) >> 7) & 0xFF
    ulp = np.exp2(np.maximum(exponent, 1) - 127 - 7)
    s = (np.broadcast_to(sigma, x.shape) / ulp).reshape(-1)
    return d, s


def constriction_coder(d, s):
    """constriction's range coder (``stream.queue``) with a quantised Gaussian per symbol on
    speckv's ordinal residuals ``d`` and scales ``s`` (``ordinal_residuals_and_scales``):
    ``(encode(), decode(compressed), symbols)``, what this script and the pytest-benchmark
    suite both time."""
    import constriction

    limit = 1 << 15
    symbols = np.clip(d, -limit, limit - 1).astype(np.int32)
    means = np.zeros(len(symbols), dtype=np.float64)
    stds = np.clip(s, 0.05, 1e4).astype(np.float64)
    family = constriction.stream.model.QuantizedGaussian(-limit, limit - 1)

    def encode():
        e = constriction.stream.queue.RangeEncoder()
        e.encode(symbols, family, means, stds)
        return e.get_compressed()

    def decode(compressed):
        return constriction.stream.queue.RangeDecoder(compressed).decode(family, means, stds)

    return encode, decode, symbols


def bench_constriction(d, s, repeat):
    encode, decode, symbols = constriction_coder(d, s)
    t_enc, compressed = best_time(encode, repeat)
    t_dec, decoded = best_time(lambda: decode(compressed), repeat)
    assert np.array_equal(decoded, symbols), "constriction round trip failed"
    return t_enc, t_dec, compressed.nbytes * 8


def portable_speeds(x, mu, sigma, repeat: int) -> tuple[float, float]:
    """1-thread exact-model encode/decode Msym/s with the portable kernels (`SPECKV_SIMD=0`),
    in a child process (the kernel choice is made once per process)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        np.save(f"{tmp}/x.npy", x.view(np.uint16))
        np.save(f"{tmp}/mu.npy", mu)
        np.save(f"{tmp}/sigma.npy", sigma)
        code = f"""
import time, numpy as np, ml_dtypes, speckv
assert speckv.kernels() == "portable"
x = np.load({tmp!r} + "/x.npy").view(ml_dtypes.bfloat16)
mu = np.load({tmp!r} + "/mu.npy"); sigma = np.load({tmp!r} + "/sigma.npy")
te = td = float("inf")
for _ in range({repeat}):
    t = time.perf_counter(); data = speckv.encode(x, mu, sigma, threads=1); te = min(te, time.perf_counter() - t)
    t = time.perf_counter(); speckv.decode(data, mu, sigma, threads=1); td = min(td, time.perf_counter() - t)
print(x.size / te / 1e6, x.size / td / 1e6)
"""
        env = dict(os.environ, SPECKV_SIMD="0")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    enc, dec = out.stdout.split()
    return float(enc), float(dec)


def peak_extra_memory(x, mu, sigma, op: str) -> float:
    """Peak resident memory that one `op` needs beyond its inputs and its output, in units of
    x's size.

    A fresh child process loads the arrays from .npy files, resets the kernel's peak-RSS mark
    (Linux: write 5 to /proc/self/clear_refs) so nothing before counts, runs the operation once,
    and reports how far the peak rose above the resident size at the reset."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        np.save(f"{tmp}/x.npy", x.view(np.uint16))
        np.save(f"{tmp}/mu.npy", mu)
        np.save(f"{tmp}/sigma.npy", sigma)
        if op == "decode":
            with open(f"{tmp}/stream.bin", "wb") as f:
                f.write(speckv.encode(x, mu, sigma))
        code = f"""
import numpy as np, ml_dtypes, speckv
x = np.load({tmp!r} + "/x.npy").view(ml_dtypes.bfloat16)
mu = np.load({tmp!r} + "/mu.npy"); sigma = np.load({tmp!r} + "/sigma.npy")
data = open({tmp!r} + "/stream.bin", "rb").read() if {op!r} == "decode" else None
def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024
open("/proc/self/clear_refs", "w").write("5")
before = status("VmRSS:")
out = speckv.encode(x, mu, sigma, threads=1) if {op!r} == "encode" else speckv.decode(data, mu, sigma, threads=1)
extra = status("VmHWM:") - before
# the returned stream or array is the product, not overhead
extra -= len(out) if {op!r} == "encode" else out.nbytes
print(max(extra, 0) / x.nbytes)
"""
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return float(out.stdout.strip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scalars", type=int, default=1 << 22)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", default="bench_results.json")
    args = ap.parse_args()

    x, mu, sigma = workload(args.scalars)
    n = x.size
    threads_all = os.cpu_count() or 1
    res: dict = {
        "scalars": n,
        "dtype": "bfloat16",
        "threads_all": threads_all,
        "machine": platform.machine(),
        **machine.describe(),
        "format_version": speckv.FORMAT_VERSION,
    }

    streams = {}
    for model in ("exact", "fast"):
        data = speckv.encode(x, mu, sigma, threads=1, model=model)
        assert data == speckv.encode(x, mu, sigma, threads=threads_all, model=model), "bytes depend on threads"
        y = speckv.decode(data, mu, sigma, threads=threads_all)
        assert np.array_equal(y.view(np.uint16), x.view(np.uint16)), "round trip failed"
        streams[model] = data
    data = streams["exact"]
    ideal = speckv.ideal_bits(x, mu, sigma)
    ideal_fast = speckv.ideal_bits(x, mu, sigma, model="fast")
    cont_mix, cont_single = continuous_ideals(x, mu, sigma)
    free_rows = predictor_free.measure(x, args.repeat, threads_all)
    free = {r["name"]: r for r in free_rows if "skipped" not in r}

    import zstandard

    zstd_bytes = len(zstandard.ZstdCompressor(level=19).compress(x.tobytes()))
    res["bits"] = {
        "speckv_coded": len(data) * 8 / n,
        "speckv_ideal": ideal / n,
        "speckv_fast_coded": len(streams["fast"]) * 8 / n,
        "speckv_fast_ideal": ideal_fast / n,
        "continuous_mixture_ideal": cont_mix / n,
        "single_gaussian_reference": cont_single / n,
        "zstd19": zstd_bytes * 8 / n,
        "speckv_predictor_free": next(r["bits"] for k, r in free.items() if k.startswith("speckv fast lane (")),
        "zipnn": next((r["bits"] for k, r in free.items() if k.startswith("zipnn")), None),
    }
    res["predictor_free"] = free_rows

    speeds = {}
    for model, prefix in (("exact", "speckv"), ("fast", "speckv_fast")):
        for label, t in (("1t", 1), ("all", threads_all)):
            te, _ = best_time(lambda t=t, m=model: speckv.encode(x, mu, sigma, threads=t, model=m), args.repeat)
            td, _ = best_time(lambda t=t, m=model: speckv.decode(streams[m], mu, sigma, threads=t), args.repeat)
            speeds[f"{prefix}_encode_{label}"] = n / te / 1e6
            speeds[f"{prefix}_decode_{label}"] = n / td / 1e6
    portable = portable_speeds(x, mu, sigma, args.repeat)
    speeds["speckv_portable_encode_1t"], speeds["speckv_portable_decode_1t"] = portable
    d, s = ordinal_residuals_and_scales(x, mu, sigma)
    ce, cd, cbits = bench_constriction(d, s, args.repeat)
    speeds["constriction_encode"] = n / ce / 1e6
    speeds["constriction_decode"] = n / cd / 1e6
    res["bits"]["constriction_gaussian"] = cbits / n
    res["msym_per_s"] = speeds
    res["ratios"] = {
        "coded_over_ideal": res["bits"]["speckv_coded"] / res["bits"]["speckv_ideal"],
        "ideal_over_continuous_mixture": res["bits"]["speckv_ideal"] / res["bits"]["continuous_mixture_ideal"],
        "zstd19_over_coded": res["bits"]["zstd19"] / res["bits"]["speckv_coded"],
        "fast_coded_over_exact_coded": res["bits"]["speckv_fast_coded"] / res["bits"]["speckv_coded"],
        "encode_vs_constriction_1t": speeds["speckv_encode_1t"] / speeds["constriction_encode"],
        "decode_vs_constriction_1t": speeds["speckv_decode_1t"] / speeds["constriction_decode"],
        "portable_encode_vs_constriction_1t": speeds["speckv_portable_encode_1t"] / speeds["constriction_encode"],
        "portable_decode_vs_constriction_1t": speeds["speckv_portable_decode_1t"] / speeds["constriction_decode"],
        "fast_encode_vs_constriction_1t": speeds["speckv_fast_encode_1t"] / speeds["constriction_encode"],
        "fast_decode_vs_constriction_1t": speeds["speckv_fast_decode_1t"] / speeds["constriction_decode"],
        "encode_thread_scaling": speeds["speckv_encode_all"] / speeds["speckv_encode_1t"],
        "decode_thread_scaling": speeds["speckv_decode_all"] / speeds["speckv_decode_1t"],
        "fast_encode_thread_scaling": speeds["speckv_fast_encode_all"] / speeds["speckv_fast_encode_1t"],
        "fast_decode_thread_scaling": speeds["speckv_fast_decode_all"] / speeds["speckv_fast_decode_1t"],
    }
    res["peak_extra_memory_over_input"] = {
        "encode": peak_extra_memory(x, mu, sigma, "encode"),
        "decode": peak_extra_memory(x, mu, sigma, "decode"),
    }

    rows = [
        ("speckv exact: coded stream", res["bits"]["speckv_coded"]),
        ("speckv exact: ideal_bits (its own model)", res["bits"]["speckv_ideal"]),
        ("speckv fast: coded stream", res["bits"]["speckv_fast_coded"]),
        ("speckv fast: ideal_bits", res["bits"]["speckv_fast_ideal"]),
        ("continuous mixture ideal", res["bits"]["continuous_mixture_ideal"]),
        ("single-Gaussian reference (floor 2^-24)", res["bits"]["single_gaussian_reference"]),
        ("constriction QuantizedGaussian", res["bits"]["constriction_gaussian"]),
        ("speckv predictor-free (fast lane)", res["bits"]["speckv_predictor_free"]),
        ("zstd -19", res["bits"]["zstd19"]),
        ("zipnn (round trip: see below)", res["bits"]["zipnn"]),
    ]
    print(
        f"workload: {n} bf16 scalars, sigma over two decades, 0.5% outliers; format v{res['format_version']}\n"
        f"on {machine.line()}"
    )
    print(f"{'size':45s} {'bits/scalar':>12s}")
    for name, v in rows:
        print(f"{name:45s} {'n/a' if v is None else f'{v:12.4f}':>12s}")
    print(f"\n{'speed (Msym/s)':45s} {'encode':>10s} {'decode':>10s}")
    print(f"{'speckv exact, 1 thread':45s} {speeds['speckv_encode_1t']:10.1f} {speeds['speckv_decode_1t']:10.1f}")
    for name, enc, dec in (
        (f"speckv exact, {threads_all} threads", "speckv_encode_all", "speckv_decode_all"),
        ("speckv exact, portable kernels, 1 thread", "speckv_portable_encode_1t", "speckv_portable_decode_1t"),
        ("speckv fast, 1 thread", "speckv_fast_encode_1t", "speckv_fast_decode_1t"),
        (f"speckv fast, {threads_all} threads", "speckv_fast_encode_all", "speckv_fast_decode_all"),
        ("constriction 0.5, 1 thread", "constriction_encode", "constriction_decode"),
    ):
        print(f"{name:45s} {speeds[enc]:10.1f} {speeds[dec]:10.1f}")
    print("\nratios")
    for k, v in res["ratios"].items():
        print(f"  {k:40s} {v:8.4f}")
    predictor_free.print_rows("predictor-free, the same tensor (every round trip checked)", free_rows)
    print(
        "peak extra memory / input size: "
        + ", ".join(f"{k} {v:.3f}" for k, v in res["peak_extra_memory_over_input"].items())
    )
    with open(args.json, "w") as f:
        json.dump(res, f, indent=2)
    print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
