"""Round trips are bit-exact for every dtype, bit pattern, shape, prediction and thread count."""

from __future__ import annotations

import dataclasses
import functools

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import speckv
from helpers import DTYPES, as_dtype, bit_arrays, chunk_sizes, same_bits, shapes, thread_counts

NAMES = list(DTYPES)


@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
def test_predictor_free_round_trip(name, data):
    word = DTYPES[name][1]
    x = as_dtype(data.draw(bit_arrays(word)), name)
    chunk = data.draw(chunk_sizes)
    stream = speckv.encode(x, threads=data.draw(thread_counts), chunk_size=chunk)
    assert stream == speckv.encode(x, threads=1, chunk_size=chunk)  # bytes never depend on threads
    assert same_bits(speckv.decode(stream, threads=data.draw(thread_counts)), x)
    assert speckv.info(stream)["shape"] == list(x.shape)


@pytest.mark.parametrize("model", ["exact", "fast", "bins"])
@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
def test_predicted_round_trip_any_patterns(name, model, data):
    """x and mu are arbitrary (often far apart, NaN, inf): escapes must carry everything."""
    word = DTYPES[name][1]
    x_words = data.draw(bit_arrays(word))
    x = as_dtype(x_words, name)
    mu = as_dtype(data.draw(bit_arrays(word, shape=x.shape)), name)
    sigma = data.draw(st.sampled_from([1e-30, 1e-6, 0.01, 1.0, 1e4, 1e30]))
    chunk = data.draw(chunk_sizes)
    stream = speckv.encode(x, mu, sigma, threads=data.draw(thread_counts), model=model, chunk_size=chunk)
    assert stream == speckv.encode(x, mu, sigma, threads=1, model=model, chunk_size=chunk)
    assert same_bits(speckv.decode(stream, mu, sigma, threads=data.draw(thread_counts)), x)


@pytest.mark.parametrize("model", ["exact", "fast", "bins"])
@pytest.mark.parametrize("name", NAMES)
@given(data=st.data())
def test_predicted_round_trip_near_prediction(name, model, data):
    """The common case: x close to mu, float32 mu, per-channel sigma spanning decades."""
    shape = data.draw(shapes.filter(lambda s: len(s) >= 1))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    channels = shape[-1]
    sigma = np.exp(rng.uniform(-12, 3, channels)).astype(np.float32)
    mu = rng.standard_normal(shape).astype(np.float32) * data.draw(st.sampled_from([1e-3, 1.0, 300.0]))
    noise = rng.standard_normal(shape).astype(np.float32) * sigma
    x = (mu + noise).astype(DTYPES[name][0])
    chunk = data.draw(chunk_sizes)
    stream = speckv.encode(x, mu, sigma, threads=data.draw(thread_counts), model=model, chunk_size=chunk)
    assert stream == speckv.encode(x, mu, sigma, threads=1, model=model, chunk_size=chunk)
    assert same_bits(speckv.decode(stream, mu, sigma, threads=data.draw(thread_counts)), x)
    assert speckv.info(stream)["model"] == ("fast" if name == "float32" else model)


@given(data=st.data())
def test_mu_with_nan_and_inf(data):
    shape = data.draw(shapes)
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(ml_dtypes.bfloat16)
    mu = rng.standard_normal(shape).astype(np.float32)
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 3e38], dtype=np.float32)
    mask = rng.random(shape) < 0.3
    mu[mask] = rng.choice(specials, size=int(mask.sum()))
    stream = speckv.encode(x, mu, 0.1)
    assert same_bits(speckv.decode(stream, mu, 0.1), x)


@pytest.mark.parametrize("name", NAMES)
def test_bytes_do_not_depend_on_thread_count(name):
    rng = np.random.default_rng(1)
    mu = rng.standard_normal((40, 3, 1000)).astype(np.float32)
    sigma = np.linspace(0.01, 0.5, 1000, dtype=np.float32)
    x = (mu + rng.standard_normal(mu.shape).astype(np.float32) * sigma).astype(DTYPES[name][0])
    for pred in ((), (mu, sigma)):
        streams = {t: speckv.encode(x, *pred, threads=t, chunk_size=10_000) for t in (1, 2, 3, 8)}
        assert len(set(streams.values())) == 1
        assert speckv.info(streams[1])["chunks"] == 12
        for t in (1, 4):
            assert same_bits(speckv.decode(streams[1], *pred, threads=t), x)


