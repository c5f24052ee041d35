"""speckv's secondary tier (``speckv.integrations.vllm_tier.SpeckvTier``) inside vLLM's own
tiered offloading manager (``TieringOffloadingSpec``: CPU primary + secondary tiers), driven
as vLLM's scheduler drives it (``benches/tiering_driver.py``): run inside the vLLM virtualenv
by ``tests/integrations/test_vllm_tier.py``. The primary's host buffer holds the demo model's real KV in
the layouts a CPU primary holds (bf16, fp16, fp8; NHD, HND, cross-layer) and any bit pattern
(hypothesis)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("vllm.v1.kv_offload.tiering.base")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benches"))
from tiering_driver import SPECKV_TIER, TieringDriver, kv_rows, offload_key  # noqa: E402
from vllm.v1.kv_offload.base import ReqContext  # noqa: E402
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec  # noqa: E402

from services import redis_cluster_url, redis_url  # noqa: E402, F401  (Redis servers on loopback ports)
from speckv.store import DirectoryBackend  # noqa: E402

TOKENS = 16
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "fp8_e4m3": torch.float8_e4m3fn}


@lru_cache(maxsize=1)
def demo_kv() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The demo model's cache of 128 tokens of the bundled text (bf16)."""
    from speckv.models.cache import prefill
    from speckv.models.demo import bundled_text, load_demo_model, prompts

    model, tokenizer = load_demo_model()
    (ids,) = prompts(tokenizer, bundled_text(), 128, count=1)
    return prefill(model, ids)


def rows_of(dtype: str, layout: str = "NHD") -> list[np.ndarray]:
    kv = [(k.to(DTYPES[dtype]), v.to(DTYPES[dtype])) for k, v in demo_kv()]
    return kv_rows(kv, TOKENS, layout)


def tier(**options) -> dict:
    return {**SPECKV_TIER, "store": "memory", "max_bytes": "256MB", **options}


def store_evict_load(driver: TieringDriver, rows: list[np.ndarray], first: int = 0) -> list[np.ndarray]:
    """Stores ``rows`` under keys first.., pushes them out of the primary with other chunks,
    then loads them back through the secondary tier."""
    keys = [offload_key(first + i) for i in range(len(rows))]
    assert driver.store(keys, rows) == len(rows)
    driver.settle()
    filler = [offload_key(10**6 + first + i) for i in range(len(rows) * 2)]
    for key in filler:  # one request each: the primary evicts the oldest chunks
        driver.store([key], [rows[0]])
    driver.settle()
    assert driver.manager.primary_tier.lookup(keys[0], ReqContext(req_id="probe")).name == "MISS"
    ready, _ = driver.lookup(keys)
    assert ready == len(keys), f"{ready} of {len(keys)} chunks served"
    return driver.load(keys)


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("layout", ["NHD", "HND", "cross-layer"])
def test_real_kv_through_vllms_primary_and_the_speckv_tier_bit_for_bit(dtype, layout):
    rows = rows_of(dtype, layout)[:6]
    driver = TieringDriver([tier()], cpu_chunks=8, block_bytes=rows[0].nbytes, dtype=dtype)
    back = store_evict_load(driver, rows)
    assert all(np.array_equal(a, b) for a, b in zip(back, rows))
    c = driver.tiers[0].jobs.counters()
    assert c["chunks_loaded"] == len(rows) and c["faults"] == 0
    ratio = c["coded_bytes_stored"] / c["raw_bytes_stored"]
    print(f"{dtype} {layout}: coded/raw {ratio:.3f}")
    assert ratio < {"bfloat16": 0.8, "float16": 0.93, "fp8_e4m3": 0.95}[dtype], ratio  # real KV shrinks
    stats = driver.manager.get_stats().reduce()
    assert stats["vllm:kv_offload_speckv_chunks_loaded:('default',)"] == len(rows)
    driver.shutdown()


def test_a_cache_dtype_speckv_has_no_type_for_is_stored_as_it_is():
    rows = [np.random.default_rng(i).integers(0, 256, 8192, dtype=np.uint8) for i in range(3)]
    driver = TieringDriver([tier()], cpu_chunks=4, block_bytes=8192, dtype="int8")
    assert driver.tiers[0].jobs.codec.coding == "none"
    back = store_evict_load(driver, rows)
    assert all(np.array_equal(a, b) for a, b in zip(back, rows))
    driver.shutdown()


