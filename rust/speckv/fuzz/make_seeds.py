"""Writes the `headers` target's seeds (fuzz/seeds/headers): real streams of every dtype,
predictor-free (both lanes) and predicted, in one chunk and in several, a stacked cache container and a
per-layer one whose layers hold different token counts (sliding windows).
Run from anywhere with speckv installed: python rust/speckv/fuzz/make_seeds.py"""

from pathlib import Path

import ml_dtypes
import numpy as np

import speckv
from speckv import container

OUT = Path(__file__).parent / "seeds" / "headers"
DTYPES = {
    "bfloat16": ml_dtypes.bfloat16,
    "float16": np.float16,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e5m2": ml_dtypes.float8_e5m2,
    "float32": np.float32,
}


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for name, dtype in DTYPES.items():
        x = rng.normal(size=(2, 3, 40)).astype(np.float32)
        mu = x + 0.01 * rng.normal(size=x.shape).astype(np.float32)
        sigma = np.full(40, 0.01, np.float32)
        for chunk in (64, 1000):
            (OUT / f"raw_{name}_{chunk}").write_bytes(speckv.encode(x.astype(dtype), chunk_size=chunk))
            if name != "float32":  # the default above is the adaptive lane at these sizes
                fast = speckv.encode(x.astype(dtype), chunk_size=chunk, lane="fast")
                (OUT / f"fast_{name}_{chunk}").write_bytes(fast)
            stream = speckv.encode(x.astype(dtype), mu=mu, sigma=sigma, chunk_size=chunk)
            (OUT / f"predicted_{name}_{chunk}").write_bytes(stream)
    layers, tokens, block = 2, 6, 4
    blocks = []
    for start in range(0, tokens, block):
        t = min(block, tokens - start)
        kv = rng.normal(size=(2, layers, 1, 2, t, 8)).astype(ml_dtypes.bfloat16)
        blocks.append([speckv.encode(half, chunk_size=2 * t * 8) for half in kv])
    packed = container.pack({"mode": "bf16"}, "stacked", layers, block, tokens, blocks)
    (OUT / "container_stacked").write_bytes(packed)
    # per layer, layers holding the last 6, 3 and 1 of 6 tokens (sliding windows): layer 2
    # holds none of block 0's tokens, so its entries there are empty
    held = [6, 3, 1]
    blocks = []
    for start in range(0, tokens, block):
        stop = min(start + block, tokens)
        streams = []
        for n in held:
            t = stop - max(start, tokens - n)
            for _ in range(2):
                x = rng.normal(size=(1, 2, t, 8)).astype(ml_dtypes.bfloat16) if t > 0 else None
                streams.append(speckv.encode(x) if x is not None else b"")
        blocks.append(streams)
    packed = container.pack({"mode": "bf16"}, "per-layer", 3, block, tokens, blocks, held)
    (OUT / "container_windowed").write_bytes(packed)


if __name__ == "__main__":
    main()