def test_every_pattern_of_the_small_formats():
    for name in ("float8_e4m3fn", "float8_e5m2"):
        x = np.arange(256, dtype=np.uint8).view(DTYPES[name][0])
        mu = np.zeros(256, dtype=np.float32)
        for pred in ((), (mu, 0.5)):
            assert same_bits(speckv.decode(speckv.encode(x, *pred), *pred), x)
    for name in ("bfloat16", "float16"):
        x = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(DTYPES[name][0]).reshape(256, 256)
        mu = np.ones((256, 256), dtype=np.float32)
        for pred in ((), (mu, np.full(256, 0.3, np.float32))):
            assert same_bits(speckv.decode(speckv.encode(x, *pred), *pred), x)


def test_non_contiguous_inputs():
    rng = np.random.default_rng(2)
    base = rng.standard_normal((20, 64)).astype(ml_dtypes.bfloat16)
    x = base[::2, ::3]
    assert not x.flags.c_contiguous
    mu_base = rng.standard_normal((64, 20)).astype(np.float32)
    mu = mu_base.T[::2, ::3]
    sigma = np.full((1, x.shape[1]), 0.2, np.float32)
    assert same_bits(speckv.decode(speckv.encode(x, mu, sigma), mu, sigma), np.ascontiguousarray(x))
    assert same_bits(speckv.decode(speckv.encode(x)), np.ascontiguousarray(x))


def test_sigma_broadcast_layouts_agree():
    """Equal effective sigmas give equal streams, whatever layout they were given in."""
    rng = np.random.default_rng(3)
    mu = rng.standard_normal((2, 4, 30, 16)).astype(np.float32)
    x = (mu + 0.05 * rng.standard_normal(mu.shape)).astype(ml_dtypes.bfloat16)
    per_channel = np.full(16, 0.05, np.float32)
    full = np.broadcast_to(per_channel, mu.shape).copy()
    a = speckv.encode(x, mu, per_channel)
    assert a == speckv.encode(x, mu, full) == speckv.encode(x, mu, 0.05)
    assert same_bits(speckv.decode(a, mu, full), x)


@pytest.mark.parametrize("model", ["exact", "fast"])
def test_ideal_bits_matches_coded_size(model):
    rng = np.random.default_rng(4)
    mu = rng.standard_normal((512, 256)).astype(np.float32)
    sigma = np.logspace(-3, -1, 256).astype(np.float32)
    x = (mu + rng.standard_normal(mu.shape).astype(np.float32) * sigma).astype(ml_dtypes.bfloat16)
    stream = speckv.encode(x, mu, sigma, model=model)
    ideal = speckv.ideal_bits(x, mu, sigma, model=model)
    payload_bits = speckv.info(stream)["payload_bytes"] * 8
    assert ideal < payload_bits < ideal * 1.003
    assert speckv.ideal_bits(x) > ideal * 1.3  # the prediction is worth a lot here


def test_exact_model_beats_fast_when_sigma_spans_binades():
    rng = np.random.default_rng(5)
    mu = rng.standard_normal((256, 128)).astype(np.float32) * 0.05
    sigma = np.full(128, 0.05, np.float32)  # as wide as the values themselves
    x = (mu + rng.standard_normal(mu.shape).astype(np.float32) * sigma).astype(ml_dtypes.bfloat16)
    assert speckv.ideal_bits(x, mu, sigma) < 0.97 * speckv.ideal_bits(x, mu, sigma, model="fast")


