"""The LMCache serde on the demo model's caches: bf16 chunks of 256 tokens in vLLM's layout
``[2, layers, tokens, hidden]``, coded with the predictor-free model and with per-channel
statistics fitted on the calibration text; sizes against raw, exact round trips.

    python benches/bench_lmcache.py [--prompts 2] [--chunk 256]

Needs the hf extra and the demo model; LMCache itself is not needed (the serde's chunk
functions are what its classes call).
"""

from __future__ import annotations

import argparse
import time

import torch

from speckv.hf import bundled_text, load_demo_model
from speckv.integrations.lmcache import chunk_of, decode_chunk, encode_chunk, fit_stats
from speckv.models.cache import prefill
from speckv.models.demo import prompts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--chunk", type=int, default=256)
    args = p.parse_args()
    model, tokenizer = load_demo_model()
    stats = fit_stats([prefill(model, ids) for ids in prompts(tokenizer, bundled_text("calibration"), 512, 8)])
    test = [prefill(model, ids) for ids in prompts(tokenizer, bundled_text("evaluation"), 512, args.prompts)]
    print(f"demo model, {args.prompts} held-out prompts x 512 tokens, chunks of {args.chunk} tokens, bf16")
    print(f"{'model':6s} {'raw/coded':>9s} {'b/scalar':>8s} {'exact':>5s} {'enc Msym/s':>10s} {'dec Msym/s':>10s}")
    for name, st in (("free", None), ("stats", stats)):
        raw = coded = 0
        exact = True
        enc = dec = 0.0
        for kv in test:
            chunk = chunk_of(kv)
            for start in range(0, chunk.shape[2], args.chunk):
                part = chunk[:, :, start : start + args.chunk].contiguous()
                t = time.perf_counter()
                data = encode_chunk(part, st)
                enc += time.perf_counter() - t
                out = torch.empty_like(part)
                t = time.perf_counter()
                decode_chunk(data, out, st)
                dec += time.perf_counter() - t
                exact &= torch.equal(out.view(torch.int16), part.view(torch.int16))
                raw += part.numel() * 2
                coded += len(data)
        n = raw / 2
        print(
            f"{name:6s} {raw / coded:8.3f}x {coded * 8 / n:8.3f} {'yes' if exact else 'NO':>5s} "
            f"{n / enc / 1e6:10.1f} {n / dec / 1e6:10.1f}"
        )


if __name__ == "__main__":
    main()
