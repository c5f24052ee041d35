"""vLLM's GPU paged layouts on a device (issue 37's GPU half): for every ``KVCacheLayout`` and
cache dtype, a request's blocks read from and written into buffers laid out as vLLM lays them
out (``tests/data/vllm_kv_layouts.json``, exported from the installed vLLM by
``tests/paged_gpu_cases.py --export``: a GPU machine has no vLLM), checked bit for bit against
the reading vLLM's FlashAttention and Triton backends make of the same tensor, the blocks not
named untouched, a round trip through speckv's fast lane; and the device<->host bandwidth of
``PagedLayout.copy_blocks`` (one gather per layer on the device, one copy into pinned host
memory) and ``put`` (one copy from pinned memory, one scatter), against the device's own pinned
copy of as many contiguous bytes.

    python benches/bench_paged_gpu.py [--geometry 8x128] [--request-blocks 64] [--json FILE]
    python benches/bench_paged_gpu.py --device cpu --geometry demo --request-blocks 4   # host run

Needs a CUDA device unless ``--device cpu`` (the tests run it that way: a GPU run must not be
the first to execute it; the CPU figures say nothing about a GPU).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

LAYOUTS = Path(__file__).resolve().parent.parent / "tests" / "data" / "vllm_kv_layouts.json"


def _clock(fn: Any, device: str, repeat: int = 10) -> float:
    """Fastest of ``repeat`` runs of ``fn`` (after a warm-up), in seconds, the device idle
    before and after each."""
    import torch

    def sync() -> None:
        if device == "cuda":
            torch.cuda.synchronize()

    fn()
    sync()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        sync()
        best = min(best, time.perf_counter() - t0)
    return best


def _buffers(case: dict[str, Any], device: str, seed: int) -> tuple[Any, list[Any]]:
    """One allocation of random bits and every layer's view of it, as vLLM lays them out."""
    import torch

    dtype = getattr(torch, case["dtype"])
    g = torch.Generator(device=device).manual_seed(seed)
    raw = torch.randint(-128, 128, (case["bytes"],), dtype=torch.int8, device=device, generator=g)
    typed = raw.view(dtype)
    views = [torch.as_strided(typed, case["shape"], case["strides"], offset) for offset in case["offsets"]]
    return raw, views


def _reference(buffer: Any, block_ids: list[int], dim: int) -> tuple[np.ndarray, np.ndarray]:
    """K and V of blocks ``block_ids`` as vLLM's GPU backends read a block:
    ``kv_cache.transpose(1, 2).split(head_size, dim=-1)`` (``[1, heads, tokens, dim]`` integers)."""
    import torch

    bits = buffer.view({1: torch.uint8, 2: torch.int16}[buffer.element_size()])
    key, value = bits.transpose(1, 2).split(dim, dim=-1)
    ids = torch.as_tensor(block_ids, device=buffer.device)

    def tokens(x: Any) -> np.ndarray:
        return x[ids].permute(2, 0, 1, 3).reshape(1, x.shape[2], -1, dim).cpu().numpy()

    return tokens(key), tokens(value)


def check(case: dict[str, Any], device: str, request: list[int]) -> None:
    """Reads, writes and a codec round trip of ``request``'s blocks in every layer, bit for bit;
    raises ``AssertionError`` naming the case otherwise."""
    import torch

    import speckv
    from speckv.integrations.paged import PagedLayout, host_ready

    name = f"{case['layout']} {case['dtype']} {case['geometry']}"
    raw, views = _buffers(case, device, seed=7)
    d, block = case["dim"], case["block"]
    paged = PagedLayout.detect(
        views[0], platform="cuda", block_size=block, kv_heads=case["heads"], head_dim=d, backend="FLASH_ATTN"
    )
    before = raw.clone()
    others = [i for i in range(case["blocks"]) if i not in request][: len(request)]
    typed = np.dtype({"bfloat16": "uint16", "float16": "uint16", "float8_e4m3fn": "uint8"}[case["dtype"]])
    for layer, buffer in enumerate(views):
        k, v = paged.read(buffer, request)
        ref = _reference(buffer, request, d)
        integer = {1: torch.uint8, 2: torch.int16}[buffer.element_size()]
        assert np.array_equal(k.view(integer).numpy(), ref[0]), f"{name}: layer {layer} K"
        assert np.array_equal(v.view(integer).numpy(), ref[1]), f"{name}: layer {layer} V"
        # the blocks through speckv's fast lane (16-bit) or as they are (fp8), put into others
        blocks = paged.copy_blocks(buffer, request)
        host_ready(buffer.device)
        sk, sv = paged.split(blocks.numpy())
        stored = np.stack(
            [np.stack([x[0, :, i * block : (i + 1) * block] for x in (sk, sv)]) for i in range(len(request))]
        )
        if typed.itemsize == 2:
            coded = speckv.encode(stored.view(np.float16), lane="fast")
            stored = np.asarray(speckv.decode(coded)).view(stored.dtype)
        paged.put(buffer, others, paged.pack(stored))
        host_ready(buffer.device)
        got = _reference(buffer, others, d)
        assert np.array_equal(got[0], ref[0]) and np.array_equal(got[1], ref[1]), f"{name}: layer {layer} put"
    # every other byte as it was: write the overwritten blocks back from the saved copy
    _, saved = _buffers(case, device, seed=7)
    for buffer, old in zip(views, saved):
        k, v = paged.read(old, others)
        paged.write(buffer, others, k, v)
    if device == "cuda":
        torch.cuda.synchronize()
    assert torch.equal(raw, before), f"{name}: bytes outside the named blocks moved"


