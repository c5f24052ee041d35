"""Bad input gets a typed speckv exception, never a crash, a hang or a huge allocation."""

from __future__ import annotations

import struct
import time

import ml_dtypes
import numpy as np
import pytest

import speckv

xxhash = pytest.importorskip("xxhash")


def small_case(predicted: bool = True):
    rng = np.random.default_rng(7)
    mu = rng.standard_normal((6, 20)).astype(np.float32)
    sigma = np.linspace(0.01, 0.2, 20, dtype=np.float32)
    x = (mu + rng.standard_normal(mu.shape).astype(np.float32) * sigma).astype(ml_dtypes.bfloat16)
    x[0, 0] = np.nan
    x[1, 1] = -np.inf
    pred = (mu, sigma) if predicted else ()
    return x, pred, speckv.encode(x, *pred, chunk_size=32)


def test_exception_hierarchy():
    assert issubclass(speckv.SpeckvError, ValueError)
    assert issubclass(speckv.CorruptStreamError, speckv.SpeckvError)
    assert issubclass(speckv.ChecksumError, speckv.CorruptStreamError)
    assert issubclass(speckv.UnsupportedStreamError, speckv.CorruptStreamError)
    assert issubclass(speckv.PredictionMismatchError, speckv.SpeckvError)


@pytest.mark.parametrize("predicted", [True, False])
def test_every_single_bit_flip_is_caught_or_harmless(predicted):
    x, pred, stream = small_case(predicted)
    word = np.uint16
    t0 = time.perf_counter()
    caught = 0
    for i in range(len(stream) * 8):
        damaged = bytearray(stream)
        damaged[i // 8] ^= 1 << (i % 8)
        try:
            y = speckv.decode(bytes(damaged), *pred, threads=1)
        except (speckv.CorruptStreamError, speckv.PredictionMismatchError):
            caught += 1
            continue
        # A flip that decodes must decode to the original (it landed in slack).
        assert np.array_equal(y.view(word), x.view(word)), f"bit {i} changed the output silently"
    assert caught >= len(stream) * 8 * 0.99
    assert time.perf_counter() - t0 < 60


@pytest.mark.parametrize("predicted", [True, False])
def test_truncation_and_junk(predicted):
    _, pred, stream = small_case(predicted)
    for n in range(len(stream)):
        with pytest.raises(speckv.CorruptStreamError):
            speckv.decode(stream[:n], *pred)
    for junk in (b"\x00", b"\x00" * 4, b"SPKV", bytes(range(64))):
        with pytest.raises(speckv.CorruptStreamError):
            speckv.decode(stream + junk, *pred)


def test_random_bytes_are_refused():
    rng = np.random.default_rng(0)
    for n in [0, 1, 3, 4, 16, 100, 1000]:
        for _ in range(20):
            junk = rng.integers(0, 256, n, dtype=np.uint8).tobytes()
            with pytest.raises(speckv.CorruptStreamError):
                speckv.decode(junk)
            # the right magic and version do not make junk valid
            with pytest.raises(speckv.CorruptStreamError):
                speckv.decode(b"SPKV\x01\x00" + junk)


def forge(stream: bytes, edit) -> bytes:
    """Apply `edit` to the header and recompute the header checksum, as a forger would."""
    ndim = stream[9]
    n_chunks_at = 24 + 8 * ndim + 16 + 24
    n_chunks = struct.unpack_from("<I", stream, n_chunks_at)[0]
    end = n_chunks_at + 8 + 32 * n_chunks
    header = bytearray(stream[:end])
    edit(header)
    return bytes(header) + struct.pack("<Q", xxhash.xxh3_64_intdigest(bytes(header))) + stream[end + 8 :]


def test_the_fast_lane_versions_are_told_apart():
    """Version 3 holds predictor-free fast-lane streams and the bins model's first revision
    (32 states), version 4 the bins model's second (16 states): a stream relabelled across
    them is refused with a typed error, never decoded by the other revision's rule."""
    x, pred, _ = small_case()
    bins = speckv.encode(x, *pred, model="bins", chunk_size=32)
    free = speckv.encode(x, lane="fast", chunk_size=32)
    assert (speckv.info(bins)["version"], speckv.info(free)["version"]) == (speckv.BINS_VERSION, 3)
    version = lambda v: lambda h: h.__setitem__(slice(4, 6), struct.pack("<H", v))  # noqa: E731
    with pytest.raises(speckv.UnsupportedStreamError, match="16 coder lanes per chunk; .* 32 in a version-3"):
        speckv.decode(forge(bins, version(3)), *pred)
    with pytest.raises(speckv.CorruptStreamError, match="version-4 stream is coded with the bins model"):
        speckv.decode(forge(free, version(4)))
    with pytest.raises(speckv.UnsupportedStreamError, match="32 coder lanes per chunk; .* 16 in a version-4"):
        speckv.decode(forge(bins, lambda h: h.__setitem__(10, 32)), *pred)


def test_forged_checksum_is_accepted_when_nothing_changed():
    x, pred, stream = small_case()
    assert forge(stream, lambda h: None) == stream


def test_huge_shape_is_refused_without_allocating():
    import tracemalloc

    _, pred, stream = small_case(predicted=False)

    def huge(h):
        struct.pack_into("<Q", h, 16, 1 << 39)  # scalars
        struct.pack_into("<QQ", h, 24, 1 << 20, 1 << 19)  # shape
        struct.pack_into("<I", h, 12, 1 << 24)  # scalars per chunk

    forged = forge(stream, huge)
    tracemalloc.start()
    with pytest.raises(speckv.CorruptStreamError):
        speckv.decode(forged)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert peak < 10 << 20

    def one_big_chunk(h):
        struct.pack_into("<Q", h, 16, 1 << 24)
        struct.pack_into("<QQ", h, 24, 1 << 12, 1 << 12)
        struct.pack_into("<I", h, 12, 1 << 24)

    with pytest.raises(speckv.CorruptStreamError, match="chunks|claims"):
        speckv.decode(forge(stream, one_big_chunk))


def test_unknown_version_and_flags():
    _, pred, stream = small_case()
    for version in (0, speckv.BINS_VERSION + 1):
        with pytest.raises(speckv.UnsupportedStreamError, match=f"format version {version}"):
            speckv.decode(stream[:4] + struct.pack("<H", version) + stream[6:], *pred)
    # version 3 is the fast lane's: a stream claiming it without the flag (or the reverse) is forged
    for version in (3, speckv.BINS_VERSION):
        with pytest.raises(speckv.CorruptStreamError, match="fast-lane flag clear"):
            speckv.decode(forge(stream, lambda h, v=version: h.__setitem__(slice(4, 6), struct.pack("<H", v))), *pred)
    with pytest.raises(speckv.UnsupportedStreamError, match="16 coder lanes"):
        speckv.decode(forge(stream, lambda h: h.__setitem__(10, 16)), *pred)
    with pytest.raises(speckv.CorruptStreamError, match="reserved"):
        speckv.decode(forge(stream, lambda h: h.__setitem__(11, 1)), *pred)
    with pytest.raises(speckv.UnsupportedStreamError, match="flags"):
        speckv.decode(forge(stream, lambda h: h.__setitem__(7, 0x80)), *pred)
    with pytest.raises(speckv.UnsupportedStreamError, match="magic"):
        speckv.decode(b"ZSTD" + stream[4:], *pred)


def test_perturbed_prediction_is_a_mismatch():
    x, (mu, sigma), stream = small_case()
    mu2 = mu.copy()
    mu2[3, 7] += 0.5
    with pytest.raises(speckv.PredictionMismatchError):
        speckv.decode(stream, mu2, sigma)
    sigma2 = sigma.copy()
    sigma2[5] *= 4
    with pytest.raises(speckv.PredictionMismatchError):
        speckv.decode(stream, mu, sigma2)
    with pytest.raises(speckv.PredictionMismatchError):
        speckv.decode(stream)
    with pytest.raises(speckv.PredictionMismatchError, match="shape"):
        speckv.decode(stream, mu[:3], sigma)
    _, _, free = small_case(predicted=False)
    with pytest.raises(speckv.PredictionMismatchError):
        speckv.decode(free, mu, sigma)


def test_argument_errors_name_the_argument():
    x, (mu, sigma), _ = small_case()
    with pytest.raises(ValueError, match="mu"):
        speckv.encode(x, mu[:2], sigma)
    with pytest.raises(ValueError, match="sigma"):
        speckv.encode(x, mu, np.zeros(20, np.float32))
    with pytest.raises(ValueError, match="sigma"):
        speckv.encode(x, mu, np.full(20, np.nan, np.float32))
    with pytest.raises(ValueError, match="sigma"):
        speckv.encode(x, mu, -1.0)
    with pytest.raises(ValueError, match="sigma"):
        speckv.encode(x, mu, np.ones(7, np.float32))
    with pytest.raises(ValueError, match="sigma"):
        speckv.encode(x, mu)
    with pytest.raises(ValueError, match="mu"):
        speckv.encode(x, sigma=sigma)
    with pytest.raises(TypeError, match="x"):
        speckv.encode(x.astype(np.float64))
    with pytest.raises(TypeError, match="x"):
        speckv.encode([1.0, 2.0])
    with pytest.raises(TypeError, match="mu"):
        speckv.encode(x, np.zeros(x.shape, dtype=np.int32) > 0, sigma)
    with pytest.raises(ValueError, match="threads"):
        speckv.encode(x, threads=0)
    with pytest.raises(TypeError, match="data"):
        speckv.decode(12345)
    with pytest.raises(ValueError, match="model"):
        speckv.encode(x, mu, sigma, model="turbo")


def test_threads_from_environment(monkeypatch):
    x, pred, stream = small_case()
    monkeypatch.setenv("SPECKV_NUM_THREADS", "3")
    assert speckv.encode(x, *pred, chunk_size=32) == stream
    monkeypatch.setenv("SPECKV_NUM_THREADS", "lots")
    with pytest.raises(ValueError, match="SPECKV_NUM_THREADS"):
        speckv.encode(x)


def _golden_case():
    x = np.array([[1.0, -2.5, 0.0, np.nan], [1e-40, np.inf, -0.0, 65504.0]], dtype=np.float32).astype(
        ml_dtypes.bfloat16
    )
    mu = np.array([[1.01, -2.4, 0.001, 0.0], [0.0, 1.0, 0.0, 6e4]], dtype=np.float32)
    sigma = np.array([0.01, 0.1, 0.001, 100.0], dtype=np.float32)
    return x, mu, sigma


def test_golden_stream_freezes_format_v2():
    """A change here is a format change: bump FORMAT_VERSION and keep reading the old ones."""
    x, mu, sigma = _golden_case()
    stream = speckv.encode(x, mu, sigma)
    assert xxhash.xxh3_64_hexdigest(stream) == GOLDEN_PREDICTED, xxhash.xxh3_64_hexdigest(stream)
    assert stream.hex() == GOLDEN_HEX
    assert speckv.info(stream)["version"] == 2 and speckv.info(stream)["lanes"] == 8
    free = speckv.encode(x, lane="adaptive")
    assert xxhash.xxh3_64_hexdigest(free) == GOLDEN_FREE, xxhash.xxh3_64_hexdigest(free)
    assert speckv.info(free)["version"] == 2
    fast = speckv.encode(x, mu, sigma, model="fast")
    assert xxhash.xxh3_64_hexdigest(fast) == GOLDEN_FAST, xxhash.xxh3_64_hexdigest(fast)


def test_format_v1_streams_still_decode():
    """Version 1 (two coder lanes, the same models) was written by speckv 0.1 before the
    coder-throughput work; its streams must keep decoding."""
    x, mu, sigma = _golden_case()
    v1 = bytes.fromhex(GOLDEN_HEX_V1)
    meta = speckv.info(v1)
    assert (meta["version"], meta["lanes"], meta["model"]) == (1, 2, "exact")
    assert speckv.decode(v1, mu, sigma).view(np.uint16).tolist() == x.view(np.uint16).tolist()
    with pytest.raises(speckv.PredictionMismatchError):
        speckv.decode(v1, mu + 1, sigma)


GOLDEN_PREDICTED = "d9e94cb8c001d503"
GOLDEN_FAST = "9bfb660ee7ce32f2"
GOLDEN_FREE = "90669cc975f4305a"
GOLDEN_HEX = (
    "53504b5602000100010208000000020008000000000000000200000000000000040000000000000018fc0618b2fd3e02"
    "100003031800800004000000040000004883540cb0e07dea9081c27a3c5f401a01000000000000008000000000000000"
    "1b0000000000000043eeb7b1bcb89a5fad3a9a5c7686b6ae7d59c309238372d801010303030303402849b327f5bcff7b"
    "b67fb8b7ffc1b47f083cff"
)
# The same tensor, prediction and model written by format version 1 (speckv 0.1).
GOLDEN_HEX_V1 = (
    "53504b5601000100010200000000020008000000000000000200000000000000040000000000000018fc0618b2fd3e02"
    "100003031800800004000000040000004883540cb0e07dea9081c27a3c5f401a01000000000000008000000000000000"
    "1c00000000000000738bee3cb12a59f7ad3a9a5c7686b6aedee9267bea64499e0c00000055fcf22446039a6d0083b5f5"
    "497ca52bbfc6eda5a05cf7f7"
)
