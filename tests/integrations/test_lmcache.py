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


def test_a_coded_chunk_of_another_dtype_is_refused():
    """Same bytes, another format (fp16 chunks read into a bf16 model's buffer): refused, not
    copied as bits of the wrong format."""
    chunk = kv_chunk(dtype=torch.float16)
    data = encode_chunk(chunk)
    assert data[5] != RAW
    with pytest.raises(speckv.CorruptStreamError, match="float16"):
        decode_chunk(data, torch.empty(chunk.shape, dtype=torch.bfloat16))


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


def _wait(poll, deadline_s: float = 30.0):
    deadline = time.time() + deadline_s
    while time.time() < deadline:
        got = poll()
        if got is not None:
            return got
        time.sleep(0.01)
    raise TimeoutError("LMCache task did not finish")


@pytest.mark.parametrize("adapter", ["mock", "fs"])
def test_lmcache_l2_adapter_stores_through_the_serde(lmcache, adapter, tmp_path):
    """LMCache's own L2 path: an L1 manager, a real L2 adapter spec with a ``"serde"`` entry
    (parsed as from ``--l2-adapter``), wrapped by LMCache's SerdeL2AdapterWrapper."""
    import argparse
    import json

    from lmcache.v1.distributed.api import MemoryLayoutDesc, ObjectKey
    from lmcache.v1.distributed.config import L1ManagerConfig, L1MemoryManagerConfig
    from lmcache.v1.distributed.l1_manager import L1Manager
    from lmcache.v1.distributed.l2_adapters.config import add_l2_adapters_args, parse_args_to_l2_adapters_config
    from lmcache.v1.distributed.l2_adapters.factory import create_l2_adapter_from_registry
    from lmcache.v1.distributed.l2_adapters.serde_wrapper import SerdeL2AdapterWrapper
    from lmcache.v1.distributed.serde.factory import create_serde_processor

    spec = {"fs": {"type": "fs", "base_path": str(tmp_path)}, "mock": {"type": "mock", "max_size_gb": 0.1}}[adapter]
    if adapter == "mock":
        spec["mock_bandwidth_gb"] = 100
    spec["serde"] = {"type": "speckv", "model": "free"}
    args = add_l2_adapters_args(argparse.ArgumentParser()).parse_args(["--l2-adapter", json.dumps(spec)])
    config = parse_args_to_l2_adapters_config(args).adapters[0]
    memory = L1MemoryManagerConfig(size_in_bytes=16 << 20, use_lazy=False, shm_name="")
    l1 = L1Manager(L1ManagerConfig(memory_config=memory))
    inner = create_l2_adapter_from_registry(config, l1.get_l1_memory_desc())
    wrapper = SerdeL2AdapterWrapper(inner=inner, serde=create_serde_processor(config.serde_config), l1_manager=l1)
    reserved: list = []
    try:
        shape = torch.Size([2, 3, 64, 32])
        layout = MemoryLayoutDesc(shapes=[shape], dtypes=[torch.bfloat16])
        keys = [ObjectKey(chunk_hash=bytes([i]) * 8, model_name="demo", kv_rank=0) for i in range(2)]
        chunks = [kv_chunk(tuple(shape), seed=i) for i in range(2)]
        made = l1.reserve_write(keys=keys, is_temporary=[False] * 2, layout_desc=layout, tag="test")
        reserved += keys
        sources = [made[k][1] for k in keys]
        for obj, chunk in zip(sources, chunks):
            obj.tensor.view(torch.bfloat16).view(shape).copy_(chunk)
        task = wrapper.submit_store_task(keys, sources)
        stored = _wait(lambda: wrapper.pop_completed_store_tasks().get(task))
        assert stored
        if adapter == "fs":
            sizes = sorted(p.stat().st_size for p in tmp_path.glob("*.data"))
            assert len(sizes) == 2 and max(sizes) < shape.numel() * 2 / 1.2
        dest_keys = [ObjectKey(chunk_hash=b"d" * 7 + bytes([i]), model_name="demo", kv_rank=0) for i in range(2)]
        made = l1.reserve_write(keys=dest_keys, is_temporary=[True] * 2, layout_desc=layout, tag="test")
        reserved += dest_keys
        dests = [made[k][1] for k in dest_keys]
        task = wrapper.submit_load_task(keys, dests)
        bitmap = _wait(lambda: wrapper.query_load_result(task))
        if adapter == "fs" and not bitmap.test(0):
            # LMCache 0.5.6's fs adapter reads exactly the serde's size bound back, so no
            # variable-size serde loads from it (LMCache PR #3796 adds the stored size).
            pytest.xfail("LMCache's fs adapter cannot load variable-size serde output yet")
        for i, chunk in enumerate(chunks):
            assert bitmap.test(i)
            assert torch.equal(word(dests[i].tensor.view(torch.bfloat16).view(shape)), word(chunk))
    finally:
        wrapper.close()
        l1.finish_write_and_delete(reserved, tag="test")
        l1.close()