def test_torch_in_torch_out():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float32):
        mu = torch.randn(3, 17, 8, generator=g)
        x = (mu + 0.01 * torch.randn(3, 17, 8, generator=g)).to(dtype)
        stream = speckv.encode(x, mu, torch.full((8,), 0.01))
        y = speckv.decode(stream, mu, torch.full((8,), 0.01))
        assert isinstance(y, torch.Tensor) and y.dtype == dtype and y.shape == x.shape
        bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[x.element_size()]
        assert torch.equal(y.view(bits), x.view(bits))
        z = speckv.decode(speckv.encode(x))
        assert isinstance(z, torch.Tensor) and torch.equal(z.view(bits), x.view(bits))


def test_decoding_a_run_of_chunks():
    rng = np.random.default_rng(6)
    mu = rng.standard_normal((10, 4, 250)).astype(np.float32)
    sigma = np.full(250, 0.05, np.float32)
    x = (mu + 0.05 * rng.standard_normal(mu.shape)).astype(ml_dtypes.bfloat16)
    stream = speckv.encode(x, mu, sigma, chunk_size=1000)
    flat = x.reshape(-1)
    for start, stop in [(0, 1), (3, 7), (9, 10), (5, 5)]:
        part = speckv.decode(stream, mu, sigma, chunks=(start, stop))
        assert same_bits(part, np.ascontiguousarray(flat[start * 1000 : stop * 1000]))
    layer = speckv.decode(stream, mu, sigma, chunks=range(2, 3))
    assert same_bits(layer.reshape(4, 250), x[2])
    with pytest.raises(ValueError, match="chunks"):
        speckv.decode(stream, mu, sigma, chunks=(3, 11))


def _hard_predictions(draw, name, shape):
    """mu where the exact model's tables are hardest to get right: binade edges (powers of
    two and their neighbours), zero and the subnormals, the largest values, NaN and infinities,
    plus sigma from far below the format's spacing to far above the values."""
    dtype = DTYPES[name][0]
    finfo = ml_dtypes.finfo(dtype)
    tiny = float(finfo.smallest_normal)
    edges = [2.0**e for e in range(int(np.log2(tiny)) - 3, 6)]
    pool = np.array(
        edges
        + [np.nextafter(np.float32(e), np.float32(0)) for e in edges]
        + [np.nextafter(np.float32(e), np.float32(np.inf)) for e in edges]
        + [0.0, -0.0, tiny / 2, tiny * 0.75, float(finfo.max), np.nan, np.inf, -np.inf],
        dtype=np.float32,
    )
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    signs = np.where(rng.random(shape) < 0.5, -1, 1).astype(np.float32)
    with np.errstate(invalid="ignore"):
        mu = (rng.choice(pool, size=shape) * signs).astype(np.float32)
    scale = draw(st.sampled_from([1e-40, 1e-8, tiny, 1e-3, 0.3, 10.0, 1e30]))
    sigma = (scale * np.exp(rng.uniform(-2, 2, shape[-1:] or (1,)))).astype(np.float32)
    noise = rng.standard_normal(shape).astype(np.float32) * sigma
    with np.errstate(over="ignore", invalid="ignore"):
        x = (np.nan_to_num(mu, nan=0.0, posinf=1.0, neginf=-1.0) + noise).astype(dtype)
    return x, mu, sigma


@pytest.mark.parametrize("name", ["bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"])
@given(data=st.data())
def test_exact_model_at_binade_edges_zero_and_extremes(name, data):
    shape = data.draw(shapes.filter(lambda s: len(s) >= 1 and 0 < int(np.prod(s)) <= 2000))
    x, mu, sigma = _hard_predictions(data.draw, name, shape)
    stream = speckv.encode(x, mu, sigma, threads=2)
    assert same_bits(speckv.decode(stream, mu, sigma, threads=1), x)


