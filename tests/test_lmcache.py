"""The LMCache serde: chunk coding without LMCache, then LMCache's own classes where it is
installed (``pip install lmcache``: a 6 GB CUDA stack; the CI skips those tests)."""

from __future__ import annotations

import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import speckv  # noqa: E402
from speckv.integrations.lmcache import HEADER, RAW, STATS, decode_chunk, encode_chunk, fit_stats  # noqa: E402


def kv_chunk(shape=(2, 3, 64, 32), seed=0, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    scale = torch.logspace(-2, 0, shape[-1])
    return (torch.randn(shape, generator=g) * scale + 0.3).to(dtype)


def word(t):
    return t.view({2: torch.int16, 1: torch.uint8}[t.element_size()])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float8_e4m3fn])
def test_chunks_round_trip_with_either_model(dtype):
    chunk = kv_chunk(dtype=dtype)
    # the statistics of the chunk itself, in its layout
    stats = {
        "mean": chunk.float().mean(dim=2, keepdim=True).numpy(),
        "std": chunk.float().std(dim=2, keepdim=True).clamp(min=1e-3).numpy(),
    }
    for st, flag in ((None, 0), (stats, STATS)):
        data = encode_chunk(chunk, st)
        assert data[5] == flag
        out = torch.empty_like(chunk)
        decode_chunk(data, out, st)
        assert torch.equal(word(out), word(chunk))
        assert len(data) <= chunk.numel() * chunk.element_size() + HEADER


def test_incompressible_chunks_are_stored_raw_and_damage_is_typed():
    g = torch.Generator().manual_seed(3)
    noise = torch.randint(0, 1 << 16, (2, 2, 16, 16), generator=g, dtype=torch.int32).to(torch.int16)
    chunk = noise.view(torch.bfloat16)
    data = encode_chunk(chunk)
    assert data[5] == RAW and len(data) == chunk.numel() * 2 + HEADER
    out = torch.empty_like(chunk)
    decode_chunk(data, out)
    assert torch.equal(word(out), word(chunk))
    good = encode_chunk(kv_chunk())
    out = torch.empty_like(kv_chunk())
    for bad in (good[:10], b"XXXX" + good[4:], good[:-5], good[:5] + bytes([9]) + good[6:]):
        with pytest.raises(speckv.CorruptStreamError):
            decode_chunk(bad, out)
    damaged = bytearray(good)
    damaged[HEADER + len(good) // 2] ^= 1
    with pytest.raises(speckv.CorruptStreamError):
        decode_chunk(bytes(damaged), out)
    with pytest.raises(speckv.CorruptStreamError, match="statistics"):
        stats = {"mean": np.zeros((2, 3, 1, 32), np.float32), "std": np.ones((2, 3, 1, 32), np.float32)}
        decode_chunk(encode_chunk(kv_chunk(), stats), out)


def test_statistics_of_another_layout_fall_back_to_the_free_model():
    stats = {"mean": np.zeros((2, 5, 1, 7), np.float32), "std": np.ones((2, 5, 1, 7), np.float32)}
    chunk = kv_chunk()
    data = encode_chunk(chunk, stats)
    assert data[5] == 0
    out = torch.empty_like(chunk)
    decode_chunk(data, out, stats)
    assert torch.equal(word(out), word(chunk))


def test_fit_stats_layout(tmp_path):
    from speckv.integrations.lmcache import chunk_of, load_stats

    kv = [(torch.randn(1, 2, 10, 4), torch.randn(1, 2, 10, 4) + 1) for _ in range(3)]
    stats = fit_stats([kv, kv], str(tmp_path / "s.safetensors"))
    assert stats["mean"].shape == (2, 3, 1, 8)
    assert np.allclose(stats["mean"][0], chunk_of(kv)[0].mean(dim=1, keepdim=True).numpy(), atol=1e-5)
    loaded = load_stats(str(tmp_path / "s.safetensors"))
    assert np.array_equal(loaded["mean"], stats["mean"])


# -- LMCache's own classes -------------------------------------------------------------------


@pytest.fixture(scope="module")
def lmcache():
    pytest.importorskip("lmcache.v1.distributed.serde.base", reason="LMCache is not installed (pip install lmcache)")
    from lmcache.v1.memory_management import MemoryObjMetadata, TensorMemoryObj

    import speckv.integrations.lmcache  # noqa: F401  (registers the serde)

    def obj(shape, dtype):
        n = torch.Size(shape).numel() * dtype.itemsize
        size = torch.Size(shape)
        meta = MemoryObjMetadata(
            shape=size, dtype=dtype, address=0, phy_size=n, ref_count=1, shapes=[size], dtypes=[dtype]
        )
        return TensorMemoryObj(torch.zeros(n, dtype=torch.uint8), meta, None)

    return obj


@pytest.mark.parametrize("model", ["free", "stats"])
def test_lmcache_serde_processor_round_trip(lmcache, model, tmp_path):
    from lmcache.v1.distributed.api import MemoryLayoutDesc
    from lmcache.v1.distributed.serde.base import SerdeConfig
    from lmcache.v1.distributed.serde.factory import create_serde_processor, get_registered_serde_types

    from speckv.integrations.lmcache import SERDE_NAME

    assert SERDE_NAME in get_registered_serde_types()
    chunk = kv_chunk()
    kwargs: dict = {"model": model}
    if model == "stats":
        from safetensors.numpy import save_file

        mean, std = chunk.float().mean(dim=2, keepdim=True), chunk.float().std(dim=2, keepdim=True)
        save_file({"mean": mean.numpy(), "std": std.numpy()}, str(tmp_path / "stats.safetensors"))
        kwargs["stats"] = str(tmp_path / "stats.safetensors")
    proc = create_serde_processor(SerdeConfig(SERDE_NAME, kwargs))
    try:
        src = lmcache(chunk.shape, torch.bfloat16)
        src.tensor.copy_(chunk)
        size = proc.estimate_serialized_size(MemoryLayoutDesc(shapes=[chunk.shape], dtypes=[torch.bfloat16]))
        assert size == chunk.numel() * 2 + HEADER
        dst = lmcache((size,), torch.uint8)
        task = proc.submit_serialize([src], [dst], [None])
        deadline = time.time() + 30
        while (done := proc.query_serialize_result(task)) is None and time.time() < deadline:
            time.sleep(0.01)
        assert done
        # the processor narrows the buffer to the bytes written: what an L2 adapter persists
        assert dst.get_size() < chunk.numel() * 2
        back = lmcache(chunk.shape, torch.bfloat16)
        task = proc.submit_deserialize([dst], [back], [None])
        while (done := proc.query_deserialize_result(task)) is None and time.time() < deadline:
            time.sleep(0.01)
        assert done
        assert torch.equal(word(back.tensor), word(chunk))
    finally:
        proc.close()
