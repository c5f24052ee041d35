"""The cache container and its streams: parsing a multi-block container, describing it, and
cutting one layer's chunks out of a block's stream (what a layer-wise restore reads)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import speckv
from speckv import container

LAYERS, HEADS, TOKENS, DIM, BLOCK = 30, 3, 1024, 64, 256


@pytest.fixture(scope="module")
def cache_container() -> bytes:
    """A stacked container of a 30-layer cache's K and V in four blocks of 256 tokens, each
    block's streams a chunk per layer (predictor-free, so no model is needed)."""
    rng = np.random.default_rng(0)
    blocks = []
    for start in range(0, TOKENS, BLOCK):
        shape = (LAYERS, 1, HEADS, min(BLOCK, TOKENS - start), DIM)
        layer = int(np.prod(shape[1:]))
        pair = [speckv.encode((0.5 * rng.standard_normal(shape)).astype(ml_dtypes.bfloat16), chunk_size=layer)]
        blocks.append(pair * 2)
    return container.pack({"mode": "bf16"}, "stacked", LAYERS, BLOCK, TOKENS, blocks)


def test_container_parse(benchmark, cache_container):
    c = benchmark(container.parse, cache_container)
    assert (c.layers, len(c.blocks)) == (LAYERS, TOKENS // BLOCK)
    benchmark.extra_info["bytes"] = len(cache_container)


def test_container_info(benchmark, cache_container):
    facts = benchmark(speckv.info, cache_container)
    assert facts["container"] and facts["tokens"] == TOKENS


def test_cut_one_layer(benchmark, cache_container):
    """One layer's chunk out of a block's K stream, as a layer-wise decode reads it."""
    c = container.parse(cache_container)
    stream = c.stream(0, LAYERS // 2, 0)
    (start, end), skip = stream.chunks_of(LAYERS // 2)
    assert not skip
    part = benchmark(speckv.cut_stream, stream.data, (start, end))
    assert speckv.info(part)["shape"][0] == 1
    benchmark.extra_info["bytes"] = len(part)
