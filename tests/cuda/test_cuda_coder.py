"""The GPU coder (``cuda/speckv_coder.cuh``) built for the host, against the Rust encoder:
every chunk coded by the kernels' very code, assembled into a stream, must equal the stream
``speckv.encode`` writes, byte for byte, for every 8- and 16-bit format, special values,
extreme sigmas and chunk sizes that reach every branch (lane tails, each length path of the
XXH3 fingerprint, escapes). Needs a C++ compiler (skipped without one); no GPU."""

from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest
import xxhash

pytest.importorskip("torch")  # speckv.hf, the CUDA module's package, imports torch
import speckv  # noqa: E402
import speckv.cuda  # noqa: E402
from speckv import _speckv  # noqa: E402

DTYPES = {
    "bfloat16": ml_dtypes.bfloat16,
    "float16": np.float16,
    "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "float8_e5m2": ml_dtypes.float8_e5m2,
}


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def _case(name: str, n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x, mu, codes) that exercise every branch of the exact model: binade edges, zero and
    subnormals, huge values and sigmas, NaN and infinite mu, values near mu and arbitrary
    patterns (the Rust tests' `exact::tests::case`, in numpy)."""
    rng = np.random.default_rng(seed)
    dtype = DTYPES[name]
    info = ml_dtypes.finfo(dtype)
    kind = rng.integers(0, 11, n)
    mu = (rng.uniform(-2, 2, n)).astype(np.float32)
    bits = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32)
    special = np.array([0.0, -0.0, 1.0, -1.0, 2.0, 0.5, 65504.0, 1e-40, -1e-45, 3.0e38], np.float32)
    nonfinite = np.array([np.nan, np.inf, -np.inf], np.float32)
    # near the format's smallest normal binade, where its subnormals begin
    edge = (rng.uniform(1, 2, n) * np.exp2(np.log2(float(info.smallest_normal)) + rng.integers(-3, 3, n))) * rng.choice(
        [-1, 1], n
    )
    powers = np.exp2(rng.integers(0, 30, n)).astype(np.float32) * rng.choice([-1, 1], n)
    mu = np.where(kind == 0, bits, mu)
    mu = np.where(kind == 1, special[rng.integers(0, special.size, n)], mu)
    mu = np.where(kind == 2, nonfinite[rng.integers(0, 3, n)], mu)
    mu = np.where(kind == 3, powers, mu)
    mu = np.where(kind == 10, edge.astype(np.float32), mu).astype(np.float32)
    codes = np.where(rng.integers(0, 4, n) == 0, rng.integers(-2000, 2000, n), rng.integers(-70, 10, n)).astype(
        np.int16
    )
    near = np.log2(np.maximum(np.abs(edge), 1e-30)) * 8 - rng.integers(8, 80, n)
    codes = np.where(kind == 10, near.astype(np.int16), codes)
    sigma = np.exp2(codes.astype(np.float64) / 8)
    with np.errstate(all="ignore"):
        target = mu.astype(np.float64) + (rng.uniform(-0.5, 0.5, n) * 6 * sigma)
        x = target.astype(np.float32).astype(dtype)
    width = np.dtype(dtype).itemsize * 8
    words = x.view(np.uint8 if width == 8 else np.uint16).copy()
    raw = rng.integers(0, 2**width, n).astype(words.dtype)
    words = np.where(rng.integers(0, 8, n) == 0, raw, words)
    return words.view(dtype), mu, codes


def _torch(x: np.ndarray):
    """A numpy tensor of an 8/16-bit format as a torch tensor of that dtype (same bits)."""
    torch = pytest.importorskip("torch")
    words = torch.from_numpy(np.ascontiguousarray(x).view(np.uint8 if x.itemsize == 1 else np.int16))
    return words.view(getattr(torch, np.dtype(x.dtype).name))


