"""The GPU kind of ``speckv.integrations.paged`` on buffers vLLM's own code lays out, on CPU
tensors: run inside the vLLM virtualenv by ``tests/integrations/test_paged_gpu.py`` (``python -m pytest
tests/paged_gpu_cases.py`` there), since the layouts come from the installed vLLM, not from
numbers typed here.

A layer's buffer is what the engine hands the connector: ``vllm.v1.kv_cache_interface.
create_kv_cache_views`` over one allocation, for every ``KVCacheLayout`` member (the
cross-layer ones included), with and without kernel blocks (vLLM splitting a block for its
kernels), for bf16, fp16 and fp8 (e4m3) caches, any bit pattern. The reference reading of a
block is the one vLLM's FlashAttention and Triton backends make of the same tensor
(``kv_cache.transpose(1, 2).split(head_size, dim=-1)``: per block, token and head, K then V).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

vllm_layout = pytest.importorskip("vllm.v1.kv_cache_layout")
import vllm  # noqa: E402
from vllm.v1.kv_cache_interface import (  # noqa: E402
    FullAttentionSpec,
    KVCacheTensor,
    compute_layout_strides,
    create_kv_cache_views,
)

from speckv.integrations.paged import GPU, GPU_BACKENDS, PagedLayout, UnsupportedLayoutError  # noqa: E402
from tiny_models import checkpoint  # noqa: E402, F401  (a tiny model's folder and calibration)

LAYOUTS = list(vllm_layout.KVCacheLayout)
DTYPES = [torch.bfloat16, torch.float16, torch.float8_e4m3fn]
INTEGER = {1: torch.uint8, 2: torch.int16}


# model geometries whose buffers `export` writes out for benches/bench_paged_gpu.py (a GPU
# machine has no vLLM): the demo model's, and an 8-KV-head model's of head size 128
GEOMETRIES = {
    "demo": dict(layers=30, blocks=256, block=16, heads=3, dim=64),
    "8x128": dict(layers=8, blocks=512, block=16, heads=8, dim=128),
}
EXPORT = Path(__file__).resolve().parent / "data" / "vllm_kv_layouts.json"


def export() -> dict:
    """Every layer view's shape, strides and offset (in elements of its dtype) over one
    allocation of ``bytes``, as vLLM lays it out, per geometry, dtype and ``KVCacheLayout``."""
    out: dict = {"vllm": vllm.__version__, "layouts": []}
    for name, g in GEOMETRIES.items():
        for dtype in DTYPES:
            for layout in LAYOUTS:
                layer_views, raw = views(layout, dtype, kernel=None, seed=None, **g)
                out["layouts"].append(
                    {
                        "geometry": name,
                        **g,
                        "dtype": str(dtype).removeprefix("torch."),
                        "layout": layout.name,
                        "bytes": raw.numel(),
                        "shape": list(layer_views[0].shape),
                        "strides": list(layer_views[0].stride()),
                        "offsets": [v.storage_offset() for v in layer_views],
                    }
                )
    return out


def views(
    layout, dtype, *, layers: int, blocks: int, block: int, heads: int, dim: int, kernel: int | None, seed: int | None
):
    """Every layer's view of one allocation laid out by vLLM (random bits), and the allocation."""
    spec = FullAttentionSpec(block_size=block, num_kv_heads=heads, head_size=dim, dtype=dtype)
    layer_stride, block_stride, *_ = compute_layout_strides(spec, blocks, layers, layout)
    tensor = KVCacheTensor(
        size=layers * blocks * spec.page_size_bytes,
        layers=[f"model.layers.{i}.self_attn.attn" for i in range(layers)],
        layer_stride=layer_stride,
        block_stride=block_stride,
    )
    if seed is None:  # the layout alone (`export`)
        raw = torch.zeros(tensor.size, dtype=torch.int8)
    else:
        raw = torch.from_numpy(np.random.default_rng(seed).integers(-128, 128, tensor.size, dtype=np.int8))
    return create_kv_cache_views(raw, spec, blocks, layout, tensor, kernel_block_size=kernel), raw