def test_sigma_codes_are_the_integer_parameters():
    rng = np.random.default_rng(8)
    mu = rng.standard_normal((50, 64)).astype(np.float32)
    sigma = np.logspace(-3, 0, 64).astype(np.float32)
    x = (mu + rng.standard_normal(mu.shape).astype(np.float32) * sigma).astype(ml_dtypes.bfloat16)
    codes = speckv.sigma_codes(sigma)
    assert codes.dtype == np.int16 and codes.shape == sigma.shape
    assert codes.tolist() == [round(8 * np.log2(float(s))) for s in sigma]
    stream = speckv.encode(x, mu, sigma)
    assert speckv.encode(x, mu, sigma_codes=codes) == stream
    assert same_bits(speckv.decode(stream, mu, sigma_codes=codes), x)
    assert speckv.ideal_bits(x, mu, sigma_codes=codes) == speckv.ideal_bits(x, mu, sigma)
    with pytest.raises(TypeError, match="sigma_codes"):
        speckv.encode(x, mu, sigma_codes=codes.astype(np.int32))
    with pytest.raises(ValueError, match="not both"):
        speckv.encode(x, mu, sigma, sigma_codes=codes)
    with pytest.raises(ValueError, match="broadcast"):
        speckv.encode(x, mu, sigma_codes=codes[:10])


_CROSS_SCRIPT = """
import sys, numpy as np, ml_dtypes, speckv
dtype = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
         "float8_e5m2": ml_dtypes.float8_e5m2}[sys.argv[2]]
word = np.uint8 if np.dtype(dtype).itemsize == 1 else np.uint16
rng = np.random.default_rng(9)
mu = rng.standard_normal((300, 96)).astype(np.float32) * np.logspace(-3, 1, 96).astype(np.float32)
sigma = np.logspace(-4, 0, 96).astype(np.float32)
x = (mu + rng.standard_normal(mu.shape).astype(np.float32) * sigma * 3).astype(dtype)
x.reshape(-1)[::97] = np.nan
mu.reshape(-1)[::89] = np.inf
if sys.argv[1] == "kernel":
    print(speckv.kernels())
elif sys.argv[1] == "encode":
    sys.stdout.buffer.write(speckv.encode(x, mu, sigma, chunk_size=7000))
else:
    back = speckv.decode(sys.stdin.buffer.read(), mu, sigma)
    assert (back.view(word) == x.view(word)).all()
"""


def _run_cross(simd: str, mode: str, dtype: str, stream: bytes = b"") -> bytes:
    import os
    import subprocess
    import sys

    env = dict(os.environ, SPECKV_SIMD=simd)
    args = [sys.executable, "-c", _CROSS_SCRIPT, mode, dtype]
    done = subprocess.run(args, input=stream, env=env, capture_output=True, check=False)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout


@functools.cache
def _kernel_under(simd: str) -> str:
    """The kernels a process picks under ``SPECKV_SIMD=simd`` (``speckv.kernels()``)."""
    return _run_cross(simd, "kernel", "bfloat16").decode().strip()


