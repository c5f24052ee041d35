"""The CUDA module's arithmetic (``cuda/speckv_params.cuh``) built for the host, against the
Rust path and torch bit for bit: the same source the kernels compile, so a mismatch here is a
mismatch on the GPU. Needs a C++ compiler (skipped without one); no GPU."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")  # speckv.hf, the CUDA module's package, imports torch
import speckv  # noqa: E402
import speckv.cuda  # noqa: E402
from speckv import _speckv  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CUDA = ROOT / "cuda"


@pytest.fixture(scope="module")
def lib(cuda_host):
    return cuda_host


def _ptr(a: np.ndarray) -> int:
    return a.ctypes.data


def _floats(n: int, seed: int) -> np.ndarray:
    """Every kind of float32: random bit patterns (NaNs, infinities, subnormals, both zeros),
    plus values spread over the magnitudes a cache and a calibration hold."""
    rng = np.random.default_rng(seed)
    bits = rng.integers(0, 2**32, n // 2, dtype=np.uint64).astype(np.uint32).view(np.float32)
    spread = (rng.standard_normal(n - n // 2) * np.exp2(rng.uniform(-30, 30, n - n // 2))).astype(np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, 448.0, 464.0, 480.0, 1.0, 2**-6, 2**-9], np.float32)
    return np.concatenate([special, bits, spread]).astype(np.float32)


def test_sigma_codes_match_the_rust_ladder(lib):
    x = _floats(200_000, 1)
    out = np.empty(x.shape, np.int16)
    lib.speckv_sigma_codes(_ptr(x), _ptr(out), x.size)
    valid = np.isfinite(x) & (x > 0)
    assert np.all(out[~valid] == np.iinfo(np.int16).min)
    assert np.array_equal(out[valid], speckv.sigma_codes(x[valid]))


def test_relative_sigma_codes_match_the_rust_path(lib):
    rng = np.random.default_rng(2)
    heads, tokens, dim = 3, 50, 64
    mu = (rng.standard_normal((1, heads, tokens, dim)) * 4).astype(np.float32)
    s = np.exp2(rng.uniform(-6, 3, (heads, dim))).astype(np.float32)
    r = np.exp2(rng.uniform(-8, 0, (heads, dim))).astype(np.float32)
    want = _speckv.relative_sigma_codes(mu.reshape(-1), s.reshape(-1), r.reshape(-1), heads, tokens, dim)
    got = np.empty(mu.size, np.int16)
    for h in range(heads):
        rows = np.ascontiguousarray(mu[0, h])
        part = np.empty(rows.size, np.int16)
        lib.speckv_relative_sigma_codes(_ptr(rows), _ptr(s[h]), _ptr(r[h]), _ptr(part), tokens, dim)
        got[h * tokens * dim : (h + 1) * tokens * dim] = part
    assert np.array_equal(got, want)


@pytest.mark.parametrize("scale", [1.0, 0.0123, 3.7e-3, 17.5])
def test_fp8_quantisation_matches_torch(lib, scale):
    torch = pytest.importorskip("torch")
    from speckv.predictors.calibration import fp8_quantize

    x = _floats(100_000, 3)
    got = np.empty(x.shape, np.uint8)
    lib.speckv_fp8_quantize(_ptr(x), scale, _ptr(got), x.size)
    want = fp8_quantize(torch.from_numpy(x), scale).view(torch.uint8).numpy()
    # torch's NaNs keep the input's sign bit; the codec stores whatever torch wrote
    assert np.array_equal(got, want), np.flatnonzero(got != want)[:10]


def test_coding_mu_matches_the_codec(lib):
    torch = pytest.importorskip("torch")
    x = _floats(50_000, 4)
    gain = np.exp2(np.random.default_rng(5).uniform(-0.5, 0.5, x.size)).astype(np.float16).astype(np.float32)
    for fp8, scale in ((1, 0.0123), (0, 1.0)):
        got = np.empty(x.shape, np.float32)
        lib.speckv_coding_mu(_ptr(x), scale, fp8, _ptr(gain), _ptr(got), x.size)
        t = torch.from_numpy(x)
        want = ((t / scale) if fp8 else t) * torch.from_numpy(gain)  # codec.py: _mu
        assert np.array_equal(got.view(np.uint32), want.numpy().view(np.uint32))


def test_the_extension_carries_the_sources_in_cuda():
    """The wheel compiles exactly what this folder holds (``_speckv.cuda_sources``)."""
    shipped = dict(_speckv.cuda_sources())
    assert set(shipped) == {p.name for p in CUDA.glob("speckv_*.cu*")}
    for name, text in shipped.items():
        assert text == (CUDA / name).read_text()


def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    import importlib.util

    spec = importlib.util.find_spec("nvidia")
    for location in spec.submodule_search_locations if spec else []:
        for candidate in sorted(Path(location).glob("*/bin/nvcc")):
            return str(candidate)
    return None


def test_nvcc_compiles_the_kernels(tmp_path):
    """Syntax rot is caught without a GPU: nvcc (the `nvidia-cuda-nvcc` wheel in CI) builds
    the kernels for sm_90 with every warning an error."""
    nvcc = _nvcc()
    if nvcc is None:
        pytest.skip("no nvcc (pip install nvidia-cuda-nvcc): the CUDA sources are not compiled here")
    for program in speckv.cuda.PROGRAMS:
        out = tmp_path / f"{program}.o"
        cmd = [nvcc, "-arch=sm_90", "-c", str(CUDA / program), "-o", str(out), "-Werror", "all-warnings"]
        subprocess.run(cmd, check=True)
        assert out.stat().st_size > 0


def test_nvrtc_compiles_the_kernels_without_a_gpu(tmp_path, monkeypatch):
    """The just-in-time path up to the GPU: NVRTC compiles the shipped sources to PTX and to
    a cubin, caches them, and no operation is contracted into a fused multiply-add."""
    pytest.importorskip("cuda.bindings.nvrtc", reason="no cuda-bindings (PyTorch's CUDA wheels install it)")
    import speckv.cuda

    monkeypatch.setenv("SPECKV_CACHE_DIR", str(tmp_path))
    try:
        ptx = speckv.cuda.compile_kernels("compute_90")
    except speckv.cuda.CudaUnavailableError as e:
        pytest.skip(f"NVRTC cannot run here: {e}")
    for program, kernels in speckv.cuda.PROGRAMS.items():
        text = speckv.cuda.compile_kernels("compute_90", program=program).decode()
        for kernel in kernels:
            assert f".entry {kernel}(" in text
        assert "fma." not in text
        assert speckv.cuda.compile_kernels("sm_90", program=program)[:4] == b"\x7fELF"
    cached = sorted(p.name for p in (tmp_path / "cuda").iterdir())
    digest = speckv.cuda.source_digest()
    assert len(cached) == 2 * len(speckv.cuda.PROGRAMS) and all(digest in name for name in cached)
    assert speckv.cuda.compile_kernels("compute_90") == ptx  # from the cache
    with pytest.raises(ValueError, match="arch"):
        speckv.cuda.compile_kernels("90")
    with pytest.raises(ValueError, match="program"):
        speckv.cuda.compile_kernels(program="speckv_xxh3.cuh")


def test_loading_calls_the_driver_api_with_nvrtcs_cubins(tmp_path, monkeypatch):
    """``_Module``'s loading, up to the GPU, against a stand-in for ``cuda.bindings.driver``
    (no GPU): every call it makes is a function that module has, the device's primary
    context is retained and bound before anything loads, each program is an NVRTC cubin for
    the device's architecture, and each kernel is looked up by its name."""
    real = pytest.importorskip("cuda.bindings.driver", reason="no cuda-bindings (PyTorch's CUDA wheels install it)")
    import contextlib

    import cuda.bindings
    import torch

    calls: list[tuple[str, tuple]] = []
    results = {
        "cuDeviceGet": lambda device: (0, 100 + device),
        "cuDevicePrimaryCtxRetain": lambda dev: (0, 0x5BEC),
        "cuCtxGetCurrent": lambda: (0, 0),
        "cuModuleLoadData": lambda image: (0, "module"),
        "cuModuleGetFunction": lambda module, name: (0, name),
    }

    class Driver:
        def __getattr__(self, name):
            assert hasattr(real, name), f"cuda.bindings.driver has no {name}"

            def call(*args):
                calls.append((name, args))
                return results[name](*args) if name in results else (0,)

            return call

    monkeypatch.setenv("SPECKV_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cuda.bindings, "driver", Driver())
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    monkeypatch.setattr(torch.cuda, "device", lambda device: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    try:
        speckv.cuda.compile_kernels("sm_90")
    except speckv.cuda.CudaUnavailableError as e:
        pytest.skip(f"NVRTC cannot run here: {e}")
    module = speckv.cuda.module._Module(1)
    names = [name for name, _ in calls]
    assert names[:5] == ["cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxGetCurrent", "cuCtxSetCurrent"]
    assert calls[1][1] == (1,) and calls[2][1] == (101,) and calls[4][1] == (0x5BEC,)
    images = [args[0] for name, args in calls if name == "cuModuleLoadData"]
    assert images == [speckv.cuda.compile_kernels("sm_90", program=p) for p in speckv.cuda.PROGRAMS]
    assert all(image[:4] == b"\x7fELF" for image in images)
    kernels = [k for ks in speckv.cuda.PROGRAMS.values() for k in ks]
    assert module.kernels == {k: k.encode() for k in kernels}


def test_importing_the_module_needs_neither_torch_nor_cuda():
    """``speckv.cuda`` imports neither torch nor CUDA's packages until a function needs them."""
    code = (
        "import sys, speckv\n"
        "sys.modules['torch'] = None; sys.modules['cuda'] = None\n"
        "import speckv.cuda\n"
        "assert speckv.cuda.available() is False\n"
        "try:\n"
        "    speckv.cuda.compile_kernels(cache=False)\n"
        "except speckv.cuda.CudaUnavailableError as e:\n"
        "    assert 'cuda-bindings' in str(e)\n"
        "else:\n"
        "    raise AssertionError('compiled without NVRTC')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# -- on a GPU (skipped without one): the kernels against the CPU path ------------------------

gpu = pytest.mark.skipif("not __import__('speckv.cuda').cuda.available()", reason="no CUDA device")


@gpu
def test_gpu_sigma_codes_match_the_rust_ladder():
    import torch

    import speckv.cuda

    x = _floats(1_000_000, 11)
    valid = x[np.isfinite(x) & (x > 0)]
    got = speckv.cuda.sigma_codes(torch.from_numpy(valid).cuda()).cpu().numpy()
    assert np.array_equal(got, speckv.sigma_codes(valid))
    with pytest.raises(speckv.SpeckvError, match="positive"):
        speckv.cuda.sigma_codes(torch.tensor([1.0, 0.0], device="cuda"))


@gpu
def test_gpu_relative_sigma_codes_match_the_rust_path():
    import torch

    import speckv.cuda

    rng = np.random.default_rng(12)
    tokens, dim = 3000, 64
    mu = (rng.standard_normal((1, 1, tokens, dim)) * 4).astype(np.float32)
    s = np.exp2(rng.uniform(-6, 3, dim)).astype(np.float32)
    r = np.exp2(rng.uniform(-8, 0, dim)).astype(np.float32)
    want = _speckv.relative_sigma_codes(mu.reshape(-1), s, r, 1, tokens, dim)
    got = speckv.cuda.relative_sigma_codes(*(torch.from_numpy(a).cuda() for a in (mu, s, r)))
    assert np.array_equal(got.cpu().numpy().reshape(-1), want)


@gpu
@pytest.mark.parametrize("scale", [1.0, 0.0123, 17.5])
def test_gpu_fp8_quantisation_matches_the_cpu(scale):
    import torch

    import speckv.cuda
    from speckv.predictors.calibration import fp8_quantize

    x = torch.from_numpy(_floats(1_000_000, 13))
    want = fp8_quantize(x, scale).view(torch.uint8)
    got = speckv.cuda.fp8_quantize(x.cuda(), scale).view(torch.uint8).cpu()
    assert torch.equal(got, want)  # NaNs too: the kernel keeps their sign as the CPU does
    bf16 = x.to(torch.bfloat16)  # what caches hold
    assert torch.equal(
        speckv.cuda.fp8_quantize(bf16.cuda(), scale).view(torch.uint8).cpu(),
        fp8_quantize(bf16, scale).view(torch.uint8),
    )


@gpu
def test_gpu_coding_mu_matches_the_codec():
    import torch

    import speckv.cuda

    x = torch.from_numpy(_floats(1_000_000, 14))
    x = x[: 64 * 10_000].reshape(-1, 64)  # NaNs included: the kernel quiets them as a CPU does
    gain = torch.exp2(torch.rand(64) - 0.5).half().float()
    for scale in (0.0123, None):
        want = ((x / scale) if scale else x) * gain
        got = speckv.cuda.coding_mu(x.cuda(), scale, gain.cuda()).cpu()
        assert torch.equal(got.view(torch.int32), want.view(torch.int32))


# -- the codec's device choice ---------------------------------------------------------------


def test_the_codec_checks_its_device_argument():
    pytest.importorskip("transformers")
    from speckv.hf import SpeculativeCodec
    from tiny_models import tiny_model

    model = tiny_model("llama")
    with pytest.raises(ValueError, match="device"):
        SpeculativeCodec(model, device="tpu")
    if not speckv.cuda.available():
        with pytest.raises(speckv.cuda.CudaUnavailableError):
            SpeculativeCodec(model, device="cuda")
    assert SpeculativeCodec(model, device="cpu").device == "cpu"


@gpu
@pytest.mark.parametrize("mode", ["bf16", "fp8"])
@pytest.mark.parametrize("joint", [True, False])
def test_a_cache_on_the_gpu_codes_to_the_cpu_bytes(mode, joint, monkeypatch):
    """The CUDA module codes a cache and prediction on the GPU (with the joint model or
    without) into the bytes the same on the host give, which a CPU-only decoder restores."""
    from speckv.codec.block_layout import LAYERS_PER_CHUNK
    from speckv.hf import Fp8Predictor, SpeculativeCodec, extract_kv
    from speckv.models.cache import other_kernels
    from tiny_models import assert_same, ids, tiny_model

    model = tiny_model("llama")
    codec = SpeculativeCodec(model, predictor=Fp8Predictor(model), joint=joint)
    codec.calibrate([ids(64, s) for s in range(4)])
    prompt = ids(48, 21)
    cache = other_kernels(model, prompt)
    pred = codec.predictor.predict(prompt)
    # the GPU coder codes the exact model (16-bit caches default to the bins model)
    on_host = codec.compress_predicted(cache, prompt, pred, mode, model="exact")
    gpu = [(k.cuda(), v.cuda()) for k, v in cache]
    gpu_pred = [(k.cuda(), v.cuda()) for k, v in pred]
    coded = []
    encode = speckv.cuda.encode_joint
    monkeypatch.setattr(speckv.cuda, "encode_joint", lambda *a, **k: coded.append(1) or encode(*a, **k))
    for device in (None, "cuda", "cpu"):
        codec.device = device
        assert codec.compress_predicted(gpu, prompt, gpu_pred, mode, model="exact") == on_host
    # the GPU coder ran for K and V of each block, a group of layers (whole chunks) at a time,
    # with devices None and "cuda"
    groups = -(-model.config.num_hidden_layers // LAYERS_PER_CHUNK)
    calls = 2 * groups * len(codec.read_header(on_host).blocks)
    assert len(coded) == 2 * calls
    # the default model: the bins model codes a 16-bit cache on the host (the GPU coder codes
    # the exact model only), fp8 the exact model on the GPU; the host's bytes either way
    coded.clear()
    codec.device = None
    assert codec.compress_predicted(gpu, prompt, gpu_pred, mode) == codec.compress_predicted(cache, prompt, pred, mode)
    assert len(coded) == (0 if mode == "bf16" else calls)
    assert ("joint" in speckv.info(on_host)["metadata"]) == joint
    codec.device = None
    assert_same(codec, mode, cache, extract_kv(codec.decompress(on_host, prompt, dequantize=False)))


def test_a_gpu_fp8_predictor_is_rebuilt_on_the_cpu_where_there_is_no_gpu():
    pytest.importorskip("transformers")
    import torch

    from speckv.codec.from_description import predictor_from_description
    from speckv.hf import Fp8Predictor
    from tiny_models import ids, tiny_model

    model = tiny_model("llama")
    cpu = Fp8Predictor(model)
    assert "device" not in cpu.describe()  # CPU descriptions are what they were
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            Fp8Predictor(model, device="cuda")
        # a stream made on a GPU names it; here the predictor runs on the CPU instead
        again = predictor_from_description(model, {**cpu.describe(), "device": "NVIDIA H200"})
        assert again.device.type == "cpu"
        prompt = ids(20, 3)
        for (k, v), (k2, v2) in zip(cpu.predict(prompt), again.predict(prompt)):
            assert torch.equal(k, k2) and torch.equal(v, v2)


@gpu
@pytest.mark.parametrize("mode", ["bf16", "fp8"])
def test_the_fp8_predictor_on_the_gpu_restores_exactly(mode):
    import torch

    from speckv.hf import Fp8Predictor, SpeculativeCodec, extract_kv
    from speckv.models.cache import other_kernels
    from tiny_models import assert_same, ids, tiny_model

    model = tiny_model("llama")
    predictor = Fp8Predictor(model, device="cuda")
    assert predictor.describe()["device"] == torch.cuda.get_device_name()
    prompt = ids(48, 22)
    first, second = predictor.predict(prompt), predictor.predict(prompt)
    assert all(torch.equal(a, b) for p, q in zip(first, second) for a, b in zip(p, q))
    codec = SpeculativeCodec(model, predictor=predictor)
    codec.calibrate([ids(64, s) for s in range(4)])
    cache = other_kernels(model, prompt)
    data = codec.compress([(k.cuda(), v.cuda()) for k, v in cache], prompt, mode)
    assert_same(codec, mode, cache, extract_kv(codec.decompress(data, prompt, dequantize=False)))
    # a GPU prompt gets its cache back on the GPU, the same bits
    on_gpu = extract_kv(codec.decompress(data, prompt.cuda(), dequantize=False))
    assert all(t.is_cuda for pair in on_gpu for t in pair)
    assert_same(codec, mode, cache, [(k.cpu(), v.cpu()) for k, v in on_gpu])
