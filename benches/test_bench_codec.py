"""The codec against constriction, zstd and ZipNN on the same synthetic data (one run).

Predicted coding: speckv's exact and bins models against constriction's range coder with a
quantised Gaussian on the same ordinal residuals and scales (``bench_codec``). Predictor-free:
speckv's fast lane against ZipNN and zstd on the same bytes (``predictor_free``).
"""

from __future__ import annotations

import numpy as np
import pytest
from bench_codec import constriction_coder, ordinal_residuals_and_scales
from conftest import record

import speckv


def _same(y: np.ndarray, x: np.ndarray) -> bool:
    return bool(np.array_equal(np.asarray(y).view(np.uint16), x.view(np.uint16)))


@pytest.mark.parametrize("model", ["exact", "bins"])
def test_speckv_decode(benchmark, synthetic, rates, model):
    x, mu, sigma = synthetic
    data = speckv.encode(x, mu, sigma, model=model)
    y = benchmark(speckv.decode, data, mu, sigma)
    assert _same(y, x)
    record(benchmark, rates, f"speckv {model} decode", x.size, bits_per_scalar=len(data) * 8 / x.size)


def test_speckv_exact_encode(benchmark, synthetic, rates):
    x, mu, sigma = synthetic
    data = benchmark(speckv.encode, x, mu, sigma)
    assert _same(speckv.decode(data, mu, sigma), x)
    record(benchmark, rates, "speckv exact encode", x.size, bits_per_scalar=len(data) * 8 / x.size)


@pytest.fixture(scope="module")
def constriction_case(synthetic):
    pytest.importorskip("constriction", reason="pip install constriction (the bench extra)")
    return constriction_coder(*ordinal_residuals_and_scales(*synthetic))


def test_constriction_encode(benchmark, constriction_case, rates):
    encode, _, symbols = constriction_case
    compressed = benchmark(encode)
    record(benchmark, rates, "constriction encode", len(symbols), bits_per_scalar=compressed.nbytes * 8 / len(symbols))


def test_constriction_decode(benchmark, constriction_case, rates):
    encode, decode, symbols = constriction_case
    compressed = encode()
    decoded = benchmark(decode, compressed)
    assert np.array_equal(decoded, symbols)
    record(benchmark, rates, "constriction decode", len(symbols), bits_per_scalar=compressed.nbytes * 8 / len(symbols))


def test_speckv_fast_lane_decode(benchmark, synthetic, rates):
    x, _, _ = synthetic
    data = speckv.encode(x, threads=1)
    y = benchmark(speckv.decode, data, threads=1)
    assert _same(y, x)
    record(benchmark, rates, "speckv fast lane decode", x.size, bits_per_scalar=len(data) * 8 / x.size)


@pytest.mark.parametrize("level", [3, 19])
def test_zstd_decode(benchmark, synthetic, rates, level):
    zstandard = pytest.importorskip("zstandard", reason="pip install zstandard (the bench extra)")
    x, _, _ = synthetic
    blob = x.view(np.uint16).tobytes()
    packed = zstandard.ZstdCompressor(level=level).compress(blob)
    back = benchmark(zstandard.ZstdDecompressor().decompress, packed)
    assert back == blob
    record(benchmark, rates, f"zstd -{level} decode", x.size, bits_per_scalar=len(packed) * 8 / x.size)


def test_zipnn_decode(benchmark, synthetic, rates):
    """ZipNN 0.5's bf16 round trip is not exact on this data (README, "The fast lane"): its
    speed and size are recorded with ``exact`` saying so."""
    zipnn = pytest.importorskip("zipnn", reason="pip install zipnn (the bench extra)")
    x, _, _ = synthetic
    blob = x.view(np.uint16).tobytes()
    z = zipnn.ZipNN(input_format="byte", bytearray_dtype="bfloat16", threads=1)
    packed = z.compress(blob)
    back = benchmark(z.decompress, packed)
    assert len(back) == len(blob)
    exact = bytes(back) == blob
    record(benchmark, rates, "zipnn decode", x.size, bits_per_scalar=len(packed) * 8 / x.size, exact=exact)