def test_the_raw_codec_serves_the_same_chunks_at_their_size():
    rows = rows_of("bfloat16")[:4]
    driver = TieringDriver([tier(codec="none")], cpu_chunks=6, block_bytes=rows[0].nbytes)
    back = store_evict_load(driver, rows)
    assert all(np.array_equal(a, b) for a, b in zip(back, rows))
    c = driver.tiers[0].jobs.counters()
    assert c["coded_bytes_stored"] == c["raw_bytes_stored"] + 16 * c["chunks_stored"]
    driver.shutdown()


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    dtype=st.sampled_from(list(DTYPES)),
    block_bytes=st.sampled_from([4096, 12288, 40000, 65536]),
    seed=st.integers(0, 2**32 - 1),
    special=st.sampled_from([None, 0x00, 0xFF, 0x7F, 0x80]),
)
def test_any_bit_pattern_of_any_chunk_size_round_trips(dtype, block_bytes, seed, special):
    rng = np.random.default_rng(seed)
    rows = [rng.integers(0, 256, block_bytes, dtype=np.uint8) for _ in range(3)]
    if special is not None:
        rows[1][:] = special
        rows[2][::7] = special
    driver = TieringDriver([tier()], cpu_chunks=4, block_bytes=block_bytes, dtype=dtype)
    back = store_evict_load(driver, rows, first=seed % 1000)
    assert all(np.array_equal(a, b) for a, b in zip(back, rows))
    driver.shutdown()


def test_the_budget_holds_and_the_engine_recomputes_what_it_evicted():
    rows = rows_of("bfloat16")[:8]
    probe = TieringDriver([tier()], cpu_chunks=2, block_bytes=rows[0].nbytes)
    probe.store([offload_key(0)], rows[:1])
    probe.settle()
    entry = probe.tiers[0].jobs.counters()["resident_bytes"]
    probe.shutdown()
    budget = int(entry * 3.5)
    driver = TieringDriver([tier(max_bytes=budget)], cpu_chunks=4, block_bytes=rows[0].nbytes)
    keys = [offload_key(i) for i in range(len(rows))]
    for key, row in zip(keys, rows):
        driver.store([key], [row])
        driver.settle()
    jobs = driver.tiers[0].jobs
    assert jobs.backend.nbytes() <= budget and jobs.counters()["evictions"] >= 4
    held = [k for k in keys if jobs.has(bytes(k))]
    assert 1 <= len(held) <= 3 and held == keys[-len(held) :]  # least recently used went first
    ready, _ = driver.lookup(keys[:1])
    assert ready == 0  # evicted: a miss, recomputed
    driver.load([])
    ready, _ = driver.lookup(held)
    assert ready == len(held)
    back = driver.load(held)
    assert all(np.array_equal(a, rows[keys.index(k)]) for a, k in zip(back, held))
    driver.shutdown()


def test_concurrent_jobs_from_many_requests_all_round_trip():
    rows = rows_of("bfloat16")
    driver = TieringDriver([tier(workers=4)], cpu_chunks=len(rows) + 4, block_bytes=rows[0].nbytes)
    keys = [offload_key(i) for i in range(len(rows))]
    for i in range(0, len(rows), 2):  # requests of two chunks each, stored without waiting
        driver.store(keys[i : i + 2], rows[i : i + 2])
    driver.settle()
    for key in [offload_key(10**6 + i) for i in range(len(rows) + 4)]:
        driver.store([key], rows[:1])
    driver.settle()
    ready, _ = driver.lookup(keys)
    assert ready == len(keys)
    back = driver.load(keys)
    assert all(np.array_equal(a, b) for a, b in zip(back, rows))
    driver.shutdown()


@pytest.mark.parametrize("backend", ["folder", "redis", "cluster"])
def test_a_restarted_server_serves_what_the_last_one_stored(backend, tmp_path, request):
    if backend == "folder":
        options = {"store": str(tmp_path / "tier"), "max_bytes": "64MB"}
    else:
        url = request.getfixturevalue("redis_url" if backend == "redis" else "redis_cluster_url")
        options = {"store": url, "max_bytes": None}  # Redis's budget is its own maxmemory
    rows = rows_of("bfloat16")[:4]
    keys = [offload_key(i) for i in range(len(rows))]
    first = TieringDriver([tier(**options)], cpu_chunks=6, block_bytes=rows[0].nbytes)
    first.store(keys, rows)
    first.settle()
    c = first.tiers[0].jobs.counters()
    assert c["chunks_stored"] + c["chunks_present"] == len(keys), c
    first.shutdown()
    second = TieringDriver([tier(**options)], cpu_chunks=6, block_bytes=rows[0].nbytes)
    ready, _ = second.lookup(keys)
    assert ready == len(keys), second.tiers[0].jobs.counters()
    back = second.load(keys)
    assert all(np.array_equal(a, b) for a, b in zip(back, rows))
    second.shutdown()
    other = TieringDriver([tier(name="other", **options)], cpu_chunks=6, block_bytes=rows[0].nbytes)
    assert other.lookup(keys)[0] == 0  # another namespace: a miss, never another tier's blocks
    other.load([])
    other.shutdown()


