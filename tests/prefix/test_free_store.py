"""``FreePrefixStore`` restored layer by layer: ``read_blocks`` then ``decode_layers`` give
every run of layers bit for bit, for both codings and any bit pattern; fast-lane blocks are
coded in chunks of whole layers; blocks coded in other chunks still decode by layer; a damaged
layer is refused alone, and ends the prefix in ``get_kv``."""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import speckv  # noqa: E402
from speckv.prefix.free_store import KEY_BYTES, FreePrefixStore, layer_chunk  # noqa: E402
from speckv.store import MemoryBackend, pack_entry, unpack_entry  # noqa: E402

WORDS = {
    "bf16": (torch.bfloat16, torch.int16),
    "fp16": (torch.float16, torch.int16),
    "fp8": (torch.float8_e4m3fn, torch.uint8),
}


def _cache(layers: int, heads: int, tokens: int, dim: int, dtype: str, seed: int, smooth: bool):
    """Per layer (K, V) of any bit pattern, or of cache-like values (what the fast lane
    compresses)."""
    g = torch.Generator().manual_seed(seed)
    typ, word = WORDS[dtype]
    out = []
    for _ in range(layers):
        pair = []
        for _ in range(2):
            if smooth:
                pair.append((torch.randn(1, heads, tokens, dim, generator=g) * 2).to(typ))
            else:
                bits = torch.randint(0, 256, (1, heads, tokens, dim * typ.itemsize), generator=g, dtype=torch.uint8)
                pair.append(bits.view(typ))
        out.append(tuple(pair))
    return out, word


def _stored(kv, word, b: int, lo: int, hi: int) -> np.ndarray:
    """Layers lo:hi of block b of ``kv`` as decode_layers returns them."""
    block = [
        np.stack([k[0, :, b * 16 : (b + 1) * 16].view(word).numpy(), v[0, :, b * 16 : (b + 1) * 16].view(word).numpy()])
        for k, v in kv
    ]
    return np.stack(block)[lo:hi]


@settings(max_examples=25, deadline=None)
@given(
    coding=st.sampled_from(["fast", "raw"]),
    dtype=st.sampled_from(["bf16", "fp16", "fp8"]),
    layers=st.integers(1, 5),
    heads=st.integers(1, 3),
    dim=st.sampled_from([8, 32, 64]),
    blocks=st.integers(1, 3),
    smooth=st.booleans(),
    seed=st.integers(0, 2**31),
    data=st.data(),
)
def test_every_run_of_layers_decodes_bit_for_bit(coding, dtype, layers, heads, dim, blocks, smooth, seed, data):
    kv, word = _cache(layers, heads, blocks * 16 + 5, dim, dtype, seed, smooth)
    store = FreePrefixStore("m", MemoryBackend(), block_size=16, dtype=dtype, coding=coding)
    ids = torch.arange(blocks * 16 + 5)[None]
    assert store.put(ids, kv) == blocks * 16
    stored = store.read_blocks(ids)
    assert len(stored) == blocks and store.stats_counters()["hits"] == blocks
    lo = data.draw(st.integers(0, layers))
    hi = data.draw(st.integers(lo, layers))
    for b, block in enumerate(stored):
        assert block.shape == (layers, 2, heads, 16, dim)
        if coding == "fast":
            assert block.chunk_scalars == layer_chunk(block.shape)
            assert block.chunk_scalars % math.prod(block.shape[1:]) == 0  # whole layers
        got = store.decode_layers(block, lo, hi)
        assert got.dtype == (np.uint8 if dtype == "fp8" else np.int16)
        assert np.array_equal(got, _stored(kv, word, b, lo, hi))
    # from block 1 on: block 0 is not read
    assert len(store.read_blocks(ids, start=1)) == blocks - 1
    back, n = store.get_kv(ids)
    assert n == blocks * 16
    for (k, v), (k2, v2) in zip(kv, back):
        assert torch.equal(k[:, :, :n].view(word), k2.view(word)) and torch.equal(v[:, :, :n].view(word), v2.view(word))


def test_blocks_coded_in_other_chunks_still_decode_by_layer():
    """A fast-lane block whose chunks straddle layers (written before blocks were coded in
    whole layers: chunks of 2^16 scalars) decodes any run of layers all the same."""
    kv, word = _cache(5, 3, 16, 64, "bf16", 1, True)
    store = FreePrefixStore("m", MemoryBackend(), block_size=16, dtype="bf16")
    ids = torch.arange(16)[None]
    key = store.keys(ids)[0]
    block = _stored(kv, word, 0, 0, 5)
    stream = speckv.encode(block.view(speckv._arrays.numpy_dtype("bfloat16")), lane="fast", chunk_size=5000)
    store.backend.put(key, pack_entry(bytes.fromhex(key) + stream, key))
    (stored,) = store.read_blocks(ids)
    assert stored.chunk_scalars == 5000
    for lo, hi in ((0, 1), (1, 3), (2, 5), (4, 5), (0, 5)):
        assert np.array_equal(store.decode_layers(stored, lo, hi), block[lo:hi])


def test_a_damaged_layer_is_refused_alone_and_ends_the_prefix():
    """A byte flipped inside one layer's chunk: that layer's decode raises
    ``CorruptStreamError``, the other layers still decode; ``get_kv`` ends the prefix before
    the block and counts it as a corrupt entry, not a hit."""
    kv, word = _cache(4, 2, 32, 64, "bf16", 3, True)
    store = FreePrefixStore("m", MemoryBackend(), block_size=16, dtype="bf16")
    ids = torch.arange(32)[None]
    store.put(ids, kv)
    key = store.keys(ids)[1]
    payload = bytearray(unpack_entry(store.backend.get(key), key))
    meta = speckv.info(bytes(payload[KEY_BYTES:]))
    assert meta["chunks"] == 4  # one per layer
    # a byte in the middle of layer 2's chunk
    at = KEY_BYTES + meta["header_bytes"] + sum(meta["chunk_bytes"][:2]) + meta["chunk_bytes"][2] // 2
    payload[at] ^= 0x10
    store.backend.delete(key)
    store.backend.put(key, pack_entry(bytes(payload), key), parent=store.keys(ids)[0])
    first, second = store.read_blocks(ids)
    for layer in (0, 1, 3):
        assert np.array_equal(store.decode_layers(second, layer, layer + 1), _stored(kv, word, 1, layer, layer + 1))
    with pytest.raises(speckv.CorruptStreamError):
        store.decode_layers(second, 2, 3)
    before = store.stats_counters()
    back, n = store.get_kv(ids)
    after = store.stats_counters()
    assert n == 16 and torch.equal(back[0][0].view(word), kv[0][0][:, :, :16].view(word))
    assert after["hits"] - before["hits"] == 1 and after["corrupt_entries"] - before["corrupt_entries"] == 1
    with pytest.raises(ValueError):
        store.decode_layers(first, 3, 5)