def reference(buffer: torch.Tensor, block_ids: list[int], r: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """K and V of blocks ``block_ids`` (``[1, heads, tokens, dim]`` integers) read as vLLM's
    GPU backends read a block: ``kv_cache.transpose(1, 2).split(head_size, dim=-1)``."""
    bits = buffer.view(INTEGER[buffer.element_size()])
    key, value = bits.transpose(1, 2).split(dim, dim=-1)  # [kernel blocks, tokens, heads, dim]
    ids = [i * r + j for i in block_ids for j in range(r)]

    def tokens(x: torch.Tensor) -> np.ndarray:
        picked = x[ids]  # [n * r, tokens, heads, dim]
        return picked.permute(2, 0, 1, 3).reshape(1, x.shape[2], -1, dim).numpy().copy()

    return tokens(key), tokens(value)


def detect(buffer: torch.Tensor, block: int, heads: int, dim: int, backend: str = "FLASH_ATTN") -> PagedLayout:
    return PagedLayout.detect(buffer, platform="cuda", block_size=block, kv_heads=heads, head_dim=dim, backend=backend)


def possible(layout, kernel: int | None) -> bool:
    """vLLM splits blocks into kernel blocks only where a block is one dense page."""
    return kernel is None or layout.is_layer_compact and layout.value[1] == 1


CASE = dict(
    layout=st.sampled_from(LAYOUTS),
    dtype=st.sampled_from(DTYPES),
    heads=st.integers(1, 3),
    dim=st.sampled_from([8, 16, 64]),
    split=st.sampled_from([1, 2]),
    seed=st.integers(0, 2**32 - 1),
)


@settings(max_examples=60, deadline=None)
@given(**CASE, data=st.data())
def test_blocks_read_as_vllms_backends_read_them(layout, dtype, heads, dim, split, seed, data):
    block = 16
    kernel = block // split if split > 1 else None
    if not possible(layout, kernel):
        return
    layers, blocks = 2, 7
    buffers, _ = views(
        layout, dtype, layers=layers, blocks=blocks, block=block, heads=heads, dim=dim, kernel=kernel, seed=seed
    )
    ids = data.draw(st.lists(st.integers(0, blocks - 1), min_size=1, max_size=4, unique=True))
    for backend in GPU_BACKENDS:
        paged = detect(buffers[1], block, heads, dim, backend)
        assert paged.kind == GPU and paged.kernel_block == block // split
    k, v = paged.read(buffers[1], ids)
    want_k, want_v = reference(buffers[1], ids, split, dim)
    integer = INTEGER[buffers[1].element_size()]
    assert np.array_equal(k.view(integer).numpy(), want_k) and np.array_equal(v.view(integer).numpy(), want_v)
    assert k.shape == (1, heads, len(ids) * block, dim) and k.dtype == dtype


@settings(max_examples=60, deadline=None)
@given(**CASE, data=st.data())
def test_blocks_written_read_back_and_nothing_else_moves(layout, dtype, heads, dim, split, seed, data):
    """``write`` and ``pack`` + ``put`` (the two ways a restore lands) put exactly the given bits
    into the named blocks of the named layer and leave every other byte of the allocation (other
    blocks, other layers: the cross-layer layouts interleave them) as it was."""
    block = 16
    kernel = block // split if split > 1 else None
    if not possible(layout, kernel):
        return
    layers, blocks = 3, 6
    ids = data.draw(st.lists(st.integers(0, blocks - 1), min_size=1, max_size=3, unique=True))
    rng = np.random.default_rng(seed ^ 0x5EED)
    word = np.uint8 if dtype.itemsize == 1 else np.int16
    info = np.iinfo(word)
    k = rng.integers(info.min, info.max + 1, (1, heads, len(ids) * block, dim), dtype=word)
    v = rng.integers(info.min, info.max + 1, (1, heads, len(ids) * block, dim), dtype=word)
    for how in ("write", "put"):
        buffers, raw = views(
            layout, dtype, layers=layers, blocks=blocks, block=block, heads=heads, dim=dim, kernel=kernel, seed=seed
        )
        before = raw.clone()
        paged = detect(buffers[1], block, heads, dim)
        if how == "write":
            paged.write(buffers[1], ids, torch.from_numpy(k).view(dtype), torch.from_numpy(v).view(dtype))
        else:
            stored = np.stack(
                [np.stack([x[0, :, i * block : (i + 1) * block] for x in (k, v)]) for i in range(len(ids))]
            )
            paged.put(buffers[1], ids, paged.pack(stored))
        got_k, got_v = reference(buffers[1], ids, split, dim)
        assert np.array_equal(got_k, k) and np.array_equal(got_v, v), how
        # every byte outside the written blocks of layer 1 is unchanged: write the expected
        # bits back through the reference view and the whole allocation must be as before
        integer = INTEGER[buffers[1].element_size()]
        old_k, old_v = reference(
            views(
                layout, dtype, layers=layers, blocks=blocks, block=block, heads=heads, dim=dim, kernel=kernel, seed=seed
            )[0][1],
            ids,
            split,
            dim,
        )
        paged.write(buffers[1], ids, torch.from_numpy(old_k).view(dtype), torch.from_numpy(old_v).view(dtype))
        assert torch.equal(raw, before), how
        assert integer is not None


@settings(max_examples=25, deadline=None)
@given(**CASE)
def test_copied_blocks_round_trip_through_the_codec_into_other_blocks(layout, dtype, heads, dim, split, seed):
    """The connector's worker side without an engine: a request's blocks copied out
    (``copy_blocks``, as ``save_kv_layer`` does), split into the stored shape, coded and decoded
    by speckv's fast lane (``FreePrefixStore``'s coder), packed and put into other blocks of
    another layer (``_restore_layer``): those blocks then read as the first ones did."""
    import speckv

    block = 16
    kernel = block // split if split > 1 else None
    if not possible(layout, kernel):
        return
    if dtype == torch.float8_e4m3fn:
        dtype_name = "float8_e4m3fn"
    else:
        dtype_name = {torch.bfloat16: "bfloat16", torch.float16: "float16"}[dtype]
    buffers, _ = views(layout, dtype, layers=2, blocks=8, block=block, heads=heads, dim=dim, kernel=kernel, seed=seed)
    paged = detect(buffers[0], block, heads, dim)
    source, target = [1, 4, 2], [7, 0, 5]
    k, v = paged.split(paged.copy_blocks(buffers[0], source).numpy())
    import ml_dtypes

    typed = np.dtype(getattr(ml_dtypes, dtype_name)) if dtype_name != "float16" else np.dtype(np.float16)
    stored = []
    for i in range(len(source)):
        pair = np.stack([x[0, :, i * block : (i + 1) * block] for x in (k, v)])
        data = speckv.encode(np.ascontiguousarray(pair).view(typed), lane="fast")
        stored.append(np.asarray(speckv.decode(data)).view(pair.dtype))
    paged.put(buffers[1], target, paged.pack(np.stack(stored)))
    assert all(
        np.array_equal(a, b)
        for a, b in zip(reference(buffers[1], target, split, dim), reference(buffers[0], source, split, dim))
    )


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    layout=st.sampled_from(LAYOUTS),
    dtype=st.sampled_from(DTYPES),
    calibrated=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_the_connectors_worker_side_round_trips_through_an_engine_store(checkpoint, layout, dtype, calibrated, seed):  # noqa: F811
    """What the connector's worker does with a request's blocks, without an engine: copied out
    of every layer (``save_kv_layer``: ``copy_blocks``), split and stored by an ``EngineStore``
    (``save_now``: the calibrated predictor's store, or the predictor-free one), loaded back
    and written into other blocks (``start_load_kv``: ``write``): those blocks then hold, in
    every layer, exactly what the first ones held."""
    from speckv.integrations.engine import EngineStore
    from speckv.store import MemoryBackend
    from tiny_models import ids

    folder, cal, model = checkpoint
    if dtype == torch.float8_e4m3fn and not calibrated:
        return  # the predictor-free store takes 16-bit caches only
    config = model.config
    heads, dim = config.num_key_value_heads, config.hidden_size // config.num_attention_heads
    block, source, target = 16, [3, 1], [0, 5]
    buffers, _ = views(
        layout,
        dtype,
        layers=config.num_hidden_layers,
        blocks=6,
        block=block,
        heads=heads,
        dim=dim,
        kernel=None,
        seed=seed,
    )
    paged = detect(buffers[0], block, heads, dim)
    prompt = ids(2 * block, seed % 1000)[0].tolist()
    store = EngineStore(folder, cal if calibrated else None, MemoryBackend(), block_size=block, cache_dtype=dtype)
    kv = [paged.split(paged.copy_blocks(buffer, source).numpy()) for buffer in buffers]
    assert store.save(prompt, kv) == 2 * block
    back, n = store.load(prompt)
    assert n == 2 * block and len(back) == len(buffers)
    for buffer, (k, v) in zip(buffers, back):
        paged.write(buffer, target, k, v)
    for buffer in buffers:
        for got, want in zip(reference(buffer, target, 1, dim), reference(buffer, source, 1, dim)):
            assert np.array_equal(got, want)


def test_other_backends_and_shapes_are_refused_by_name():
    buffers, _ = views(LAYOUTS[0], torch.bfloat16, layers=1, blocks=4, block=16, heads=2, dim=8, kernel=None, seed=1)
    for backend in ("FLEX_ATTENTION", "FLASHMLA", ""):
        with pytest.raises(UnsupportedLayoutError, match=f"backend {backend!r}"):
            detect(buffers[0], 16, 2, 8, backend)
    # another head count, head size or a block size the buffer's blocks do not divide
    for block, heads, dim in ((16, 3, 8), (16, 2, 16), (24, 2, 8)):
        with pytest.raises(UnsupportedLayoutError, match=r"paged KV buffer of shape \[4, 2, 16, 16\]"):
            detect(buffers[0], block, heads, dim)
    with pytest.raises(UnsupportedLayoutError, match="vec16"):
        PagedLayout.detect(buffers[0], platform="cpu", block_size=16, kv_heads=2, head_dim=8, isa="vec16")


def test_the_exported_layouts_are_the_installed_vllms():
    """``tests/data/vllm_kv_layouts.json`` (what the GPU benchmark builds its buffers from) is
    what this vLLM lays out: regenerate with ``python tests/paged_gpu_cases.py --export`` in
    the vLLM virtualenv when vLLM changes."""
    assert json.loads(EXPORT.read_text()) == export()


if __name__ == "__main__":
    if sys.argv[1:] != ["--export"]:
        sys.exit("usage: python tests/paged_gpu_cases.py --export   (in the vLLM virtualenv)")
    EXPORT.parent.mkdir(exist_ok=True)
    EXPORT.write_text(json.dumps(export(), indent=1) + "\n")
    print(f"wrote {EXPORT}")