def _host_encode(x: np.ndarray, mu: np.ndarray, codes: np.ndarray, chunk: int) -> bytes:
    torch = pytest.importorskip("torch")
    return speckv.cuda.encode(_torch(x), torch.from_numpy(mu), torch.from_numpy(codes), chunk_size=chunk)


def _want(x: np.ndarray, mu: np.ndarray, codes: np.ndarray, chunk: int) -> bytes:
    """The Rust encoder's stream (of a torch tensor, as the GPU coder's input is one)."""
    return speckv.encode(_torch(x), mu, sigma_codes=codes, chunk_size=chunk)


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_host_build_writes_the_rust_encoders_bytes(host_gpu, name):
    x, mu, codes = _case(name, 20_000, seed=sorted(DTYPES).index(name))
    # 3330: whole chunks summed in blocks (speckv_fingerprint_blocks), the last one short (20)
    for chunk in (1, 2, 3, 7, 8, 9, 21, 22, 40, 41, 64, 1000, 3330, 4096, 20_000, 1 << 17):
        got = _host_encode(x, mu, codes, chunk)
        assert got == _want(x, mu, codes, chunk), f"{name}, chunks of {chunk}"
    steps = [launch[:2] for launch in host_gpu.launches[:6]]
    chunks = 20_000  # the first case's, of one scalar each
    assert steps == [
        ("speckv_exact_symbols", 20_000),
        ("speckv_escapes", chunks),
        ("speckv_code_lanes", 8 * chunks),  # eight threads a chunk
        ("speckv_payload_lengths", chunks),
        ("speckv_fingerprints", chunks),  # chunks of one scalar: no blocks to sum first
        ("speckv_join_lanes", 8 * chunks * speckv.cuda.coder.lane_capacity(1)),  # a thread a lane word
    ]
    # chunks of 3330 scalars (19,980 bytes hashed), seven of them: 19 blocks a chunk summed first
    assert ("speckv_fingerprint_blocks", 7 * 19) in [launch[:2] for launch in host_gpu.launches]
    back = speckv.decode(got, mu, sigma_codes=codes)
    torch = pytest.importorskip("torch")
    words = back.view(torch.uint8 if back.element_size() == 1 else torch.int16)
    assert np.array_equal(words.numpy().view(np.uint8), x.view(np.uint8))


def test_host_build_codes_shapes_and_broadcast_codes(host_gpu, monkeypatch):
    """A cache-shaped tensor with per-channel codes (the codec's usual case), and an empty one."""
    rng = np.random.default_rng(7)
    shape = (2, 3, 50, 64)
    mu = (rng.standard_normal(shape) * 3).astype(np.float32)
    sigma = np.exp2(rng.uniform(-6, 1, (1, 3, 1, 64))).astype(np.float32)
    x = (mu + rng.standard_normal(shape).astype(np.float32) * sigma).astype(ml_dtypes.bfloat16)
    codes = speckv.sigma_codes(sigma)
    for chunk in (4096, 3 * 50 * 64):
        assert _host_encode(x, mu, codes, chunk) == _want(x, mu, codes, chunk)
    # rounds of a few chunks each (ROUND_SCALARS), as a large cache is coded
    monkeypatch.setattr(speckv.cuda.coder, "ROUND_SCALARS", 3 * 4096 + 5)
    before = sum(name == "speckv_code_lanes" for name, _, _ in host_gpu.launches)
    assert _host_encode(x, mu, codes, 4096) == _want(x, mu, codes, 4096)
    assert sum(name == "speckv_code_lanes" for name, _, _ in host_gpu.launches) - before == 2
    empty = np.zeros((0, 4), ml_dtypes.bfloat16)
    args = (empty, np.zeros((0, 4), np.float32), np.zeros(4, np.int16), 16)
    assert _host_encode(*args) == _want(*args)


