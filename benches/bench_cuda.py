"""The CUDA module on a GPU: each parameter kernel's throughput against the device's own copy
bandwidth, and the bytes a compress call sends to the host with the kernels and without.

    python benches/bench_cuda.py [--scalars 67108864] [--json FILE]

Needs a CUDA device (exits with the reason otherwise). Bytes crossing to the host are counted
per cache scalar for what the Rust coder reads (target words, float32 mu; sigma codes are per
channel), against copying the target and the prediction as they are.
"""

from __future__ import annotations

import argparse
import json
import sys
import time


def _time(fn, repeat: int = 20) -> float:
    import torch

    fn()  # warm-up (and the module's first load)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scalars", type=int, default=1 << 26)
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()

    import torch

    import speckv.cuda

    if not speckv.cuda.available():
        sys.exit("bench_cuda: no CUDA device (or no cuda-bindings): nothing to measure")
    n = args.scalars
    t0 = time.perf_counter()
    speckv.cuda.coding_mu(torch.zeros(64, device="cuda"))  # compiles (or loads the cached cubin)
    first_use = time.perf_counter() - t0
    g = torch.Generator(device="cuda").manual_seed(0)
    pred = torch.randn(n // 64, 64, device="cuda", generator=g, dtype=torch.float32)
    true = (pred + 0.01 * torch.randn(pred.shape, device="cuda", generator=g)).to(torch.bfloat16)
    gain = torch.ones(64, device="cuda")
    sigma = torch.rand(n, device="cuda", generator=g) + 0.01

    copy_s = _time(lambda: pred.clone())
    copy_gbs = 2 * 4 * n / copy_s / 1e9  # read + write
    rows = []

    def add(name: str, fn, bytes_moved: int) -> None:
        s = _time(fn)
        gbs = bytes_moved / s / 1e9
        rows.append({"kernel": name, "seconds": s, "gb_per_s": gbs, "of_copy": gbs / copy_gbs})

    true32 = true.float()
    add("fp8_quantize (f32 -> e4m3)", lambda: speckv.cuda.fp8_quantize(true32, 0.0123), 5 * n)
    add("coding_mu (fp8: / scale * gain)", lambda: speckv.cuda.coding_mu(pred, 0.0123, gain), 8 * n)
    add("sigma_codes (f32 -> i16)", lambda: speckv.cuda.sigma_codes(sigma), 6 * n)

    # bytes per cache scalar that cross to the host in a compress call
    traffic = {
        "bf16 mode, copying target (bf16) and prediction (bf16)": 2 + 2,
        "bf16 mode, the coder's arrays (bf16 words + f32 mu)": 2 + 4,
        "fp8 mode, copying target (bf16) and prediction (bf16)": 2 + 2,
        "fp8 mode, the coder's arrays (e4m3 words + f32 mu)": 1 + 4,
    }
    report = {
        "device": torch.cuda.get_device_name(),
        "scalars": n,
        "first_use_s": first_use,
        "copy_gb_per_s": copy_gbs,
        "kernels": rows,
        "host_bytes_per_scalar": traffic,
    }
    print(f"{report['device']}: device copy {copy_gbs:.0f} GB/s (read + write); first use {first_use:.2f} s")
    for r in rows:
        print(f"  {r['kernel']:34s} {r['gb_per_s']:8.0f} GB/s  {r['of_copy']:6.1%} of the copy")
    print("bytes per cache scalar sent to the host:")
    for what, b in traffic.items():
        print(f"  {what:58s} {b}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)


if __name__ == "__main__":
    main()
