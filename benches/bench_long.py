"""Long prompts: the default predictor calibrated at 512 tokens, then held-out prompts of 512
and of 4,096 tokens (the bundled GPL-3 text, then the evaluation text): exact round trips, bits
per scalar, restore / prefill at each length, and the peak memory of ``compress`` and of
``decompress`` beyond what the process held before (the model, the raw cache), as a multiple
of the raw cache (decompress's includes the restored cache itself, 1x), after a short warm-up
round trip (one-time costs).

    python benches/bench_long.py [MODEL] [--lengths 512,4096] [--predictor prefix] [--mode bf16]

MODEL: a GGUF file or transformers folder (default: the demo model). Needs the hf extra; the
calibration is cached as ``speckv eval`` caches it. Run it alone (time ratios, RSS samples).
"""

from __future__ import annotations

import argparse
import threading
import time
from pathlib import Path
from typing import Any

import torch

from speckv.cli import build_parser
from speckv.cli.calibration_cache import calibrated_codec
from speckv.hf import extract_kv, load_demo_model, load_model
from speckv.models.cache import other_kernels, prefill
from speckv.models.demo import bundled_text
from speckv.predictors.calibration import fp8_quantize


def rss() -> int:
    """This process's resident set, bytes (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


class Peak:
    """The largest RSS seen (sampled every millisecond) while the block runs, minus the RSS
    before it."""

    def __enter__(self) -> Peak:
        self.base = self.peak = rss()
        self.done = False
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        return self

    def _watch(self) -> None:
        while not self.done:
            self.peak = max(self.peak, rss())
            time.sleep(0.001)

    def __exit__(self, *exc: Any) -> None:
        self.done = True
        self.thread.join()
        self.peak = max(self.peak, rss())

    @property
    def grew(self) -> int:
        return self.peak - self.base


def best(fn: Any, repeat: int) -> tuple[Any, float]:
    out, times = None, []
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return out, min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("model", nargs="?", help="GGUF file or transformers folder (default: the demo model)")
    p.add_argument("--lengths", default="512,4096")
    p.add_argument("--predictor", default="prefix")
    p.add_argument("--mode", default="bf16", choices=["bf16", "fp16", "fp8"])
    p.add_argument("--repeat", type=int, default=2)
    args = p.parse_args()
    model, tokenizer = load_model(args.model) if args.model else load_demo_model()
    label = Path(args.model).name if args.model else "SmolLM2-135M-Instruct"
    eval_args = build_parser().parse_args(["eval", "--samples", "16", "--seq-len", "512"])
    codec, path, _ = calibrated_codec(eval_args, model, tokenizer, label, args.predictor)
    ids = tokenizer(bundled_text("legal") + bundled_text("evaluation"), return_tensors="pt").input_ids
    print(f"{label}, predictor {args.predictor}, calibrated at 512 tokens ({path}); {args.mode}")
    # one-time costs (threads, torch's kernel caches) first, so that the peaks are the prompt's
    warm = ids[:, :64]
    codec.decompress(codec.compress(other_kernels(model, warm), warm, args.mode), warm)
    print("tokens    b/s  restore/prefill  compress peak  decompress peak  exact")
    for n in (int(x) for x in args.lengths.split(",")):
        prompt = ids[:, :n]
        _, t_prefill = best(lambda prompt=prompt: prefill(model, prompt), args.repeat)
        kv = other_kernels(model, prompt)
        raw = sum(t.numel() * (1 if args.mode == "fp8" else 2) for pair in kv for t in pair)
        with Peak() as enc:
            data = codec.compress(kv, prompt, args.mode)
        with Peak() as dec:
            restored = codec.decompress(data, prompt, dequantize=False)
        _, t_restore = best(lambda d=data, p=prompt: codec.decompress(d, p, dequantize=False), args.repeat)
        exact = True
        for layer, ((k, v), (k2, v2)) in enumerate(zip(kv, extract_kv(restored))):
            for which, (a, b) in enumerate(((k, k2), (v, v2))):
                if args.mode == "fp8":
                    ref = fp8_quantize(a, float(codec.require_calibration().fp8_scales[layer, which])).view(torch.uint8)
                    exact &= torch.equal(ref, b.view(torch.uint8))
                else:
                    word = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.mode]
                    exact &= torch.equal(a.to(word).view(torch.int16), b.view(torch.int16))
        scalars = sum(t.numel() for pair in kv for t in pair)
        print(
            f"{n:6d} {8 * len(data) / scalars:6.3f} {t_restore / t_prefill:15.2f}x "
            f"{enc.grew / raw:12.2f}x raw {dec.grew / raw:14.2f}x raw  {'yes' if exact else 'NO'}",
            flush=True,
        )
        if not exact:
            raise SystemExit("bench_long: a round trip was not exact")


if __name__ == "__main__":
    main()