def test_host_build_codes_from_any_thread(host_gpu):
    """The driver launches into the calling thread's current context, and a worker thread has
    none: every launch binds the module's context first (the stand-in driver refuses a launch
    without it), so threads that never touched CUDA code the same bytes."""
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(8)
    mu = (rng.standard_normal(3000) * 2).astype(np.float32)
    x = (mu + 0.05 * rng.standard_normal(3000).astype(np.float32)).astype(ml_dtypes.bfloat16)
    codes = np.full(3000, -35, np.int16)
    want = _want(x, mu, codes, 1024)
    with ThreadPoolExecutor(3) as pool:
        assert list(pool.map(lambda _: _host_encode(x, mu, codes, 1024), range(3))) == [want] * 3


def test_host_build_tables_are_built_once_across_threads(host_gpu, monkeypatch):
    """The exact model's tables are built once per module and never replaced: the kernel
    argument holds bare pointers to them, so a thread's copy replacing another's would free
    tables that a kernel launched by the other thread still reads (CI saw wrong bytes from
    threads that coded at once before this held)."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor

    real, calls = speckv.cuda.exact_tables, []

    def slow(name, *pointers):  # widens the window in which a second thread would build its own
        calls.append(name)
        time.sleep(0.05)
        return real(name, *pointers)

    monkeypatch.setattr(speckv.cuda.coder, "exact_tables", slow)
    start = threading.Barrier(4)

    def build(_):
        start.wait()
        raw, sigmas, values = speckv.cuda.coder._device_tables(host_gpu, "bfloat16", "cpu")
        return raw.tobytes(), sigmas.data_ptr(), values.data_ptr()

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(build, range(4)))
    assert calls == ["bfloat16"]
    assert len(set(got)) == 1


def _joint_case(name: str, layers: int, channels: int, tokens: int, outside: int, seed: int):
    """A channel-major stream of whole layers with a joint model: lower-triangular
    coefficients with exact zeros, one layer all zero (coded plainly, J2), outside residuals,
    per-channel codes mostly, and every kind of value and prediction from `_case`."""
    rng = np.random.default_rng(seed)
    n = layers * channels * tokens
    x, mu, codes = _case(name, n, seed)
    coef = (rng.standard_normal((layers, channels, outside + channels)) * 0.3).astype(np.float32)
    coef[:, :, outside:] = np.tril(coef[:, :, outside:], -1)
    coef[rng.random(coef.shape) < 0.2] = 0.0
    offset = (rng.standard_normal((layers, channels)) * 0.01).astype(np.float32)
    coef[1], offset[1] = 0.0, 0.0  # J2
    out = (rng.standard_normal((layers, outside, tokens)) * 0.1).astype(np.float32) if outside else None
    per_channel = np.broadcast_to(rng.integers(-60, 0, (layers, channels, 1)), (layers, channels, tokens))
    codes = np.where(rng.random(n) < 0.95, per_channel.reshape(-1), codes).astype(np.int16)
    return x, mu, codes, coef, offset, out


@pytest.mark.parametrize("name", sorted(DTYPES))
@pytest.mark.parametrize("scale", [speckv.TokenScale(), speckv.TokenScale(prior=1, clamp=3), None])
def test_host_build_codes_the_joint_model_as_the_rust_encoder(host_gpu, name, scale):
    """Conditional means (J1), plain layers (J2), the token scale (J3), outside residuals and
    the lanes restarting at every channel's run: the same stream as ``speckv.encode`` with the
    same ``Joint``, and the residuals a values stream would condition on."""
    torch = pytest.importorskip("torch")
    layers, channels, tokens = 4, 12, 37
    for outside in (0, 5):
        x, mu, codes, coef, offset, out = _joint_case(name, layers, channels, tokens, outside, seed=outside)
        joint = speckv.Joint(channels, tokens, coef, offset, out, token_scale=scale)
        args = (_torch(x), torch.from_numpy(mu), torch.from_numpy(codes))
        for chunk in (channels * tokens, 2 * channels * tokens, layers * channels * tokens):
            want = speckv.encode(_torch(x), mu, sigma_codes=codes, chunk_size=chunk, joint=joint)
            got, residuals = speckv.cuda.encode_joint(*args, joint, chunk_size=chunk)
            assert got == want, f"{name} {scale} outside {outside} chunks of {chunk}"
        assert np.array_equal(residuals.numpy().reshape(-1), speckv.residuals(x, mu))
        # outside residuals given as a tensor where the data is, as the keys' stream leaves them
        on_device = torch.from_numpy(out) if outside else None
        again = speckv.Joint(channels, tokens, coef, offset, on_device, token_scale=scale)
        whole = layers * channels * tokens
        want = speckv.encode(_torch(x), mu, sigma_codes=codes, chunk_size=whole, joint=joint)
        assert speckv.cuda.encode(*args, chunk_size=whole, joint=again) == want


def test_host_build_refuses_a_joint_model_that_does_not_fit(host_gpu):
    torch = pytest.importorskip("torch")
    x, mu, codes, coef, offset, _ = _joint_case("bfloat16", 2, 4, 8, 0, seed=1)
    args = (_torch(x), torch.from_numpy(mu), torch.from_numpy(codes))
    with pytest.raises(ValueError, match="whole layers"):
        speckv.cuda.encode(*args, chunk_size=40, joint=speckv.Joint(4, 8, coef, offset))
    with pytest.raises(TypeError, match="Joint"):
        speckv.cuda.encode(*args, joint=(4, 8))
    wide = np.zeros((2, 4, 6), np.float32)
    with pytest.raises(ValueError, match="outside"):
        speckv.cuda.encode(*args, joint=speckv.Joint(4, 8, wide, offset, np.zeros(3, np.float32)))


def test_xxh3_matches_the_reference_on_every_length_and_split(cuda_host):
    """The fingerprint hash against the xxhash package: every length path (0-16, 17-128,
    129-240, long, across block boundaries) and any split point between the two parts."""
    rng = np.random.default_rng(3)
    data = rng.integers(0, 256, 5000, dtype=np.uint8)
    lengths = [*range(0, 260), 1023, 1024, 1025, 2047, 2048, 2049, 4999]
    for length in lengths:
        whole = data[:length]
        want = xxhash.xxh3_64_intdigest(whole.tobytes())
        for split in {0, length // 3, length}:
            a, b = np.ascontiguousarray(whole[:split]), np.ascontiguousarray(whole[split:])
            assert cuda_host.speckv_xxh3(_ptr(a), a.size, _ptr(b), b.size) == want, (length, split)


def test_symbols_flag_escapes_and_unpredicted_scalars(cuda_host):
    """Step 1's words: a value inside its window is an interval of the 2^24 total; a value
    far outside, or a NaN, is the escape symbol with the raw flag; a non-finite mu is the raw
    flag alone (freq 0)."""
    t = _speckv.exact_tables("bfloat16")
    tables = speckv.cuda.exact_tables("bfloat16", _ptr(t["nodes"]), _ptr(t["edges"]), _ptr(t["sigmas"]))
    x = np.array([1.0, 1000.0, np.nan, 1.0], ml_dtypes.bfloat16).view(np.uint16)
    mu = np.array([1.0, 1.0, 1.0, np.inf], np.float32)
    codes = speckv.sigma_codes(np.full(4, 0.01, np.float32))
    out = np.empty(4, np.uint64)
    kernel = cuda_host.host_speckv_exact_symbols
    kernel.argtypes = [speckv.cuda.ExactTables] + [ctypes.c_void_p] * 4 + [ctypes.c_ulonglong]
    kernel(tables, _ptr(x), _ptr(mu), _ptr(codes), _ptr(out), 4)
    raw = np.uint64(1 << 63)
    cum, freq = out & np.uint64(0xFFFFFFFF), (out >> np.uint64(32)) & np.uint64(0x7FFFFFFF)
    assert not out[0] & raw and 0 < freq[0] and cum[0] + freq[0] <= t["g_max"] + 65536
    for i in (1, 2):
        assert out[i] & raw and cum[i] + freq[i] == 1 << 24 and cum[i] > t["g_max"]
    assert out[3] == raw


def test_lane_capacity_bounds_the_worst_case(host_gpu):
    """Every scalar an escape with the costliest raw pattern the adaptive models can see: the
    words written stay within `lane_capacity` (the host build would otherwise write past its
    buffers, and the bytes would differ from Rust's)."""
    rng = np.random.default_rng(11)
    n = 4096
    for name in DTYPES:
        width = np.dtype(DTYPES[name]).itemsize * 8
        words = rng.integers(0, 2**width, n).astype(np.uint8 if width == 8 else np.uint16)
        x = words.view(DTYPES[name])
        mu = np.full(n, 3.0e38, np.float32)  # every 16-bit value escapes (fp8 windows hold all)
        codes = np.full(n, -1016, np.int16)
        stream = _host_encode(x, mu, codes, n)
        assert stream == _want(x, mu, codes, n)
        # the payload's lane lengths (LEB128, after the 120-byte header of a 1-D, 1-chunk stream)
        payload, lanes = memoryview(stream)[120:], []
        while len(lanes) < 7:
            value, shift = 0, 0
            while True:
                byte, payload = payload[0], payload[1:]
                value |= (byte & 0x7F) << shift
                shift += 7
                if byte < 0x80:
                    break
            lanes.append(value)
        lanes.append(len(payload) - sum(lanes))
        assert max(lanes) <= 4 * speckv.cuda.lane_capacity(n // 8), (name, lanes)
        assert min(lanes) > 2 * n // 8, "every scalar escaped"


# -- on a GPU (skipped without one): the kernels themselves ------------------------------------

gpu = pytest.mark.skipif("not __import__('speckv.cuda').cuda.available()", reason="no CUDA device")


@gpu
@pytest.mark.parametrize("name", sorted(DTYPES))
def test_gpu_encode_writes_the_cpu_bytes(name):
    import torch

    x, mu, codes = _case(name, 300_000, seed=20 + sorted(DTYPES).index(name))
    tx = torch.from_numpy(x.view(np.uint8 if x.itemsize == 1 else np.int16)).cuda()
    tx = tx.view(getattr(torch, name))
    for chunk in (1, 41, 4096, 1 << 17):
        want = speckv.encode(tx.cpu(), mu, sigma_codes=codes, chunk_size=chunk)
        got = speckv.cuda.encode(tx, torch.from_numpy(mu).cuda(), torch.from_numpy(codes).cuda(), chunk_size=chunk)
        assert got == want, f"{name}, chunks of {chunk}"


@gpu
def test_gpu_encode_refuses_what_it_cannot_code():
    import torch

    x = torch.zeros(8, dtype=torch.float32, device="cuda")
    with pytest.raises(TypeError, match="GPU coder"):
        speckv.cuda.encode(x, x, torch.zeros(8, dtype=torch.int16, device="cuda"))
    b = x.to(torch.bfloat16)
    with pytest.raises(ValueError, match="broadcast"):
        speckv.cuda.encode(b, x, torch.zeros(3, dtype=torch.int16, device="cuda"))
    with pytest.raises(TypeError, match="int16"):
        speckv.cuda.encode(b, x, torch.zeros(8, dtype=torch.int32, device="cuda"))


# -- the codec's GPU path, driven through the host build ---------------------------------------


@pytest.mark.parametrize("mode", ["bf16", "fp8"])
@pytest.mark.parametrize("joint", [True, False])
def test_the_codecs_gpu_path_writes_the_host_paths_bytes(host_gpu, monkeypatch, mode, joint):
    """``SpeculativeCodec`` with its GPU coder (tensors left where they are, sigma codes as
    tensors, the joint model's channel-major layers, the keys' residuals handed to the values
    stream) on CPU tensors with the kernels' host build: the container the host path writes."""
    pytest.importorskip("transformers")
    from speckv.hf import Fp8Predictor, SpeculativeCodec
    from speckv.models.cache import other_kernels
    from tiny_models import ids, tiny_model

    model = tiny_model("llama")
    codec = SpeculativeCodec(model, predictor=Fp8Predictor(model), joint=joint)
    codec.calibrate([ids(64, s) for s in range(4)])
    prompt = ids(300, 21)  # two blocks
    cache = other_kernels(model, prompt)
    prediction = codec.predictor.predict(prompt)
    # the GPU coder codes the exact model (16-bit caches default to the bins model, on the host)
    want = codec.compress_predicted(cache, prompt, prediction, mode, model="exact")
    assert host_gpu.launches == []
    monkeypatch.setattr(speckv.codec.encode_walk, "codes_on_gpu", lambda kv, pred, device: True)
    assert codec.compress_predicted(cache, prompt, prediction, mode, model="exact") == want
    # K and V of each block, a group of layers (whole chunks) at a time
    from speckv.codec.block_layout import LAYERS_PER_CHUNK

    calls = 2 * 2 * -(-model.config.num_hidden_layers // LAYERS_PER_CHUNK)
    coded = sum(name == "speckv_code_lanes" for name, _, _ in host_gpu.launches)
    assert coded == calls
    assert sum(name == "speckv_joint_params" for name, _, _ in host_gpu.launches) == (calls if joint else 0)
    assert ("joint" in speckv.info(want)["metadata"]) == joint


def test_the_gpu_benchmark_runs_on_the_host_build(host_gpu):
    """``benches/bench_cuda.py`` whole (kernel table, coder rows, bytes to the host), small,
    through the kernels' host build: a GPU run (scarce) must not be the first to execute it.
    Every coder row codes the host encoder's bytes."""
    pytest.importorskip("torch")
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benches" / "bench_cuda.py"
    spec = importlib.util.spec_from_file_location("bench_cuda", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    pytest.importorskip("transformers")
    report = bench.run(64 * 256, 2, 16, device="cpu", samples=2)
    assert report["calibration"]["host_s"] > 0
    rows = report["coder"]
    assert [r["mode"] for r in rows] == ["bf16"] * 3 + ["fp8"] * 3 + ["bf16 joint"] * 2
    assert all(r["same_bytes"] for r in rows), rows
    assert all(0 < r["host_bytes"] < 2 for r in rows)
    assert [r["kernel"].split()[0] for r in report["kernels"]] == [
        "fp8_quantize",
        "coding_mu",
        "sigma_codes",
        "channel_sums",
    ]
    assert all(r["gb_per_s"] > 0 for r in report["kernels"])


# -- properties and refusals --------------------------------------------------------------------

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@given(
    name=st.sampled_from(sorted(DTYPES)),
    n=st.integers(0, 600),
    chunk=st.integers(1, 700),
    seed=st.integers(0, 2**32 - 1),
)
@settings(suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
def test_any_tensor_codes_to_the_rust_encoders_bytes(host_gpu, name, n, chunk, seed):
    """Every bit pattern, prediction (NaN, infinities, subnormals, huge values) and sigma code
    (inside and outside the ladder), every length and chunk size: the host build of the GPU
    coder writes the stream the Rust encoder writes."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    dtype = DTYPES[name]
    width = np.dtype(dtype).itemsize * 8
    words = rng.integers(0, 2**width, n).astype(np.uint8 if width == 8 else np.uint16)
    x = words.view(dtype)
    mu = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32).view(np.float32).copy()
    near = rng.random(n) < 0.7
    with np.errstate(all="ignore"):
        mu[near] = x[near].astype(np.float32) * np.float32(1 + rng.standard_normal(int(near.sum())) * 0.01)
    codes = rng.integers(-1100, 1100, n).astype(np.int16)
    got = speckv.cuda.encode(_torch(x), torch.from_numpy(mu), torch.from_numpy(codes), chunk_size=chunk)
    assert got == _want(x, mu, codes, chunk)


def test_assemble_refuses_what_does_not_fit():
    """The host's half of the GPU path checks the layout it is handed (typed errors)."""
    payload, lengths, fingerprints = np.zeros(10, np.uint8), np.array([4, 6], np.uint32), np.zeros(2, np.uint64)
    ok = (payload, lengths, fingerprints)
    assert _speckv.assemble_predicted("bfloat16", [10], 5, ok)[:4] == b"SPKV"
    bad = [
        ("float32", [10], 5, ok, "exact model"),
        ("bfloat16", [10], 4, ok, "chunks"),
        ("bfloat16", [10], 5, (payload, np.array([4, 5], np.uint32), fingerprints), "sum"),
        ("bfloat16", [10], 5, (payload, lengths, np.zeros(3, np.uint64)), "fingerprints"),
        ("bfloat16", [10], 0, ok, "chunk size"),
    ]
    for dtype, shape, chunk, chunks, match in bad:
        with pytest.raises(speckv.SpeckvError, match=match):
            _speckv.assemble_predicted(dtype, shape, chunk, chunks)
    joint = (2, 5, 0, np.zeros(0, np.float32), np.zeros(4, np.float32), np.zeros(2, np.float32), None)
    with pytest.raises(speckv.SpeckvError, match="joint"):  # 10 scalars: one layer of 2 x 5, but 2 chunks
        _speckv.assemble_predicted("bfloat16", [10], 5, ok, joint=(joint, None))
    with pytest.raises(speckv.SpeckvError, match="joint"):  # coefficients of the wrong size
        _speckv.assemble_predicted(
            "bfloat16",
            [10],
            10,
            (np.zeros(10, np.uint8), np.array([10], np.uint32), np.zeros(1, np.uint64)),
            joint=((2, 5, 0, joint[3], np.zeros(3, np.float32), joint[5], None), None),
        )


def test_the_host_signatures_are_the_kernels_parameters(host_gpu, tmp_path, monkeypatch):
    """What the host build checks of every launch's arguments (each array as many bytes as the
    parameter, floats as floats: ``HostModule.launch``) holds for the GPU only if its
    signatures are the compiled kernels': each parameter's width, kind and a struct's size and
    alignment, read from NVRTC's PTX, equal the ctypes mirror's."""
    pytest.importorskip("cuda.bindings.nvrtc", reason="no cuda-bindings (PyTorch's CUDA wheels install it)")
    import re

    monkeypatch.setenv("SPECKV_CACHE_DIR", str(tmp_path))
    try:
        ptx = {p: speckv.cuda.compile_kernels("compute_90", program=p).decode() for p in speckv.cuda.PROGRAMS}
    except speckv.cuda.CudaUnavailableError as e:
        pytest.skip(f"NVRTC cannot run here: {e}")
    floats = {ctypes.c_float: "f32", ctypes.c_double: "f64"}
    for program, kernels in speckv.cuda.PROGRAMS.items():
        for kernel in kernels:
            params = re.search(rf"\.entry {kernel}\((.*?)\)", ptx[program], re.S).group(1)
            declared = re.findall(r"\.param\s+(?:\.align (\d+) \.b8 \w+\[(\d+)\]|\.(\w+) \w+)", params)
            mirror = host_gpu.signatures[kernel]
            assert len(declared) == len(mirror), kernel
            for i, ((align, size, kind), k) in enumerate(zip(declared, mirror)):
                where = f"{kernel} parameter {i}"
                if size:  # a struct passed by value
                    assert issubclass(k, ctypes.Structure), where
                    assert (int(size), int(align)) == (ctypes.sizeof(k), ctypes.alignment(k)), where
                elif k in floats:
                    assert kind == floats[k], where
                else:  # pointers and integers
                    assert kind in ("u32", "u64", "s32", "s64"), where
                    assert int(kind[1:]) == 8 * ctypes.sizeof(k), where