def test_a_damaged_entry_is_a_miss_then_gone(tmp_path):
    rows = rows_of("bfloat16")[:3]
    keys = [offload_key(i) for i in range(3)]
    store = str(tmp_path / "tier")
    driver = TieringDriver([tier(store=store, max_bytes=None)], cpu_chunks=4, block_bytes=rows[0].nbytes)
    driver.store(keys, rows)
    driver.settle()
    folder = DirectoryBackend(store)
    name = driver.tiers[0].jobs.codec.key(bytes(keys[1]))
    path = folder._file(name)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    driver.shutdown()
    again = TieringDriver([tier(store=store, max_bytes=None)], cpu_chunks=4, block_bytes=rows[0].nbytes)
    ready, _ = again.lookup(keys)
    assert ready == 1  # the damaged chunk fails its load: the prefix ends before it
    back = again.load(keys[:1])
    assert np.array_equal(back[0], rows[0])
    c = again.tiers[0].jobs.counters()
    assert c["faults"] == 1 and not folder.has(name)
    assert again.lookup(keys)[0] == 1  # deleted: a plain miss from now on
    again.load(keys[:1])
    again.shutdown()


def test_bad_configuration_fails_at_start_up_naming_the_key():
    cases = {
        "max_byte": "did you mean 'max_bytes'",
        "codec": 'codec: expected one of "fast", "none"',
        "budget": "max_bytes: required with store='memory'",
    }
    configs = {
        "max_byte": {**SPECKV_TIER, "max_byte": "8GB"},
        "codec": tier(codec="zstd"),
        "budget": {**SPECKV_TIER},
    }
    for what, config in configs.items():
        with pytest.raises(ValueError, match=cases[what]):
            TieringDriver([config], cpu_chunks=2, block_bytes=4096)
    definitions = TieringOffloadingSpec.build_metric_definitions({"secondary_tiers": [tier()]})
    assert "vllm:kv_offload_speckv_decode_seconds" in definitions  # vLLM registers our metrics


def test_locality_reaches_vllms_tier_filters():
    from vllm.v1.kv_offload.base import Locality

    for written, want in (("remote", Locality.REMOTE), ("LOCAL", Locality.LOCAL), (None, None)):
        driver = TieringDriver([tier(locality=written)], cpu_chunks=2, block_bytes=4096)
        assert driver.tiers[0].locality is want
        driver.shutdown()


def test_events_name_the_stored_chunks():
    rows = rows_of("bfloat16")[:2]
    driver = TieringDriver([tier(enable_kv_events=True)], cpu_chunks=4, block_bytes=rows[0].nbytes, events=True)
    keys = [offload_key(i) for i in range(2)]
    driver.store(keys, rows)
    driver.settle()
    events = [e for e in driver.manager.take_events() if e.ownership is None and e.medium.name == "CPU"]
    stored = {k for e in events if not e.removed for k in e.keys}
    assert set(keys) <= stored
    driver.shutdown()


WRITER = textwrap.dedent(
    """
    import sys, numpy as np
    sys.path.insert(0, {benches!r})
    from tiering_driver import SPECKV_TIER, TieringDriver, offload_key
    rng = np.random.default_rng(7)
    driver = TieringDriver([{{**SPECKV_TIER, "store": {url!r}, "workers": 1}}], cpu_chunks=4, block_bytes=65536)
    print("ready", flush=True)
    for i in range(100000):
        row = (rng.standard_normal(32768) * 0.1).astype(np.float16).view(np.uint8)
        np.save({folder!r} + f"/{{i}}.npy", row)
        driver.store([offload_key(i)], [row])
        driver.settle()  # stored before the next (no store dropped for back-pressure)
    """
)


@pytest.mark.parametrize("kind", ["redis", "cluster"])
def test_two_servers_share_one_redis_and_a_killed_writer_leaves_nothing_wrong(kind, tmp_path, request):
    """Server A stores chunks over Redis (one server, or a cluster of three masters) until it is
    killed mid-save (SIGKILL); server B, its own process with its own primary, serves every
    chunk A stored bit for bit, and none it did not (a partial write is never visible: ``SET
    NX`` of a whole checksummed entry)."""
    url = request.getfixturevalue("redis_url" if kind == "redis" else "redis_cluster_url")
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER.format(benches=str(ROOT / "benches"), url=url, folder=str(tmp_path))],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert writer.stdout.readline().strip() == "ready"
    time.sleep(3.0)
    os.kill(writer.pid, signal.SIGKILL)
    writer.wait(timeout=30)
    saved = sorted(int(p.stem) for p in tmp_path.glob("*.npy"))[:-1]  # the last file may be cut short
    assert len(saved) > 5
    reader = TieringDriver([{**SPECKV_TIER, "store": url}], cpu_chunks=4, block_bytes=65536)
    served = 0
    for i in saved:
        key = offload_key(i)
        ready, _ = reader.lookup([key])
        rows = reader.load([key] if ready else [])
        if ready:
            served += 1
            assert np.array_equal(rows[0], np.load(tmp_path / f"{i}.npy")), i
    assert served >= len(saved) - 1  # the last may have died with the writer
    assert reader.tiers[0].jobs.counters()["faults"] == 0
    reader.shutdown()
