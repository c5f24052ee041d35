"""What the vLLM connector stands on, without vLLM: the paged CPU layout (bit-exact block
reads and writes for every dtype), the checkpoint trunk and its fingerprint, and
``EngineStore`` (save / match / load bit for bit; every fault a logged miss, never a raise)."""

from __future__ import annotations

import errno
import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from speckv.hf import ModelPrefixPredictor, SpeculativeCodec, model_fingerprint  # noqa: E402
from speckv.integrations.engine import EngineStore  # noqa: E402
from speckv.integrations.paged import PagedLayout, UnsupportedLayoutError  # noqa: E402
from speckv.models.cache import other_kernels  # noqa: E402
from speckv.models.checkpoint import CheckpointError, checkpoint_fingerprint, load_trunk  # noqa: E402
from speckv.store import MemoryBackend, StoreError  # noqa: E402
from tiny_models import checkpoint, ids, tiny_model  # noqa: E402,F401

BLOCK = 16
DTYPES = [torch.bfloat16, torch.float16, torch.float8_e4m3fn]


def _random_bits(shape, dtype, seed):
    """Any bit pattern at all (NaNs, infinities, subnormals, -0) in ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    size = torch.empty((), dtype=dtype).element_size()
    words = torch.randint(0, 256, (*shape[:-1], shape[-1] * size), generator=g, dtype=torch.uint8)
    return words.view(dtype)


@settings(max_examples=30, deadline=None)
@given(
    dtype=st.sampled_from(DTYPES),
    blocks=st.integers(1, 5),
    heads=st.integers(1, 3),
    dim=st.sampled_from([2, 4, 8]),
    seed=st.integers(0, 2**31),
)
def test_paged_cpu_layout_reads_and_writes_blocks_bit_for_bit(dtype, blocks, heads, dim, seed):
    b = 4
    buffer = _random_bits((blocks + 2, heads, b, 2 * dim), dtype, seed)
    layout = PagedLayout.detect(buffer, platform="cpu", block_size=b, kv_heads=heads, head_dim=dim)
    order = list(torch.randperm(blocks + 2, generator=torch.Generator().manual_seed(seed))[:blocks])
    k, v = layout.read(buffer, order)
    assert k.shape == v.shape == (1, heads, blocks * b, dim) and k.dtype == dtype
    # the layout as documented: K transposed [dim][block], then V [block][dim]
    raw = buffer.view(torch.uint8 if dtype.itemsize == 1 else torch.int16)
    for i, blk in enumerate(order):
        flat = raw[blk].reshape(heads, -1)
        want_k = flat[:, : dim * b].reshape(heads, dim, b).transpose(1, 2)
        want_v = flat[:, dim * b :].reshape(heads, b, dim)
        kb = k.view(raw.dtype)[0, :, i * b : (i + 1) * b]
        vb = v.view(raw.dtype)[0, :, i * b : (i + 1) * b]
        assert torch.equal(kb, want_k) and torch.equal(vb, want_v)
    other = _random_bits(buffer.shape, dtype, seed + 1)
    before = other.view(raw.dtype).clone()
    layout.write(other, order, k, v)
    k2, v2 = layout.read(other, order)
    assert torch.equal(k2.view(raw.dtype), k.view(raw.dtype)) and torch.equal(v2.view(raw.dtype), v.view(raw.dtype))
    untouched = [i for i in range(blocks + 2) if i not in [int(o) for o in order]]
    assert torch.equal(other.view(raw.dtype)[untouched], before[untouched])


@settings(max_examples=30, deadline=None)
@given(
    dtype=st.sampled_from([torch.bfloat16, torch.float16]),
    blocks=st.integers(1, 4),
    heads=st.integers(1, 3),
    b=st.sampled_from([16, 32]),
    dim=st.sampled_from([16, 32]),
    seed=st.integers(0, 2**31),
)
def test_paged_amx_layout_reads_and_writes_blocks_bit_for_bit(dtype, blocks, heads, b, dim, seed):
    """vLLM's ``amx`` CPU kernels' blocks (module docs of ``speckv.integrations.paged``): K in
    16-token tiles of channel pairs, V in 16-channel tiles of token pairs; read as the model's
    cache, written back bit for bit, other blocks untouched."""
    buffer = _random_bits((blocks + 2, heads, b, 2 * dim), dtype, seed)
    layout = PagedLayout.detect(buffer, platform="cpu", block_size=b, kv_heads=heads, head_dim=dim, isa="amx")
    assert layout.kind == "cpu-amx"
    order = [int(i) for i in torch.randperm(blocks + 2, generator=torch.Generator().manual_seed(seed))[:blocks]]
    k, v = layout.read(buffer, order)
    raw = buffer.view(torch.int16)
    for i, blk in enumerate(order):
        flat = raw[blk].reshape(heads, -1)
        kb = k.view(torch.int16)[0, :, i * b : (i + 1) * b]
        vb = v.view(torch.int16)[0, :, i * b : (i + 1) * b]
        for t, d in ((0, 0), (1, 0), (0, 1), (17 % b, 3), (b - 1, dim - 1), (5, dim - 2)):
            # element (token t, channel d) where the kernels keep it
            k_at = ((t // 16 * (dim // 2) + d // 2) * 16 + t % 16) * 2 + d % 2
            v_at = ((d // 16 * (b // 2) + t // 2) * 16 + d % 16) * 2 + t % 2
            assert torch.equal(kb[:, t, d], flat[:, k_at]) and torch.equal(vb[:, t, d], flat[:, dim * b + v_at])
    other = _random_bits(buffer.shape, dtype, seed + 1)
    before = other.view(torch.int16).clone()
    layout.write(other, order, k, v)
    assert torch.equal(other.view(torch.int16)[order], raw[order])
    untouched = [i for i in range(blocks + 2) if i not in [int(o) for o in order]]
    assert torch.equal(other.view(torch.int16)[untouched], before[untouched])


@settings(max_examples=30, deadline=None)
@given(
    isa=st.sampled_from(["vec", "amx"]),
    dtype=st.sampled_from(DTYPES),
    blocks=st.integers(1, 4),
    heads=st.integers(1, 3),
    b=st.sampled_from([16, 32]),
    dim=st.sampled_from([16, 32]),
    seed=st.integers(0, 2**31),
)
def test_paged_pack_and_put_write_what_write_writes(isa, dtype, blocks, heads, b, dim, seed):
    """The loader's numpy path (``pack`` blocks of the stored shape, ``put`` them) leaves the
    buffer exactly as ``write`` of the same cache does, for both CPU layouts."""
    if isa == "amx" and dtype.itemsize == 1:
        return  # refused (test_other_layouts_are_refused_by_name)
    buffer = _random_bits((blocks + 3, heads, b, 2 * dim), dtype, seed)
    layout = PagedLayout.detect(buffer, platform="cpu", block_size=b, kv_heads=heads, head_dim=dim, isa=isa)
    order = [int(i) for i in torch.randperm(blocks + 3, generator=torch.Generator().manual_seed(seed))[:blocks]]
    words = torch.uint8 if dtype.itemsize == 1 else torch.int16
    k, v = (_random_bits((1, heads, blocks * b, dim), dtype, seed + i) for i in (1, 2))
    want = _random_bits(buffer.shape, dtype, seed + 3)
    got = want.clone()
    layout.write(want, order, k, v)

    def stored(x):  # [1, H, n * B, D] -> [n, H, B, D], as a store keeps blocks
        return x.view(words).numpy().reshape(heads, blocks, b, dim).transpose(1, 0, 2, 3)

    layout.put(got, order, layout.pack(np.stack([stored(k), stored(v)], axis=1)))
    assert torch.equal(got.view(words), want.view(words))
    with pytest.raises(ValueError):
        layout.pack(np.zeros((1, 2, heads, b + 1, dim), np.int16))


def test_other_layouts_are_refused_by_name():
    import re

    for shape, platform in (((2, 10, 16, 2, 8), "cpu"), ((10, 16, 2, 16), "cpu"), ((10, 2, 16, 16), "rocm")):
        with pytest.raises(UnsupportedLayoutError, match=re.escape(str(list(shape)))):
            PagedLayout.detect(torch.zeros(shape), platform=platform, block_size=16, kv_heads=2, head_dim=8)
    # on CUDA the attention backend decides (tests/paged_gpu_cases.py has the GPU layouts)
    with pytest.raises(UnsupportedLayoutError, match="backend 'FLEX_ATTENTION' on 'cuda'"):
        PagedLayout.detect(
            torch.zeros((10, 2, 16, 16)),
            platform="cuda",
            block_size=16,
            kv_heads=2,
            head_dim=8,
            backend="FLEX_ATTENTION",
        )
    ok = torch.zeros((10, 2, 32, 64), dtype=torch.bfloat16)
    for isa in ("vec16", "neon", "vsx"):  # kernels whose blocks speckv has not read
        with pytest.raises(UnsupportedLayoutError, match=isa):
            PagedLayout.detect(ok, platform="cpu", block_size=32, kv_heads=2, head_dim=32, isa=isa)
    with pytest.raises(UnsupportedLayoutError, match="amx"):  # fp8 under amx: not checked yet
        PagedLayout.detect(
            ok.view(torch.uint8)[..., :64].contiguous().view(torch.float8_e4m3fn),
            platform="cpu",
            block_size=32,
            kv_heads=2,
            head_dim=32,
            isa="amx",
        )


def test_the_trunk_predicts_as_the_whole_model_and_fingerprints_the_same(checkpoint):
    """As the folder's model loaded whole (``from_pretrained``: RoPE's frequencies in float32,
    where the in-memory model cast them to bf16 with ``.to``)."""
    folder, _, original = checkpoint
    model = transformers.AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.bfloat16).eval()
    trunk = load_trunk(folder, 1)
    assert checkpoint_fingerprint(folder, trunk) == model_fingerprint(model) == model_fingerprint(original)
    assert any(p.is_meta for p in trunk.parameters())  # the rest was never read
    prompt = ids(40, 9)
    got: dict[int, tuple] = {}
    ModelPrefixPredictor(trunk, layers=1).prefix(prompt, lambda layer, k, v: got.setdefault(0, (k, v)))
    ModelPrefixPredictor(model, layers=1).prefix(prompt, lambda layer, k, v: got.setdefault(1, (k, v)))
    assert torch.equal(got[0][0], got[1][0]) and torch.equal(got[0][1], got[1][1])
    with pytest.raises(CheckpointError):
        load_trunk(folder / "missing", 1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float8_e4m3fn])
def test_engine_store_saves_and_loads_bit_for_bit(checkpoint, dtype, tmp_path):
    folder, cal, model = checkpoint
    worker = EngineStore(folder, cal, str(tmp_path / "s"), block_size=BLOCK, cache_dtype=dtype)
    scheduler = EngineStore(folder, cal, str(tmp_path / "s"), block_size=BLOCK, cache_dtype=dtype, weights=False)
    prompt = ids(40, 3)[0].tolist()
    kv = [(k.to(dtype), v.to(dtype)) for k, v in other_kernels(model, torch.tensor([prompt]))]
    assert scheduler.match(prompt) == 0
    assert worker.save(prompt, kv) == 32
    assert scheduler.match(prompt) == 32 and scheduler.match(prompt[:20]) == 16
    back, n = worker.load(prompt[:32])
    assert n == 32 and len(back) == len(kv)
    for (k, v), (k2, v2) in zip(kv, back):
        assert k2.dtype == dtype
        assert torch.equal(k2.view(torch.uint8), k[:, :, :32].contiguous().view(torch.uint8))
        assert torch.equal(v2.view(torch.uint8), v[:, :, :32].contiguous().view(torch.uint8))


class FailingBackend(MemoryBackend):
    def __init__(self, fail: str) -> None:
        super().__init__()
        self.fail = fail

    def get(self, key):
        if self.fail == "get":
            raise StoreError("connection refused")
        return super().get(key)

    def put(self, key, value, parent=None):
        if self.fail == "put":
            raise StoreError(f"write: {OSError(errno.ENOSPC, 'No space left on device')}")
        return super().put(key, value, parent)


def test_engine_store_faults_are_logged_misses(checkpoint, caplog):
    folder, cal, model = checkpoint
    prompt = ids(40, 4)[0].tolist()
    kv = [(k, v) for k, v in other_kernels(model, torch.tensor([prompt]))]
    full = EngineStore(folder, cal, FailingBackend("put"), block_size=BLOCK)
    with caplog.at_level(logging.WARNING, logger="speckv.engine"):
        assert full.save(prompt, kv) == 0
        assert full.save(prompt, kv) == 0
    assert sum("could not be read or written" in r.message for r in caplog.records) == 1  # once
    down = EngineStore(folder, cal, FailingBackend("get"), block_size=BLOCK)
    assert down.match(prompt) == 0 and down.load(prompt[:32]) == ([], 0)
    with pytest.raises(ValueError, match="fp8 scales"):
        EngineStore(folder, cal, MemoryBackend(), block_size=BLOCK, cache_dtype=torch.float8_e4m3fn).check_fp8_scales(
            [(2.0, 1.0)] * 3
        )


def test_engine_store_with_channel_statistics_needs_no_weights(checkpoint, tmp_path):
    """The stats predictor (per-channel means, the joint residual model): a prefix store with
    no model weights in memory at all, exact, every block predicted alike wherever it sits."""
    from speckv.hf import ChannelStatsPredictor

    folder, _, model = checkpoint
    codec = SpeculativeCodec(model, predictor=ChannelStatsPredictor())
    codec.calibrate([ids(48, s) for s in range(6)], fp8_scale=1.0)
    cal = tmp_path / "stats.safetensors"
    codec.save(str(cal))
    store = EngineStore(folder, cal, str(tmp_path / "s"), block_size=BLOCK)
    assert store.codec.joint and all(p.is_meta for p in store.codec.model.parameters())
    a = ids(40, 5)[0].tolist()
    b = a[:16] + ids(40, 6)[0].tolist()[:24]  # shares a's first block
    for prompt in (a, b):
        kv = other_kernels(model, torch.tensor([prompt]))
        store.save(prompt, kv)
        back, n = store.load(prompt)
        assert n == 32
        for (k, v), (k2, v2) in zip(kv, back):
            assert torch.equal(k2, k[:, :, :32]) and torch.equal(v2, v[:, :, :32])
    assert store.prefix.stats()["blocks"] == 3  # the shared block once


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_engine_store_without_a_calibration_codes_predictor_free(checkpoint, dtype, tmp_path):
    """``calibration=None``: the fast lane, no weights and no calibration; bit for bit, the
    shared block stored once, damage a logged miss, and the stored size well under the raw."""
    from speckv.store import DirectoryBackend

    folder, _, model = checkpoint
    store = EngineStore(folder, None, str(tmp_path / "s"), block_size=BLOCK, cache_dtype=dtype)
    config = model.config
    assert store.codec is None
    assert store.kv_spec == (
        config.num_hidden_layers,
        config.num_key_value_heads,
        config.hidden_size // config.num_attention_heads,
    )
    a = ids(40, 7)[0].tolist()
    b = a[:16] + ids(40, 8)[0].tolist()[:24]
    for prompt in (a, b):
        kv = [(k.to(dtype), v.to(dtype)) for k, v in other_kernels(model, torch.tensor([prompt]))]
        assert store.match(prompt) in (0, 16)
        store.save(prompt, kv)
        assert store.match(prompt) == 32
        back, n = store.load(prompt)
        assert n == 32 and len(back) == len(kv)
        for (k, v), (k2, v2) in zip(kv, back):
            assert k2.dtype == dtype and torch.equal(k2.view(torch.int16), k[:, :, :32].contiguous().view(torch.int16))
            assert torch.equal(v2.view(torch.int16), v[:, :, :32].contiguous().view(torch.int16))
    stats = store.prefix.stats()
    assert stats["blocks"] == 3
    raw = 2 * sum(k[:, :, :16].numel() + v[:, :, :16].numel() for k, v in kv)
    assert stats["bytes"] < 3 * raw
    # a damaged entry ends the prefix (a logged miss, never a raise)
    backend = DirectoryBackend(str(tmp_path / "s"))
    key = store.prefix.keys(torch.tensor([a]))[1]
    entry = bytearray(backend.get(key))
    entry[-5] ^= 1
    backend.delete(key)
    backend.put(key, bytes(entry))
    assert store.match(a) == 16 and store.load(a)[1] == 16
    # another model's (or coding's) namespace never serves these blocks
    other = EngineStore(folder, None, str(tmp_path / "s"), block_size=BLOCK * 2, cache_dtype=dtype)
    assert other.match(a) == 0
    with pytest.raises(ValueError, match="fp8"):
        EngineStore(folder, None, MemoryBackend(), block_size=BLOCK, cache_dtype=torch.float8_e4m3fn)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_raw_tier_stores_blocks_as_they_are(checkpoint, dtype, tmp_path):
    """``coding="raw"``: the baseline tier, any bit pattern stored as it is (each entry the
    block's bytes and 64 bytes of framing), under keys of its own (a fast-lane store never
    serves its entries), a truncated entry a logged miss."""
    from speckv.store import DirectoryBackend

    folder, _, model = checkpoint
    config = model.config
    layers, heads = config.num_hidden_layers, config.num_key_value_heads
    dim = config.hidden_size // config.num_attention_heads
    store = EngineStore(folder, None, str(tmp_path / "s"), block_size=BLOCK, cache_dtype=dtype, coding="raw")
    prompt = ids(40, 9)[0].tolist()
    kv = [
        (_random_bits((1, heads, 40, dim), dtype, 2 * i), _random_bits((1, heads, 40, dim), dtype, 2 * i + 1))
        for i in range(layers)
    ]
    assert store.save(prompt, kv) == 32
    assert store.match(prompt, read=False) == 32
    back, n = store.load(prompt)
    assert n == 32
    for (k, v), (k2, v2) in zip(kv, back):
        assert torch.equal(k2.view(torch.int16), k[:, :, :32].contiguous().view(torch.int16))
        assert torch.equal(v2.view(torch.int16), v[:, :, :32].contiguous().view(torch.int16))
    raw = layers * 2 * heads * BLOCK * dim * 2
    assert store.prefix.stats()["bytes"] == 2 * (raw + 64)
    fast = EngineStore(folder, None, str(tmp_path / "s"), block_size=BLOCK, cache_dtype=dtype)
    assert fast.match(prompt) == 0
    from speckv.store import pack_entry, unpack_entry

    backend = DirectoryBackend(str(tmp_path / "s"))
    key = store.prefix.keys(torch.tensor([prompt]))[1]
    payload = unpack_entry(backend.get(key), key)
    assert payload[16:20] == b"RAW1"
    backend.delete(key)
    backend.put(key, pack_entry(payload[:-2], key))  # framed again, two bytes short
    assert store.match(prompt, read=False) == 32  # the index knows nothing of the damage
    assert store.load(prompt)[1] == 16 and store.prefix.stats()["corrupt_entries"] == 1
    with pytest.raises(ValueError, match="coding"):
        EngineStore(folder, None, MemoryBackend(), block_size=BLOCK, coding="zip")


def test_an_engine_store_under_a_budget_evicts_and_serves_what_it_holds(checkpoint, tmp_path):
    """A directory tier of three blocks' bytes: four prompts stored, the least recently used
    lose their tails, every prefix served is exact, and nothing exceeds the budget."""
    folder, _, model = checkpoint
    probe = EngineStore(folder, None, MemoryBackend(), block_size=BLOCK)
    prompts = [ids(40, 20 + i)[0].tolist() for i in range(4)]
    caches = [other_kernels(model, torch.tensor([p])) for p in prompts]
    probe.save(prompts[0], caches[0])
    per_block = probe.backend.nbytes() // 2
    budget = int(3.5 * per_block)
    store = EngineStore(folder, None, str(tmp_path / "s"), block_size=BLOCK, max_bytes=budget)
    for p, kv in zip(prompts, caches):
        store.save(p, kv)
        assert store.backend.nbytes() <= budget
    stats = store.prefix.stats()
    assert stats["evictions"] >= 4 and stats["blocks"] <= 3
    served = 0
    for p, kv in zip(prompts, caches):
        back, n = store.load(p)
        served += n
        for (k, v), (k2, v2) in zip(kv, back):
            assert torch.equal(k2, k[:, :, :n]) and torch.equal(v2, v[:, :, :n])
    assert served >= 32  # the last prompt stored is whole
