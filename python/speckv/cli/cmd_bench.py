"""``speckv bench``: the codec's size and speed on a synthetic KV-like workload (no torch)."""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import numpy as np

from .._api import decode, encode, ideal_bits
from .._synthetic import workload


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bench", help="codec speed and size on a synthetic KV-like workload")
    p.add_argument("--scalars", type=int, default=1 << 22)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
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
