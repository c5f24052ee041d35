"""The offload tier's work without an engine (``speckv.integrations.tier_jobs``,
``chunk_codec``, ``tier_config``, ``speckv._sizes``): chunks of any bit pattern round-trip
exactly, a missing, damaged or foreign entry is never written into a slot, back-pressure drops
stores and never loads, a failing backend is left alone, configuration errors name the key.
vLLM's own classes drive the same tier in ``tests/vllm_tier_cases.py``."""

from __future__ import annotations

import threading
import time

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from helpers import SPECIALS
from speckv import CorruptStreamError
from speckv._sizes import parse_size
from speckv.integrations.chunk_codec import ChunkCodec, engine_dtype
from speckv.integrations.tier_config import TierConfig
from speckv.integrations.tier_jobs import TierJobs
from speckv.store import DirectoryBackend, MemoryBackend, StoreError, pack_entry, unpack_entry

CHUNK = 8192  # bytes: 4,096 bf16 scalars (a fast-lane chunk)
NS = {"model": "m", "layout": "NHD"}


def kv_like(n_bytes: int, seed: int = 0, dtype=ml_dtypes.bfloat16) -> np.ndarray:
    """Bytes of KV-like scalars: per-channel scales over a head_dim of 64."""
    rng = np.random.default_rng(seed)
    width = np.dtype(dtype).itemsize
    scales = np.float32(2.0) ** rng.integers(-4, 3, 64)
    x = rng.standard_normal((n_bytes // width // 64, 64)).astype(np.float32) * scales
    return x.astype(dtype).view(np.uint8).reshape(-1)


def wait_for(jobs: TierJobs, count: int, timeout: float = 30.0) -> list:
    out: list = []
    deadline = time.time() + timeout
    while len(out) < count and time.time() < deadline:
        out += jobs.finished()
        time.sleep(0.002)
    assert len(out) == count, f"{len(out)} of {count} jobs finished"
    return out


def make(primary_chunks=4, backend=None, coding="fast", **kw) -> tuple[np.ndarray, TierJobs]:
    primary = np.zeros((primary_chunks, CHUNK), dtype=np.int8)
    codec = ChunkCodec("bfloat16", CHUNK, NS, coding=coding)
    return primary, TierJobs(primary, backend or MemoryBackend(1 << 24), codec, **kw)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "fp8_e4m3", "fp8_e5m2", "float32"])
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_a_chunk_of_any_bit_pattern_round_trips_exactly(dtype, data):
    name = engine_dtype(dtype)
    width = {"bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1, "float32": 4}[name]
    word = {1: np.uint8, 2: np.uint16, 4: np.uint32}[width]
    n = data.draw(st.sampled_from([4096, 12288, 65536])) // width
    info = np.iinfo(word)
    elements = st.one_of(st.integers(int(info.min), int(info.max)), st.sampled_from(SPECIALS[word]))
    words = data.draw(hnp.arrays(word, n, elements=elements))
    if width == 2 and data.draw(st.booleans()):  # KV-like values: the fast lane's tables really used
        ftype = ml_dtypes.bfloat16 if name == "bfloat16" else np.float16
        words = kv_like(n * width, data.draw(st.integers(0, 9)), ftype).view(word)
    raw = words.view(np.uint8)
    for coding in ("fast", "none"):
        codec = ChunkCodec(dtype, raw.nbytes, NS, coding=coding)
        out = np.full(raw.nbytes, 0x5A, dtype=np.uint8)
        codec.decode_into(codec.encode(raw), out)
        assert np.array_equal(out, raw)


def test_the_fast_lane_shrinks_kv_and_finds_its_channels_once():
    raw = kv_like(1 << 16)
    codec = ChunkCodec("bfloat16", raw.nbytes, NS)
    coded = codec.encode(raw)
    assert codec.channels == 64  # the head_dim of kv_like, found from the words
    assert len(coded) < 0.8 * raw.nbytes
    assert len(ChunkCodec("bfloat16", raw.nbytes, NS, coding="none").encode(raw)) == raw.nbytes + 16


def test_keys_depend_on_the_namespace_and_the_engine_key():
    a = ChunkCodec("bfloat16", CHUNK, NS)
    assert a.key(b"k1") == ChunkCodec("bf16", CHUNK, dict(NS)).key(b"k1")  # one configuration, one key
    assert a.key(b"k1") != a.key(b"k2")
    assert a.key(b"k1") != ChunkCodec("bfloat16", CHUNK, {**NS, "model": "other"}).key(b"k1")
    assert a.key(b"k1") != ChunkCodec("float16", CHUNK, NS).key(b"k1")
    assert a.key(b"k1") != ChunkCodec("bfloat16", 2 * CHUNK, NS).key(b"k1")
    assert len(a.key(b"k1")) == 32


def test_a_payload_of_another_dtype_size_or_format_is_refused():
    raw = kv_like(CHUNK)
    bf16 = ChunkCodec("bfloat16", CHUNK, NS)
    out = np.zeros(CHUNK, dtype=np.uint8)
    for other in (ChunkCodec("float16", CHUNK, NS), ChunkCodec("bfloat16", 2 * CHUNK, NS)):
        with pytest.raises(CorruptStreamError):
            other.decode_into(bf16.encode(raw), np.zeros(other.chunk_bytes, dtype=np.uint8))
    payload = bytearray(bf16.encode(raw))
    for bad in (b"", bytes(payload[:10]), b"XXXX" + bytes(payload[4:]), bytes(payload[:-7])):
        with pytest.raises(CorruptStreamError):
            bf16.decode_into(bad, out)
    payload[len(payload) // 2] ^= 0x10
    with pytest.raises(CorruptStreamError):
        bf16.decode_into(bytes(payload), out)


def test_store_then_load_into_other_slots_bit_for_bit():
    primary, jobs = make()
    chunks = [kv_like(CHUNK, seed) for seed in range(3)]
    for slot, c in enumerate(chunks):
        primary[slot] = c.view(np.int8)
    jobs.submit_store(1, [b"a", b"b", b"c"], [0, 1, 2])
    (done,) = wait_for(jobs, 1)
    assert done.success and done.done == (b"a", b"b", b"c")
    assert all(jobs.has(k) for k in (b"a", b"b", b"c")) and not jobs.has(b"d")
    primary[:] = 0
    jobs.submit_load(2, [b"c", b"a"], [3, 1])
    (done,) = wait_for(jobs, 1)
    assert done.success and done.done == (b"c", b"a")
    assert np.array_equal(primary[3].view(np.uint8), chunks[2]) and np.array_equal(primary[1].view(np.uint8), chunks[0])
    c = jobs.counters()
    assert c["chunks_stored"] == 3 and c["chunks_loaded"] == 2 and c["hits"] == 3 and c["lookups"] == 4
    assert c["coded_bytes_stored"] < 0.8 * c["raw_bytes_stored"]
    jobs.submit_store(3, [b"a"], [0])  # already there: not coded again
    wait_for(jobs, 1)
    assert jobs.counters()["chunks_present"] == 1
    jobs.shutdown()


@pytest.mark.parametrize("fault", ["missing", "damaged", "foreign", "swapped"])
def test_a_bad_entry_ends_the_load_there_and_is_never_written(fault):
    backend = MemoryBackend(1 << 24)
    primary, jobs = make(backend=backend)
    chunks = [kv_like(CHUNK, seed) for seed in range(3)]
    for slot, c in enumerate(chunks):
        primary[slot] = c.view(np.int8)
    jobs.submit_store(1, [b"a", b"b", b"c"], [0, 1, 2])
    wait_for(jobs, 1)
    name = jobs.codec.key(b"b")
    if fault == "missing":
        backend.delete(name)
    elif fault == "damaged":
        raw = bytearray(backend.get(name))
        raw[-100] ^= 1
        backend._entries[name] = (bytes(raw), None)
    elif fault == "foreign":  # a well-formed entry of another tier's codec under this key
        other = ChunkCodec("float16", CHUNK, NS)
        backend._entries[name] = (pack_entry(other.encode(chunks[1]), name), None)
    else:  # another key's entry moved under this key
        backend._entries[name] = backend._entries[jobs.codec.key(b"c")]
    primary[3:] = 7
    jobs.submit_load(2, [b"a", b"b", b"c"], [3, 3, 3])  # one slot: what b or c would write shows
    (done,) = wait_for(jobs, 1)
    assert not done.success and done.done == (b"a",)
    assert np.array_equal(primary[3].view(np.uint8), chunks[0])  # a's bytes, nothing of b's or c's
    assert jobs.counters()["faults"] == 1
    if fault in ("damaged", "foreign", "swapped"):
        assert not backend.has(name)  # deleted: never offered again
    jobs.shutdown()


def test_back_pressure_drops_stores_never_loads():
    gate = threading.Event()

    class Slow(MemoryBackend):
        def put(self, key, value, parent=None):
            gate.wait(10)
            return super().put(key, value, parent)

    primary, jobs = make(backend=Slow(1 << 24), workers=1, max_pending=2)
    primary[0] = kv_like(CHUNK).view(np.int8)
    for job in range(5):
        jobs.submit_store(job, [bytes([job])], [0])
    dropped = jobs.finished()
    assert sorted(f.job_id for f in dropped) == [2, 3, 4] and not any(f.success for f in dropped)
    assert jobs.counters()["stores_dropped"] == 3
    jobs.submit_load(9, [bytes([0])], [1])  # queued behind the stores, not dropped
    gate.set()
    done = {f.job_id: f for f in wait_for(jobs, 3)}
    assert done[0].success and done[1].success and done[9].success
    assert np.array_equal(primary[1], primary[0])
    jobs.shutdown()


def test_a_failing_backend_is_counted_then_left_alone():
    calls = []

    class Dead(MemoryBackend):
        def has(self, key):
            calls.append(key)
            raise StoreError("redis: connection refused")

    primary, jobs = make(backend=Dead(1 << 24))
    assert not jobs.has(b"a") and not jobs.has(b"b")
    assert len(calls) == 1  # the second lookup did not ask
    jobs.submit_store(1, [b"a"], [0])
    (f,) = jobs.finished()
    assert not f.success and jobs.counters()["stores_dropped"] == 1 and jobs.counters()["faults"] == 1
    jobs.shutdown()


def test_a_folder_tier_serves_a_restarted_process(tmp_path):
    first, jobs = make(backend=DirectoryBackend(tmp_path, 1 << 24))
    first[0] = kv_like(CHUNK, 5).view(np.int8)
    jobs.submit_store(1, [b"k"], [0])
    wait_for(jobs, 1)
    jobs.shutdown()
    second, again = make(backend=DirectoryBackend(tmp_path, 1 << 24))
    assert again.has(b"k")
    again.submit_load(1, [b"k"], [2])
    assert wait_for(again, 1)[0].success
    assert np.array_equal(second[2], first[0])
    again.shutdown()


def test_the_budget_holds_and_evicts_least_recently_used():
    raw = kv_like(CHUNK)
    entry = len(pack_entry(ChunkCodec("bfloat16", CHUNK, NS).encode(raw), "0" * 32))
    backend = MemoryBackend(3 * entry + 100)
    primary, jobs = make(backend=backend)
    primary[0] = raw.view(np.int8)
    for i in range(4):
        jobs.submit_store(i, [bytes([i])], [0])
        wait_for(jobs, 1)
        if i == 2:
            jobs.touch([bytes([0])])  # 0 just used: 1 is the least recently used
    assert backend.nbytes() <= 3 * entry + 100
    assert [jobs.has(bytes([i])) for i in range(4)] == [True, False, True, True]
    assert jobs.counters()["evictions"] == 1
    jobs.shutdown()


def test_entries_unpack_only_under_their_own_key():
    codec = ChunkCodec("bfloat16", CHUNK, NS)
    payload = codec.encode(kv_like(CHUNK))
    with pytest.raises(CorruptStreamError):
        unpack_entry(pack_entry(payload, codec.key(b"a")), codec.key(b"b"))


def test_sizes_as_users_write_them():
    assert parse_size("8GB") == 8 * 10**9
    assert parse_size("512MiB") == 512 << 20
    assert parse_size("1.5 GiB") == 3 << 29
    assert parse_size(8e9) == 8 * 10**9
    assert parse_size(" 64kb ") == 64000
    for bad in ("8 GBs", "eight", "-1", 0, -5, 1.5, True, None, "1.0000001kB", [1]):
        with pytest.raises(ValueError):
            parse_size(bad)


def test_tier_config_refuses_what_cannot_work_naming_the_key():
    assert TierConfig.parse({"max_bytes": "1GiB"}).max_bytes == 1 << 30
    cases = {
        "max_byte": ({"max_byte": 1}, "did you mean 'max_bytes'"),
        "codek": ({"codek": "fast", "max_bytes": 1}, "did you mean 'codec'"),
        "budget": ({}, "max_bytes: required with store='memory'"),
        "redis budget": ({"store": "redis://127.0.0.1:1/0", "max_bytes": "1GB"}, "maxmemory"),
        "codec": ({"max_bytes": 1, "codec": "zstd"}, 'codec: expected one of "fast", "none"'),
        "workers": ({"max_bytes": 1, "workers": 0}, "workers: expected an int"),
        "pending": ({"max_bytes": 1, "max_pending": "64"}, "max_pending"),
        "size": ({"max_bytes": "8 gigs"}, "max_bytes: '8 gigs' is not a size"),
        "locality": ({"max_bytes": 1, "locality": "mars"}, "locality"),
        "events": ({"max_bytes": 1, "enable_kv_events": "yes"}, "enable_kv_events"),
        "channels": ({"max_bytes": 1, "channels": 0}, "channels"),
    }
    for what, (options, message) in cases.items():
        with pytest.raises(ValueError) as e:
            TierConfig.parse(options)
        assert message in str(e.value), what
        assert "\n" not in str(e.value), what
    assert TierConfig.parse({"store": "/tmp/x"}).max_bytes is None  # a folder may go unbounded


def test_decode_into_writes_a_slot_in_place_or_refuses():
    """The core's ``decode_into`` (the tier's load path): a predictor-free stream decoded into
    a slot of exactly its bytes; a slot of another size, a predicted stream or a misaligned
    slot refused before anything is written; ChunkCodec takes a copy for a misaligned slot."""
    from speckv import _speckv, encode

    raw = kv_like(CHUNK)
    stream = np.frombuffer(encode(raw.view(ml_dtypes.bfloat16), lane="fast"), dtype=np.uint8)
    slot = np.zeros(CHUNK + 2, dtype=np.uint8)
    _speckv.decode_into(stream, slot[:CHUNK])
    assert np.array_equal(slot[:CHUNK], raw) and not slot[CHUNK:].any()
    for bad in (slot[: CHUNK - 2], slot[1 : CHUNK + 1]):
        before = bad.copy()
        with pytest.raises(ValueError):
            _speckv.decode_into(stream, bad)
        assert np.array_equal(bad, before)
    mu = raw.view(ml_dtypes.bfloat16).astype(np.float32)
    predicted = np.frombuffer(encode(raw.view(ml_dtypes.bfloat16), mu, np.ones(1, np.float32)), dtype=np.uint8)
    with pytest.raises(ValueError, match="predicted"):
        _speckv.decode_into(predicted, slot[:CHUNK])
    codec = ChunkCodec("bfloat16", CHUNK, NS)
    odd = np.zeros(CHUNK + 1, dtype=np.uint8)[1:]  # a slot at an odd address
    codec.decode_into(codec.encode(raw), odd)
    assert np.array_equal(odd, raw)
