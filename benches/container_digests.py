"""Digests of what ``speckv.hf`` writes, for a before/after check of a change meant to keep the
bytes (a refactor, a speed-up): the demo model calibrated with every built-in predictor, two
held-out prompts compressed in bf16 and fp8 with the default coder model and the exact one.

    python benches/container_digests.py > after.txt            # this tree
    PYTHONPATH=OTHER/python python benches/container_digests.py > before.txt
    diff before.txt after.txt                                   # nothing: the same bytes

Each line: predictor, prompt, mode, coder model, SHA-256 (16 hex digits) and length of the
container; each predictor's calibration file's digest; whether the bf16 container decodes to
the cache bit for bit; and for the predictors a prefix store takes (``default``, ``map``,
``stats``), the digest of every entry a ``PrefixStore`` writes for both prompts (blocks of 64
tokens, the second prompt sharing the first's first block) and whether ``get`` returns them
bit for bit.
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
    PrefixStore,
    SpeculativeCodec,
    bundled_text,
    extract_kv,
    load_demo_model,
    prefill,
    prompts,
)
from speckv.store import MemoryBackend

STORE_BLOCK = 64


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
        if name in ("default", "map", "stats"):
            store_digests(name, codec, model, held_out)


def store_digests(name: str, codec: SpeculativeCodec, model: object, held_out: list[torch.Tensor]) -> None:
    """Every entry a prefix store writes for the held-out prompts (the second one starting
    with the first's first block, so that a block is found stored and walked past), and
    whether ``get`` serves each prompt's blocks bit for bit."""
    backend = MemoryBackend()
    store = PrefixStore(codec, backend, block_size=STORE_BLOCK)
    first, other = held_out
    second = torch.cat([first[:, :STORE_BLOCK], other[:, STORE_BLOCK:]], dim=1)
    for i, ids in enumerate((first, second)):
        cache = prefill(model, ids)
        store.put(ids, cache)
        got, n = store.get(ids)
        whole = ids.shape[1] // STORE_BLOCK * STORE_BLOCK
        exact = n == whole and all(
            torch.equal(a, b[:, :, :whole]) for pair, kv in zip(extract_kv(got), cache) for a, b in zip(pair, kv)
        )
        print(name, i, "store get", n, exact)
    for key in sorted(backend.keys()):
        print(name, "store entry", key[:16], digest(backend.get(key) or b""))


if __name__ == "__main__":
    main()