@pytest.mark.parametrize("wide", ["avx512", "avx2"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"])
def test_vector_and_portable_kernels_write_and_read_the_same_bytes(dtype, wide):
    """The AVX-512 kernels (what this processor picks by itself, where it has them) and the
    AVX2 kernels (SPECKV_SIMD=avx2), each against the portable code (SPECKV_SIMD=0): identical
    streams, and each decodes the other's. A processor without the wide kernel skips (never
    compares the portable code with itself under another name)."""
    simd = "1" if wide == "avx512" else "avx2"
    picked = _kernel_under(simd)
    if picked != wide:
        pytest.skip(f"no {'AVX-512' if wide == 'avx512' else 'AVX2'} on this processor (it picks {picked})")
    streams = {s: _run_cross(s, "encode", dtype) for s in (simd, "0")}
    assert len(streams["0"]) > 500 and streams[simd] == streams["0"]
    for writer, reader in ((simd, "0"), ("0", simd)):
        _run_cross(reader, "decode", dtype, streams[writer])


@settings(max_examples=40, deadline=None)
@given(
    layers=st.integers(1, 3),
    channels=st.integers(1, 6),
    tokens=st.integers(1, 70),
    outside=st.integers(0, 3),
    seed=st.integers(0, 2**32 - 1),
    dtype=st.sampled_from(["bfloat16", "float16", "float8_e4m3fn"]),
    token_scale=st.one_of(st.none(), st.builds(speckv.TokenScale, st.integers(1, 255), st.integers(1, 255))),
    integer=st.booleans(),
)
def test_joint_streams_round_trip_exactly(layers, channels, tokens, outside, seed, dtype, token_scale, integer):
    """The joint residual model on arbitrary coefficients (zeros included), outside channels,
    sigmas, token scales and bit patterns, in its float or its integer form: exact on every
    thread count, refused with other coefficients; the decoder takes the token scale and the
    form from the stream (an integer-form stream needs the integer arrays)."""
    rng = np.random.default_rng(seed)
    x = rng.integers(0, 1 << (8 * np.dtype(DTYPES[dtype][1]).itemsize), (layers, channels, tokens)).astype(
        DTYPES[dtype][1]
    )
    x = as_dtype(x, dtype)
    mu = rng.standard_normal(x.shape).astype(np.float32)
    coef = rng.standard_normal((layers, channels, outside + channels)).astype(np.float32)
    coef[rng.random(coef.shape) < 0.3] = 0.0
    joint = speckv.Joint(
        channels,
        tokens,
        coef,
        rng.standard_normal((layers, channels)).astype(np.float32),
        rng.standard_normal((layers, outside, tokens)).astype(np.float32) if outside else None,
        token_scale,
    )
    if integer:
        # residual sigmas of every kind the calibration may hold, zeros included
        source_sigma = np.exp2(rng.uniform(-12, 6, (layers, outside + channels))).astype(np.float32)
        source_sigma[rng.random(source_sigma.shape) < 0.1] = 0.0
        joint = dataclasses.replace(joint, integer=speckv.joint_integer(channels, coef, source_sigma))
    sigma = np.exp2(rng.uniform(-8, 4, (channels, 1))).astype(np.float32)
    data = speckv.encode(x, mu, sigma, chunk_size=channels * tokens, joint=joint)
    assert speckv.encode(x, mu, sigma, chunk_size=channels * tokens, joint=joint, threads=1) == data
    facts = speckv.info(data)
    assert facts["joint"] and facts["token_scale"] == (None if token_scale is None else token_scale.args())
    assert facts["joint_integer"] == integer
    bare = dataclasses.replace(joint, token_scale=None)
    for threads in (1, 3):
        assert same_bits(speckv.decode(data, mu, sigma, joint=bare, threads=threads), x)
    other = dataclasses.replace(joint, coef=coef + 1.0)
    if integer:
        a = joint.integer[1].copy()
        a[0] = 1 if a[0] != 1 else 2
        other = dataclasses.replace(joint, integer=(joint.integer[0], a, joint.integer[2]))
        with pytest.raises(speckv.PredictionMismatchError, match="integer form"):
            speckv.decode(data, mu, sigma, joint=dataclasses.replace(joint, integer=None))
    with pytest.raises(speckv.PredictionMismatchError):
        speckv.decode(data, mu, sigma, joint=other)


def test_the_integer_form_is_checked():
    """A joint model's integer form of the wrong types or sizes: a typed error, never a
    conversion or a panic."""
    x = np.zeros((1, 2, 8), np.float16)
    mu, sigma = np.zeros_like(x, np.float32), np.ones((2, 1), np.float32)
    coef = np.zeros((1, 2, 2), np.float32)
    good = speckv.joint_integer(2, coef, np.ones((1, 2), np.float32))
    assert [a.dtype for a in good] == [np.float32, np.int16, np.float32]
    bad = [
        ((good[0], good[1].astype(np.int32), good[2]), TypeError, "coefficients"),
        ((good[0], good[1]), TypeError, "expected"),
        ((good[0][:1], good[1], good[2]), speckv.SpeckvError, "residual scales"),
        ((good[0], good[1][1:], good[2]), speckv.SpeckvError, "integer coefficients"),
    ]
    for integer, error, match in bad:
        joint = speckv.Joint(2, 8, coef, np.zeros((1, 2), np.float32), integer=integer)
        with pytest.raises(error, match=match):
            speckv.encode(x, mu, sigma, chunk_size=16, joint=joint)
    with pytest.raises(speckv.SpeckvError, match="whole layers"):
        speckv.joint_integer(2, coef, np.ones(3, np.float32))


def test_token_scale_knobs_are_checked():
    x = np.zeros((1, 2, 8), np.float16)
    for bad in (speckv.TokenScale(prior=0), speckv.TokenScale(clamp=256), speckv.TokenScale(prior=True)):
        joint = speckv.Joint(2, 8, np.zeros((1, 2, 2), np.float32), np.ones((1, 2), np.float32), token_scale=bad)
        with pytest.raises(ValueError, match="token scale"):
            speckv.encode(x, np.zeros_like(x, np.float32), np.ones((2, 1), np.float32), chunk_size=16, joint=joint)
    joint = speckv.Joint(2, 8, np.zeros((1, 2, 2), np.float32), np.ones((1, 2), np.float32), token_scale=(4, 25))
    with pytest.raises(TypeError, match="TokenScale"):
        speckv.encode(x, np.zeros_like(x, np.float32), np.ones((2, 1), np.float32), chunk_size=16, joint=joint)


def test_a_forked_child_codes_with_its_own_threads():
    """The core keeps its thread pools between calls (``rust/speckv/src/parallel.rs``): a child
    forked after the parent used them builds its own and codes the same bytes."""
    import multiprocessing

    x = np.random.default_rng(5).standard_normal((64, 4096)).astype(np.float32).astype(ml_dtypes.bfloat16)
    want = speckv.encode(x, threads=2, chunk_size=4096)
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        got = pool.apply(_encode_in_child, (x,))
    assert got == want
    assert same_bits(speckv.decode(got, threads=2), x)


def _encode_in_child(x: np.ndarray) -> bytes:
    return speckv.encode(x, threads=2, chunk_size=4096)


@given(data=st.data())
@settings(max_examples=40)
def test_many_streams_decode_in_one_call_as_each_alone(data):
    """``decode_many``: several predicted streams of other dtypes, shapes and models, each
    against its own prediction, on any number of threads, give what ``decode`` gives each."""
    from speckv import _api

    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    items, want = [], []
    for _ in range(data.draw(st.integers(0, 5))):
        name = data.draw(st.sampled_from(["bfloat16", "float16", "float8_e4m3fn"]))
        shape = data.draw(shapes.filter(lambda s: len(s) >= 1))
        mu = rng.standard_normal(shape).astype(np.float32)
        codes = speckv._speckv.sigma_codes(np.exp(rng.uniform(-8, 1, shape[-1])).astype(np.float32))
        x = (mu + rng.standard_normal(shape).astype(np.float32)).astype(DTYPES[name][0])
        model = data.draw(st.sampled_from(["exact", "bins"]))
        stream = speckv.encode(x, mu, sigma_codes=codes, model=model, chunk_size=data.draw(chunk_sizes))
        items.append((stream, mu, codes, None))
        want.append(x)
    got = _api.decode_many(items, threads=data.draw(thread_counts))
    assert len(got) == len(want)
    for g, x in zip(got, want):
        assert g.shape == x.shape and same_bits(g, x)


def test_decode_many_raises_the_failing_streams_typed_error():
    from speckv import _api

    rng = np.random.default_rng(3)
    mu = rng.standard_normal((4, 64)).astype(np.float32)
    codes = speckv._speckv.sigma_codes(np.full(64, 0.5, dtype=np.float32))
    x = (mu + rng.standard_normal((4, 64)).astype(np.float32)).astype(ml_dtypes.bfloat16)
    stream = speckv.encode(x, mu, sigma_codes=codes, model="bins")
    good = (stream, mu, codes, None)
    assert _api.decode_many([]) == []
    with pytest.raises(speckv.PredictionMismatchError):
        _api.decode_many([good, (stream, mu + 1, codes, None)], threads=2)
    with pytest.raises(speckv.PredictionMismatchError):
        _api.decode_many([(stream, mu[:2], codes, None)])  # another shape
    damaged = bytearray(stream)
    damaged[-3] ^= 0x10
    with pytest.raises(speckv.CorruptStreamError):
        _api.decode_many([good, (bytes(damaged), mu, codes, None)], threads=2)
    with pytest.raises(ValueError):
        _api.decode_many([(speckv.encode(x), mu, codes, None)])  # not predicted