def bandwidth(case: dict[str, Any], device: str, request: list[int]) -> dict[str, float]:
    """GB/s of a request's blocks of every layer to the host (``copy_blocks``) and back
    (``pack`` done, ``put``), and of the device's own pinned copy of as many contiguous bytes."""
    import torch

    from speckv.integrations.paged import PagedLayout, host_ready

    _, views = _buffers(case, device, seed=3)
    d, block = case["dim"], case["block"]
    paged = PagedLayout.detect(
        views[0], platform="cuda", block_size=block, kv_heads=case["heads"], head_dim=d, backend="FLASH_ATTN"
    )
    page = views[0][0].numel() * views[0].element_size()
    nbytes = page * len(request) * len(views)
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=device == "cuda")
    flat = torch.empty(nbytes, dtype=torch.uint8, device=device)
    to_host = _clock(lambda: host.copy_(flat, non_blocking=True), device)
    to_device = _clock(lambda: flat.copy_(host, non_blocking=True), device)

    def save() -> None:
        for buffer in views:
            paged.copy_blocks(buffer, request)
        host_ready(views[0].device)

    packed = [paged.pack(np.stack([np.stack(x) for x in _stored(paged, buffer, request, block)])) for buffer in views]

    def load() -> None:
        for buffer, p in zip(views, packed):
            paged.put(buffer, request, p)

    copy_s, put_s = _clock(save, device), _clock(load, device)
    gb = nbytes / 1e9
    return {
        "bytes": nbytes,
        "pinned_d2h_gb_s": gb / to_host,
        "pinned_h2d_gb_s": gb / to_device,
        "copy_blocks_gb_s": gb / copy_s,
        "put_gb_s": gb / put_s,
        "copy_blocks_over_pinned": to_host / copy_s,
        "put_over_pinned": to_device / put_s,
    }


def _stored(paged: Any, buffer: Any, request: list[int], block: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The request's blocks in the stored shape, one ``(K, V)`` per block."""
    from speckv.integrations.paged import host_ready

    blocks = paged.copy_blocks(buffer, request)
    host_ready(buffer.device)
    k, v = paged.split(blocks.numpy())
    return [(k[0, :, i * block : (i + 1) * block], v[0, :, i * block : (i + 1) * block]) for i in range(len(request))]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--geometry", default="8x128", help="a geometry of the layouts file (demo, 8x128)")
    p.add_argument("--request-blocks", type=int, default=64, help="blocks of one request, every layer")
    p.add_argument("--json", help="also write the figures to this file")
    a = p.parse_args(argv)
    import torch

    if a.device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench_paged_gpu: no CUDA device (--device cpu runs it on the host)")
    cases = [c for c in json.loads(LAYOUTS.read_text())["layouts"] if c["geometry"] == a.geometry]
    if not cases:
        sys.exit(f"bench_paged_gpu: no geometry {a.geometry!r} in {LAYOUTS}")
    rng = np.random.default_rng(0)
    request = sorted(rng.choice(cases[0]["blocks"], size=a.request_blocks, replace=False).tolist())
    device_name = torch.cuda.get_device_name() if a.device == "cuda" else "host"
    out: dict[str, Any] = {"device": device_name, "geometry": a.geometry, "request_blocks": a.request_blocks}
    out["checked"] = []
    for case in cases:
        check(case, a.device, request[: max(1, min(8, len(request)))])
        out["checked"].append(f"{case['layout']} {case['dtype']}")
    print(
        f"{device_name}: {len(cases)} layouts x dtypes of geometry {a.geometry} read, written and round-tripped exactly"
    )
    out["bandwidth"] = {}
    print(
        f"{'layout':8s} {'dtype':14s} {'MB':>7s} {'pinned D2H':>10s} {'copy_blocks':>11s} {'ratio':>6s} "
        f"{'pinned H2D':>10s} {'put':>7s} {'ratio':>6s}"
    )
    for case in cases:
        if case["dtype"] == "float16":
            continue  # the same bytes as bf16
        b = bandwidth(case, a.device, request)
        out["bandwidth"][f"{case['layout']} {case['dtype']}"] = b
        print(
            f"{case['layout']:8s} {case['dtype']:14s} {b['bytes'] / 1e6:7.1f} {b['pinned_d2h_gb_s']:10.1f} "
            f"{b['copy_blocks_gb_s']:11.1f} {b['copy_blocks_over_pinned']:6.2f} {b['pinned_h2d_gb_s']:10.1f} "
            f"{b['put_gb_s']:7.1f} {b['put_over_pinned']:6.2f}"
        )
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
