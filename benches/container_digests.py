"""Digests of what ``speckv.hf`` writes, for a before/after check of a change meant to keep the
bytes (a refactor, a speed-up): the demo model calibrated with every built-in predictor, two
held-out prompts compressed in bf16 and fp8 with the default coder model and the exact one.

    python benches/container_digests.py > after.txt            # this tree
    PYTHONPATH=OTHER/python python benches/container_digests.py > before.txt
    diff before.txt after.txt                                   # nothing: the same bytes

Each line: predictor, prompt, mode, coder model, SHA-256 (16 hex digits) and length of the
container; each predictor's calibration file's digest; whether the bf16 container decodes to
the cache bit for bit.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import tempfile

import torch

from speckv.hf import (
    ChannelStatsPredictor,
    Fp8Predictor,
    ModelPrefixPredictor,
    SpeculativeCodec,
    bundled_text,
    extract_kv,
    load_demo_model,
    prefill,
    prompts,
)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("predictors", nargs="*", help="default, map, hidden, stats, fp8 (default: all)")
    args = parser.parse_args()
    model, tokenizer = load_demo_model()
    calibration = prompts(tokenizer, bundled_text("calibration"), 128, 8)
    held_out = prompts(tokenizer, bundled_text("evaluation"), 160, 2)
    predictors = {
        "default": lambda: ModelPrefixPredictor(model),
        "map": lambda: ModelPrefixPredictor(model, layers=1),
        "hidden": lambda: ModelPrefixPredictor(model, layers=3, hidden=True),
        "stats": lambda: ChannelStatsPredictor(),
        "fp8": lambda: Fp8Predictor(model),
    }
    for name, make in predictors.items():
        if args.predictors and name not in args.predictors:
            continue
        codec = SpeculativeCodec(model, predictor=make())
        codec.calibrate(calibration)
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "calibration.safetensors")
            codec.save(path)
            with open(path, "rb") as f:
                print(name, "calibration", digest(f.read()))
        for i, ids in enumerate(held_out):
            cache = prefill(model, ids)
            for mode in ("bf16", "fp8"):
                for coder in (None, "exact"):
                    data = codec.compress(cache, ids, dtype=mode, **({"model": coder} if coder else {}))
                    print(name, i, mode, coder or "default", digest(data), len(data), flush=True)
            restored = extract_kv(codec.decompress(codec.compress(cache, ids, dtype="bf16"), ids))
            exact = all(torch.equal(a, b) for pair, kv in zip(restored, cache) for a, b in zip(pair, kv))
            print(name, i, "round trip", exact)


if __name__ == "__main__":
    main()
