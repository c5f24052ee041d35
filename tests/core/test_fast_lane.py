"""The fast lane (``rust/speckv/src/fast_lane.rs``): predictor-free 8/16-bit streams coded with
static per-chunk tables. Exact for every pattern, shape, chunk size, channel period and thread
count; the same bytes whatever kernel decodes; the format pinned by goldens; damage refused."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

import speckv
from helpers import DTYPES, as_dtype, bit_arrays, run_in_child, same_bits, shapes

LANE_DTYPES = ["bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"]


def kv_like(seed: int, tokens: int = 512, channels: int = 64, dtype=ml_dtypes.bfloat16) -> np.ndarray:
    """Channels of very different scales and means, as in a KV cache: [2, tokens, channels]."""
    rng = np.random.default_rng(seed)
    scale = np.exp(rng.normal(-2.0, 1.5, channels)).astype(np.float32)
    mean = (rng.normal(0, 1, channels) * scale * (rng.random(channels) < 0.2)).astype(np.float32)
    x = rng.standard_normal((2, tokens, channels)).astype(np.float32) * scale + mean
    return x.astype(dtype)


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(LANE_DTYPES),
    data=st.data(),
    chunk=st.sampled_from([None, 1, 31, 33, 100, 1024]),
    channels=st.one_of(st.none(), st.integers(1, 70)),
)
def test_every_pattern_round_trips_whatever_the_chunks_and_channels(name, data, chunk, channels):
    word = DTYPES[name][1]
    x = as_dtype(data.draw(bit_arrays(word, shapes)), name)
    stream = speckv.encode(x, chunk_size=chunk, channels=channels, lane="fast")
    assert speckv.info(stream)["lane"] == "fast" and speckv.info(stream)["version"] == speckv.FAST_LANE_VERSION
    assert same_bits(speckv.decode(stream), x)


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), chunk=st.sampled_from([4096, 20000, 65536]), threads=st.sampled_from([2, 3]))
def test_bytes_never_depend_on_the_thread_count(seed, chunk, threads):
    # several chunks, so the threads really split the work
    x = kv_like(seed, tokens=1200)
    one = speckv.encode(x, chunk_size=chunk, threads=1)
    assert speckv.info(one)["chunks"] > 1
    assert speckv.encode(x, chunk_size=chunk, threads=threads) == one
    assert same_bits(speckv.decode(one, threads=threads), x)


def test_a_range_of_chunks_and_joined_slabs_decode_alone():
    """``decode(chunks=...)`` reads only those chunks; slabs coded apart join into the stream of
    the whole (a chunk's bytes do not depend on where it sits)."""
    x = kv_like(9, tokens=1000)  # [2, 1000, 64]: chunks of 16,000 scalars, 250 tokens
    stream = speckv.encode(x, chunk_size=16000)
    flat = x.reshape(-1)
    assert same_bits(speckv.decode(stream, chunks=(2, 5)), flat[2 * 16000 : 5 * 16000])
    halves = [speckv.encode(x[:1], chunk_size=16000), speckv.encode(x[1:], chunk_size=16000)]
    assert speckv.join_streams(halves) == stream
    assert same_bits(speckv.decode(speckv.cut_stream(stream, (4, 8))), x[1:])


def test_every_16_bit_pattern_and_a_constant_round_trip():
    for name in ("bfloat16", "float16"):
        x = np.arange(1 << 16, dtype=np.uint16).view(DTYPES[name][0]).reshape(256, 256)
        assert same_bits(speckv.decode(speckv.encode(x)), x)
    for name in LANE_DTYPES:
        zeros = np.zeros((3, 70000), dtype=DTYPES[name][0])
        stream = speckv.encode(zeros)
        assert speckv.info(stream)["lane"] == "fast" and same_bits(speckv.decode(stream), zeros)


def test_tables_per_channel_group_beat_the_adaptive_lane_and_zstd():
    zstandard = pytest.importorskip("zstandard", reason="zstandard (the hf and bench extras) is not installed")

    x = kv_like(1, tokens=2048)
    fast = len(speckv.encode(x))
    adaptive = len(speckv.encode(x, lane="adaptive"))
    one_channel = len(speckv.encode(x, channels=1))
    zstd = len(zstandard.ZstdCompressor(level=19).compress(x.tobytes()))
    assert fast < adaptive and fast < one_channel and fast < zstd, (fast, adaptive, one_channel, zstd)


@pytest.mark.parametrize("name", LANE_DTYPES)
@pytest.mark.parametrize("channels", [64, 192, 96])
def test_a_flattened_cache_codes_as_well_as_its_tensor(name, channels):
    """A 1-D stream without ``channels=`` gets its period from its words (``speckv._channels``),
    so flattening a cache (``x.reshape(-1)``) costs at most 2% (issue 36), where one channel
    per scalar, the old default, cost ~40%; the round trip stays exact."""
    x = kv_like(3, tokens=1024, channels=channels, dtype=DTYPES[name][0])
    flat = x.reshape(-1)
    data = speckv.encode(flat)
    assert same_bits(speckv.decode(data), flat)
    assert len(data) <= 1.02 * len(speckv.encode(x)), (len(data), len(speckv.encode(x)))
    per_scalar = len(speckv.encode(flat, channels=flat.size))
    assert len(data) < 0.9 * per_scalar


def test_a_1d_stream_given_channels_keeps_them_and_a_short_one_is_one_channel():
    x = kv_like(4, tokens=256, channels=64).reshape(-1)
    assert speckv.encode(x, channels=64) != speckv.encode(x, channels=1)
    assert speckv.encode(x) == speckv.encode(x, channels=64)
    short = x[:40]
    assert speckv.encode(short) == speckv.encode(short, channels=1)


@pytest.mark.parametrize("simd", ["0", "avx2"])
def test_the_same_output_under_every_kernel(simd):
    """A stream decoded by this process's kernel and by the portable code (``SPECKV_SIMD=0``)
    or the AVX2 kernel (``SPECKV_SIMD=avx2``), each in a child process, gives the same bits;
    the child asserts which kernel ran, and encodes the same bytes."""
    x = kv_like(5, tokens=1500)
    stream = speckv.encode(x, chunk_size=50000)
    digest = xxhash.xxh3_64_hexdigest(np.ascontiguousarray(speckv.decode(stream)).view(np.uint16).tobytes())
    assert digest == xxhash.xxh3_64_hexdigest(x.view(np.uint16).tobytes())
    here = speckv._speckv.fast_lane_kernel()
    expected = "avx2" if simd == "avx2" and here in ("avx512", "avx2") else "portable"
    code = (
        "import sys, numpy as np, xxhash, speckv\n"
        "from speckv import _speckv\n"
        f"assert _speckv.fast_lane_kernel() == {expected!r}, _speckv.fast_lane_kernel()\n"
        "data = sys.stdin.buffer.read()\n"
        "y = speckv.decode(data)\n"
        "assert speckv.encode(y, chunk_size=50000) == data, 'other bytes'\n"
        "print(xxhash.xxh3_64_hexdigest(np.ascontiguousarray(y).view(np.uint16).tobytes()))\n"
    )
    assert run_in_child(code, stream, simd) == digest


def test_damage_is_refused_with_a_typed_error():
    x = kv_like(2, tokens=64)
    stream = speckv.encode(x, chunk_size=1000, lane="fast")
    for i in range(0, len(stream), 7):
        bad = bytearray(stream)
        bad[i] ^= 0x41
        with pytest.raises((speckv.CorruptStreamError, speckv.UnsupportedStreamError)):
            speckv.decode(bytes(bad))
    for cut in (0, 10, len(stream) // 2, len(stream) - 1):
        with pytest.raises((speckv.CorruptStreamError, speckv.UnsupportedStreamError)):
            speckv.decode(stream[:cut])


def test_the_default_lane_is_fast_where_chunks_pay_for_their_tables():
    small, large = kv_like(4, tokens=16), kv_like(4, tokens=64)  # 2,048 and 8,192 scalars
    assert speckv.info(speckv.encode(small))["lane"] == "adaptive"
    assert speckv.info(speckv.encode(large))["lane"] == "fast"
    assert speckv.info(speckv.encode(large, chunk_size=1024))["lane"] == "adaptive"
    assert speckv.info(speckv.encode(small, lane="fast"))["lane"] == "fast"
    assert len(speckv.encode(large)) < len(speckv.encode(large, lane="adaptive"))


def test_lane_arguments_are_checked():
    x = kv_like(3, tokens=64)
    mu = x.astype(np.float32)
    with pytest.raises(ValueError, match="predictor-free"):
        speckv.encode(x, mu, np.ones(64, np.float32), lane="fast")
    with pytest.raises(ValueError, match="float32"):
        speckv.encode(mu, lane="fast")
    with pytest.raises(ValueError, match="lane"):
        speckv.encode(x, lane="quick")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="channels"):
        speckv.encode(x, channels=0)
    # predicted and float32 streams keep their models
    assert speckv.info(speckv.encode(x, mu, np.ones(64, np.float32)))["lane"] is None
    assert speckv.info(speckv.encode(mu))["lane"] == "adaptive"


def _golden_case() -> list[np.ndarray]:
    bf16 = kv_like(2026, tokens=1100)  # 140,800 scalars: three chunks, the last short
    fp8 = kv_like(2027, tokens=700, dtype=ml_dtypes.float8_e4m3fn)
    f16 = kv_like(2028, tokens=300, channels=48, dtype=np.float16)
    return [bf16, fp8, f16]


def test_golden_streams_freeze_format_v3():
    """A change here is a format change: bump FAST_LANE_VERSION and keep reading the old ones.
    Multi-chunk streams of each width, built from fixed seeds."""
    digests = [xxhash.xxh3_64_hexdigest(speckv.encode(x)) for x in _golden_case()]
    assert digests == GOLDEN_FAST_LANE, digests


GOLDEN_FAST_LANE = ["d70edb52cf8b17b6", "dc86ce6d83eb376e", "06030ff83914c8c8"]
