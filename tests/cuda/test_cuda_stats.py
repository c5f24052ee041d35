"""Calibration statistics summed exactly (``rust/speckv/src/stats.rs``, invariant S1;
``cuda/speckv_stats.cuh``): the Rust sums equal exact integer arithmetic on the same terms,
the CUDA kernel's host build gives the same integers in any grouping, and calibration's
sigmas and means agree with plain float64 sums to rounding."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")  # speckv.hf, the CUDA module's package, imports torch
import speckv.cuda  # noqa: E402
from speckv import _speckv  # noqa: E402


def _cache(shape, seed):
    """A cache-like tensor (bf16 values, so exact in float32), predictions near it, special
    values (zeros, huge, tiny, infinities) mixed in."""
    g = torch.Generator().manual_seed(seed)
    t = (torch.randn(shape, generator=g) * 3).to(torch.bfloat16).float()
    p = t + 0.05 * torch.randn(shape, generator=g)
    p8 = t + 0.3 * torch.randn(shape, generator=g)
    flat = t.view(-1)
    flat[:7] = torch.tensor([0.0, -0.0, 1e30, -1e-30, float("inf"), 3e38, -2.5])
    return t, p, p8


def _limbs_to_ints(limbs: np.ndarray) -> list[list[int]]:
    out = []
    for stat in limbs.reshape(3, -1, 3).tolist():
        row = []
        for low, mid, high in stat:
            v = low | mid << 64 | high << 128
            row.append(v - (1 << 192) if v >> 191 else v)
        out.append(row)
    return out


def _exact(t, p, p8, q, scale, heads, dim):
    """S1 in plain Python: each term as numpy float64 ops in S1's order, trunc(term * 2^64)
    (exact: a power-of-two scaling; clamped to 2^160), summed as Python integers."""
    td, pd, p8d, qd = (a.double().numpy() for a in (t, p, p8, q))
    with np.errstate(all="ignore"):
        terms = [td, (td - pd) * (td - pd), (qd - p8d / scale) * (qd - p8d / scale)]
    sums = []
    for term in terms:
        channels = np.moveaxis(term, 1, 2).reshape(-1, heads * dim)  # rows (batch, token)
        row = []
        for c in range(heads * dim):
            total = 0
            for v in channels[:, c].tolist():
                if np.isfinite(v):
                    units = int(v * 2.0**64) if abs(v) < 2.0**96 else (1 << 160) * (1 if v > 0 else -1)
                    total += units
            row.append(total)
        sums.append(row)
    return sums


def test_rust_sums_are_the_exact_integer_sums():
    shape = (2, 3, 40, 8)
    t, p, p8 = _cache(shape, 1)
    scale = 0.0123
    from speckv.predictors.calibration import fp8_quantize

    q = fp8_quantize(t, scale).float()
    flat = [a.contiguous().reshape(-1).numpy() for a in (t, p, p8, q)]
    limbs = _speckv.channel_sums(*flat, scale, (3, 40, 8))
    assert _limbs_to_ints(limbs) == _exact(t, p, p8, q, scale, 3, 8)


@pytest.mark.parametrize("rows_per_item", [1, 7, 64, 10_000])
def test_the_kernels_host_build_sums_the_same_integers_in_any_grouping(host_gpu, monkeypatch, rows_per_item):
    """``speckv.cuda.channel_sums`` driven through the host build: the Rust path's limbs bit
    for bit, however the rows are grouped per thread (integers associate)."""
    monkeypatch.setattr(speckv.cuda.params, "STATS_ROWS", rows_per_item)
    shape = (3, 2, 50, 16)
    t, p, p8 = _cache(shape, 2)
    from speckv.predictors.calibration import fp8_quantize

    scale = 0.7
    q = fp8_quantize(t, scale).float()
    got = speckv.cuda.channel_sums(t, p, p8, q, scale)
    flat = [a.contiguous().reshape(-1).numpy() for a in (t, p, p8, q)]
    want = _speckv.channel_sums(*flat, scale, (2, 50, 16)).reshape(3, 32, 3)
    assert np.array_equal(got, want)
    assert [name for name, _, _ in host_gpu.launches] == ["speckv_channel_sums"]


def test_channel_sums_refuse_mismatched_arrays():
    a = np.zeros(12, np.float32)
    with pytest.raises(speckv.SpeckvError, match="channel_sums"):
        _speckv.channel_sums(a, a, a, np.zeros(11, np.float32), 1.0, (1, 3, 4))
    with pytest.raises(speckv.SpeckvError, match="channel_sums"):
        _speckv.channel_sums(a, a, a, a, 1.0, (1, 5, 4))


def test_calibration_statistics_agree_with_float64_sums():
    """The exact sums round once: sigmas and means within rounding of float64 torch sums
    (what calibration computed before), on a real calibration."""
    pytest.importorskip("transformers")
    from speckv.hf import Fp8Predictor
    from speckv.models.cache import prefill
    from speckv.predictors.calibration import calibrate, fp8_quantize
    from tiny_models import ids, tiny_model

    model = tiny_model("llama")
    predictor = Fp8Predictor(model)
    samples = [ids(64, s) for s in range(3)]
    cal = calibrate(model, predictor, samples, fingerprint="x", joint=False)
    sq = torch.zeros_like(cal.sigma, dtype=torch.float64)
    sq8, total, count = torch.zeros_like(sq), torch.zeros_like(sq), 0
    for ids_ in samples:
        true, pred = prefill(model, ids_), predictor.predict(ids_)
        count += ids_.numel()
        for layer, (pair, ppair) in enumerate(zip(true, pred)):
            for kv, (t, p) in enumerate(zip(pair, ppair)):
                s = float(cal.fp8_scales[layer, kv])
                e = t.double() - p.double()
                e8 = fp8_quantize(t, s).double() - p.double() / s
                sq[layer, kv] += (e * e).sum(dim=(0, 2))
                sq8[layer, kv] += (e8 * e8).sum(dim=(0, 2))
                total[layer, kv] += t.double().sum(dim=(0, 2))
    for got, want in ((cal.sigma, (sq / count).sqrt()), (cal.sigma_fp8, (sq8 / count).sqrt())):
        assert torch.allclose(got.double(), want, rtol=1e-6, atol=0)
    assert torch.allclose(cal.means.double(), total / count, rtol=1e-6, atol=1e-9)


# -- on a GPU (skipped without one) -------------------------------------------------------------

gpu = pytest.mark.skipif("not __import__('speckv.cuda').cuda.available()", reason="no CUDA device")


@gpu
def test_gpu_channel_sums_match_the_rust_path():
    from speckv.predictors.calibration import fp8_quantize

    shape = (2, 4, 3000, 64)
    t, p, p8 = _cache(shape, 5)
    scale = 0.02
    q = fp8_quantize(t, scale).float()
    got = speckv.cuda.channel_sums(*(a.cuda() for a in (t, p, p8, q)), scale)
    flat = [a.contiguous().reshape(-1).numpy() for a in (t, p, p8, q)]
    assert np.array_equal(got, _speckv.channel_sums(*flat, scale, (4, 3000, 64)).reshape(3, 256, 3))


@gpu
def test_a_calibration_on_the_gpu_sums_what_the_host_sums():
    """A GPU's cache and fp8 prediction (its own numbers: other kernels than the host's): the
    calibration's per-channel sums of them on the GPU equal the host's sums of the same tensors
    bit for bit, and a calibration made on the GPU end to end has the statistics of one."""
    pytest.importorskip("transformers")
    from speckv.hf import Fp8Predictor
    from speckv.models.cache import prefill
    from speckv.predictors.calibration import _channel_sums, calibrate
    from tiny_models import ids, tiny_model

    model = tiny_model("llama").cuda()
    predictor = Fp8Predictor(model, device="cuda")
    prompt = ids(64, 1).cuda()
    true, pred = prefill(model, prompt), predictor.predict(prompt)
    for (k, v), (pk, pv) in zip(true, pred):
        for t, p in ((k, pk), (v, pv)):
            assert t.is_cuda and p.is_cuda
            assert _channel_sums(t, p, p, 0.0123) == _channel_sums(t.cpu(), p.cpu(), p.cpu(), 0.0123)
    cal = calibrate(model, predictor, [ids(64, s).cuda() for s in range(3)], fingerprint="x")
    for name in ("sigma", "sigma_fp8"):
        values = getattr(cal, name)
        assert values.device.type == "cpu" and bool(torch.isfinite(values).all()) and bool((values > 0).all())
    assert cal.joint and all(value.device.type == "cpu" for m in cal.joint.values() for value in m.values())


@pytest.mark.parametrize("threads", [2, 8])
def test_the_atomic_carries_are_exact_under_contention(cuda_host, threads):
    """The kernel's item code on many host threads adding into the same sums one row at a
    time (the device's schedule, with the host's atomics): terms near the clamp, of both
    signs, carry and borrow across all three limbs, and the sums equal the sequential Rust
    path's."""
    import ctypes

    rng = np.random.default_rng(threads)
    heads, tokens, dim, batch = 2, 300, 4, 2
    n = batch * heads * tokens * dim
    # values up to 2^79: squares near the 2^160 clamp, values themselves ~2^143 units
    t = (rng.choice([-1, 1], n) * np.exp2(rng.uniform(0, 79, n))).astype(np.float32)
    p = (t * rng.uniform(-1, 1, n)).astype(np.float32)
    p8 = (t * rng.uniform(-1, 1, n)).astype(np.float32)
    q = rng.uniform(-448, 448, n).astype(np.float32)
    scale = 1e-20
    want = _speckv.channel_sums(t, p, p8, q, scale, (heads, tokens, dim))
    sums = np.zeros(3 * heads * dim * 3, np.uint64)
    kernel = cuda_host.host_speckv_channel_sums_threaded
    size, pointer = ctypes.c_ulonglong, ctypes.c_void_p
    kernel.argtypes = [pointer] * 4 + [ctypes.c_double] + [size] * 5 + [pointer, size, ctypes.c_int]
    items = heads * dim * batch * tokens  # one row an item: every item adds to shared sums
    args = [a.ctypes.data for a in (t, p, p8, q)]
    kernel(*args, scale, batch, heads, tokens, dim, 1, sums.ctypes.data, items, threads)
    assert np.array_equal(sums, want)
    limbs = want.reshape(-1, 3)
    high = limbs[:, 2]
    assert ((high != 0) & (high < np.uint64(2**63))).any() and (high >= np.uint64(2**63)).any(), "both signs"
