"""What a prefix store's blocks cost a restore: one prompt's cache restored from a
``PrefixStore`` at several block sizes (an engine stores its own block size: vLLM's CPU
backend 128 tokens) against the same cache restored from one container, and against the
model's prefill, per predictor.

    python benches/block_restore.py                              # map; 1,024 tokens
    python benches/block_restore.py --predictors map,stats --blocks 16,128,512 --json OUT.json

A store codes each block alone, given the blocks before it (``BlockCodec``), and restores a
prompt block by block: every block walks every layer (its maps, its decode calls), so a
restore's fixed costs per layer are paid once per block. Times are the best of ``--repeat``;
demo model, bundled held-out text; run it alone.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from speckv.cli.predictor_spec import make_predictor
from speckv.hf import (
    PrefixStore,
    SpeculativeCodec,
    bundled_text,
    load_demo_model,
    prefill,
    prompts,
)
from speckv.store import MemoryBackend

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import describe, line  # noqa: E402


def best(fn: Any, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--predictors", default="map", help="map, stats, default (comma-separated)")
    parser.add_argument("--blocks", default="16,64,128,256", help="block sizes in tokens")
    parser.add_argument("--tokens", type=int, default=1024, help="prompt length")
    parser.add_argument("--repeat", type=int, default=4)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    torch.set_num_threads(2)
    model, tokenizer = load_demo_model()
    calibration = prompts(tokenizer, bundled_text("calibration"), 512, 8)
    (ids,) = prompts(tokenizer, bundled_text("evaluation"), args.tokens, 1)
    cache = prefill(model, ids)
    prefill_s = best(lambda: prefill(model, ids), args.repeat)
    print(f"{line()}\ndemo model, {args.tokens} tokens; prefill {prefill_s * 1e3:.0f} ms (best of {args.repeat})")
    out: dict[str, Any] = {**describe(), "tokens": args.tokens, "prefill_s": prefill_s, "predictors": {}}
    for name in args.predictors.split(","):
        codec = SpeculativeCodec(model, predictor=make_predictor("prefix" if name == "default" else name, model))
        codec.calibrate(calibration)
        data = codec.compress(cache, ids)
        whole = best(lambda: codec.decompress(data, ids), args.repeat)  # noqa: B023
        rows = {"whole": whole}
        print(f"\n{name}: one container {whole * 1e3:.0f} ms ({whole / prefill_s:.2f}x the prefill)")
        for size in (int(b) for b in args.blocks.split(",")):
            store = PrefixStore(codec, MemoryBackend(), block_size=size)
            store.put(ids, cache)
            kv, n = store.get_kv(ids)
            if n != args.tokens // size * size:
                raise AssertionError(f"block {size}: {n} tokens restored")
            took = best(lambda: store.get_kv(ids), args.repeat)  # noqa: B023
            rows[str(size)] = took
            print(
                f"  blocks of {size:4d}: {took * 1e3:6.0f} ms  {took / whole:5.2f}x one container  "
                f"{took / prefill_s:5.2f}x the prefill"
            )
        out["predictors"][name] = rows
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
