"""The joint residual model end to end: its calibration (JointFit), exact round trips with
it on both kinds of predictor, containers that say whether they use it, and its coefficients
kept by save/load."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import speckv  # noqa: E402
from helpers import record_calls  # noqa: E402
from speckv.hf import Calibration, ModelPrefixPredictor, SpeculativeCodec, extract_kv  # noqa: E402
from speckv.models.cache import other_kernels  # noqa: E402
from speckv.predictors.joint_fit import JointFit  # noqa: E402
from tiny_models import WORDS, assert_same, calibrated, ids, tiny_model  # noqa: E402,F401  # noqa: E402


def test_joint_fit_recovers_a_conditional_structure():
    g = torch.Generator().manual_seed(0)
    fit = JointFit(1, 1, 2)  # one layer, one head, dim 2: channels K0 K1 V0 V1
    for _ in range(20):
        base = torch.randn(1, 1, 500, 1, generator=g, dtype=torch.float64)
        k = torch.cat([base, 2 * base + 0.01 * torch.randn(1, 1, 500, 1, generator=g)], dim=3)
        v = torch.cat([-base + 0.3, 0.1 * torch.randn(1, 1, 500, 1, generator=g)], dim=3)
        fit.add(0, k, v, torch.zeros_like(k), torch.zeros_like(v))
    out = fit.solve([0], shrinkage=0.0)
    coef, offset, sigma = out["coef"][0], out["offset"][0], out["sigma"][0].reshape(-1)
    assert torch.allclose(coef[1, 0], torch.tensor(2.0), atol=0.01)  # K1 from K0
    # V0 from K0 and K1 (= 2 K0): any split with the same prediction
    assert abs(float(coef[2, 0] + 2 * coef[2, 1]) + 1.0) < 0.05 and abs(float(offset[2]) - 0.3) < 0.05
    # conditional sigmas far below the marginal ones (2 and 1; the floor of shrinkage 2C/n
    # keeps them above the noise's 0.01), the independent channel's its own
    assert float(sigma[1]) < 0.1 and float(sigma[2]) < 0.1 and abs(float(sigma[3]) - 0.1) < 0.01
    assert torch.equal(torch.triu(coef), torch.zeros_like(coef))


@pytest.fixture(scope="module")
def layerwise():
    model = tiny_model("llama", seed=1)
    codec = SpeculativeCodec(model, predictor=ModelPrefixPredictor(model, layers=1), joint=True)
    codec.calibrate([ids(64, s) for s in range(8)])
    return model, codec


@pytest.mark.parametrize("mode", ["bf16", "fp8"])
def test_layerwise_joint_round_trips_on_every_path(layerwise, mode):
    model, codec = layerwise
    prompt = ids(40, 11)
    cache = other_kernels(model, prompt)
    data = codec.compress(cache, prompt, mode, block_size=16)
    facts = speckv.info(data)
    assert facts["metadata"]["joint"] is True and facts["streams"][0]["shape"][-1] == 16
    for pipeline in (False, True):
        back = extract_kv(codec.decompress(data, prompt, dequantize=False, pipeline=pipeline))
        assert_same(codec, mode, cache, back)
    k, v = codec.decompress_layer(data, prompt, 2)
    assert torch.equal(v.view(WORDS[mode]), back[2][1].view(WORDS[mode]))
    # a codec set not to code jointly still reads a joint container, and makes plain ones
    codec.joint = False
    try:
        assert_same(codec, mode, cache, extract_kv(codec.decompress(data, prompt, dequantize=False)))
        plain = codec.compress(cache, prompt, mode, block_size=16)
        assert "joint" not in speckv.info(plain)["metadata"] and plain != data
        assert_same(codec, mode, cache, extract_kv(codec.decompress(plain, prompt, dequantize=False)))
    finally:
        codec.joint = True


def test_the_bins_model_codes_the_joint_sums_in_integers_and_either_form_decodes(calibrated):  # noqa: F811
    """bfloat16 caches (the bins model, what ``compress`` picks) code the joint model's sums
    in its integer form; the exact model (the GPU coder's) keeps the float form; one codec
    reads both, each stream saying which."""
    model, codec = calibrated
    prompt = ids(40, 17)
    cache = other_kernels(model, prompt)
    forms = {}
    for coder in ("bins", "exact"):
        data = codec.compress(cache, prompt, "bf16", model=coder)
        streams = speckv.info(data)["streams"]
        forms[coder] = {(s["model"], s["joint"], s["joint_integer"]) for s in streams}
        assert_same(codec, "bf16", cache, extract_kv(codec.decompress(data, prompt, dequantize=False)))
    assert forms == {"bins": {("bins", True, True)}, "exact": {("exact", True, False)}}


def test_whole_prompt_predictors_code_jointly_by_default(calibrated):  # noqa: F811
    model, codec = calibrated
    prompt = ids(24, 12)
    cache = other_kernels(model, prompt)
    data = codec.compress(cache, prompt, "fp8")
    facts = speckv.info(data)
    assert facts["metadata"].get("joint") is True
    assert {(s["joint"], s["token_scale"]) for s in facts["streams"]} == {(True, speckv.TokenScale().args())}
    k, v = codec.decompress_layer(data, prompt, 1)
    whole = extract_kv(codec.decompress(data, prompt, dequantize=False))
    assert torch.equal(v.view(torch.uint8), whole[1][1].view(torch.uint8))
    # without the token scale: other bytes, which the same codec decodes (the streams say how)
    unscaled = SpeculativeCodec(
        model, codec.calibration, codec.predictor, fingerprint=codec.fingerprint, token_scale=None
    )
    plain = unscaled.compress(cache, prompt, "fp8")
    assert plain != data and all(s["token_scale"] is None for s in speckv.info(plain)["streams"])
    assert_same(codec, "fp8", cache, extract_kv(codec.decompress(plain, prompt, dequantize=False)))
    # a damaged coefficient is another calibration: refused before decoding
    cal = codec.calibration
    other = Calibration(
        cal.sigma,
        cal.sigma_fp8,
        cal.fp8_scales,
        cal.means,
        cal.metadata,
        cal.predictor_state,
        None,
        None,
        {m: {k: t.clone() for k, t in parts.items()} for m, parts in cal.joint.items()},
    )
    other.joint["fp8"]["coef"][1, 5, 0] += 0.25
    with pytest.raises(speckv.PredictionMismatchError):
        SpeculativeCodec(model, other, codec.predictor, fingerprint=codec.fingerprint).decompress(data, prompt)


@pytest.mark.parametrize("joint", [True, False])
def test_a_whole_prompt_restore_split_into_token_walks_is_one_walks_bit_for_bit(calibrated, monkeypatch, joint):  # noqa: F811
    """``token_walks.split_whole``: a whole-prompt predictor's container decoded as walks
    over groups of token blocks side by side (a jointly coded V reading its own block's K
    residuals) gives the one walk's words, for any number of threads; one thread, one block
    or a few layers asked for do not split."""
    from speckv.codec import decode_walk

    model, codec = calibrated
    coder = SpeculativeCodec(model, codec.calibration, codec.predictor, fingerprint=codec.fingerprint, joint=joint)
    prompt = ids(40, 8)
    cache = other_kernels(model, prompt)
    splits = record_calls(
        monkeypatch, decode_walk, "split_whole", lambda plan, c, prediction, n, got: (len(c.blocks), n, got is not None)
    )
    for mode in ("bf16", "fp8"):
        data = coder.compress(cache, prompt, mode, block_size=16)  # blocks of 16, 16 and 8
        assert speckv.info(data)["metadata"].get("joint", False) is joint
        splits.clear()
        walks = [extract_kv(coder.decompress(data, prompt, dequantize=False, threads=t)) for t in (1, 2, 3)]
        assert splits == [(3, 1, False), (3, 2, True), (3, 3, True)]
        for got in walks:
            assert_same(coder, mode, cache, got)
        splits.clear()
        k, v = coder.decompress_layer(data, prompt, 1, threads=2)
        assert splits == [] and torch.equal(v.view(WORDS[mode]), walks[0][1][1].view(WORDS[mode]))
        one = coder.compress(cache, prompt, mode)  # one block of 40
        splits.clear()
        assert_same(coder, mode, cache, extract_kv(coder.decompress(one, prompt, dequantize=False, threads=2)))
        assert splits == [(1, 2, False)]


def test_save_and_load_keep_the_joint_model(calibrated, tmp_path):  # noqa: F811
    model, codec = calibrated
    path = tmp_path / "cal.safetensors"
    codec.save(str(path))
    again = Calibration.load(str(path))
    assert again.digest() == codec.calibration.digest()
    assert set(again.joint) == {"bf16", "fp8"}
    for mode in again.joint:
        for name, t in again.joint[mode].items():
            assert np.array_equal(t.numpy(), codec.calibration.joint[mode][name].numpy())


def test_joint_fit_structures_condition_on_less():
    g = torch.Generator().manual_seed(1)
    fit = JointFit(1, 1, 2)
    for _ in range(10):
        base = torch.randn(1, 1, 400, 1, generator=g, dtype=torch.float64)
        k = torch.cat([base, base + 0.1 * torch.randn(1, 1, 400, 1, generator=g)], dim=3)
        fit.add(0, k, k.flip(3) + 1.0, torch.zeros_like(k), torch.zeros_like(k))
    full, within, offset = (fit.solve([0], 0.0, s) for s in ("full", "within", "offset"))
    assert float(full["coef"][0, 2:, :2].abs().sum()) > 0.5  # V on K
    assert float(within["coef"][0, 2:, :2].abs().sum()) == 0.0 and float(within["coef"][0, 1, 0]) > 0.5
    assert float(offset["coef"].abs().sum()) == 0.0 and abs(float(offset["offset"][0, 2]) - 1.0) < 0.05
    # each structure that conditions on more has smaller conditional sigmas
    assert float(full["sigma"].sum()) < float(within["sigma"].sum()) < float(offset["sigma"].sum())
    with pytest.raises(ValueError, match="structure"):
        fit.solve([0], 0.0, "everything")


def test_a_predictor_free_codec_learns_its_means_and_codes_jointly(tmp_path):
    from speckv.hf import ChannelStatsPredictor
    from speckv.models.cache import prefill

    model = tiny_model("qwen3", seed=2)
    codec = SpeculativeCodec(model, predictor=ChannelStatsPredictor())
    codec.calibrate([ids(64, s) for s in range(8)])
    assert codec.joint and "means" in codec.calibration.predictor_state
    assert codec.calibration.joint_fits == {}  # the statistics are dropped unless asked for
    kept = SpeculativeCodec(model, predictor=ChannelStatsPredictor()).calibrate(
        [ids(64, s) for s in range(2)], keep_joint_fits=True
    )
    assert set(kept.joint_fits) == {"bf16", "fp8"}
    prompt = ids(30, 13)
    cache = prefill(model, prompt)
    data = codec.compress(cache, prompt, "bf16")
    assert speckv.info(data)["metadata"]["joint"] is True
    path = tmp_path / "stats.safetensors"
    codec.save(str(path))
    again = SpeculativeCodec.load(str(path), model)  # rebuilds the predictor, means from the file
    assert isinstance(again.predictor, ChannelStatsPredictor)
    assert_same(again, "bf16", cache, extract_kv(again.decompress(data, prompt, dequantize=False)))


def test_joint_fit_finds_a_gain_on_the_prediction():
    g = torch.Generator().manual_seed(3)
    fit = JointFit(1, 1, 1)
    for _ in range(10):
        mu = torch.randn(1, 1, 500, 1, generator=g, dtype=torch.float64)
        noise = 0.05 * torch.randn(1, 1, 500, 1, generator=g, dtype=torch.float64)
        fit.add(0, 0.25 * mu + noise, noise, mu, mu)  # the truth is 1.25 mu for K
    affine, offset = fit.solve([0], 0.0, "affine"), fit.solve([0], 0.0, "offset")
    assert abs(float(affine["scale"][0, 0]) - 1.25) < 0.01 and abs(float(affine["scale"][0, 1]) - 1.0) < 0.01
    assert float(offset["scale"].sub(1).abs().max()) == 0.0
    assert float(affine["sigma"][0, 0, 0, 0]) < 0.06 < float(offset["sigma"][0, 0, 0, 0])


def test_the_affine_structure_conditions_on_no_other_channel():
    g = torch.Generator().manual_seed(4)
    fit = JointFit(1, 1, 1)
    for _ in range(5):
        base = torch.randn(1, 1, 300, 1, generator=g, dtype=torch.float64)
        fit.add(0, base, base, torch.zeros_like(base), torch.zeros_like(base))
    assert float(fit.solve([0], 0.0, "affine")["coef"].abs().sum()) == 0.0
    assert float(fit.solve([0], 0.0, "full")["coef"].abs().sum()) > 0.5


def test_a_recalibrated_codec_codes_with_its_new_coefficients(calibrated):  # noqa: F811
    model, codec = calibrated
    other = SpeculativeCodec(model, codec.calibration, codec.predictor, fingerprint=codec.fingerprint)
    prompt = ids(24, 14)
    cache = other_kernels(model, prompt)
    other.compress(cache, prompt, "fp8")  # builds the core's arrays for this calibration
    other.calibrate([ids(64, s) for s in range(10, 14)])
    joint = other.params.joint_model("fp8", 1, 24, None, range(model.config.num_hidden_layers), True)
    coef = joint.coef
    c = coef.shape[1]
    fitted = other.calibration.joint["fp8"]
    assert np.array_equal(coef, fitted["coef"][:, c:, :].numpy())
    # and the integer form of the new coefficients (V: K's sigmas, then V's)
    sigma = fitted["sigma"].reshape(len(coef), -1).numpy()
    assert joint.integer is not None
    for got, want in zip(joint.integer, speckv.joint_integer(c, coef, sigma)):
        assert np.array_equal(got, want)
    data = other.compress(cache, prompt, "fp8")
    back = extract_kv(other.decompress(data, prompt, dequantize=False))
    assert_same(other, "fp8", cache, back)


def _joint_case():
    """A jointly coded bf16 stream of two layers (16 channels x 300 tokens, 8 outside channels,
    the token scale on), from fixed seeds: what a child process rebuilds to decode it."""
    import ml_dtypes

    rng = np.random.default_rng(2026)
    layers, channels, tokens, outside = 2, 16, 300, 8
    sigma = np.exp(rng.normal(-2.0, 1.0, (channels, 1))).astype(np.float32)
    mu = (rng.standard_normal((layers, channels, tokens)) * 3 * sigma).astype(np.float32)
    x = (mu + sigma * rng.standard_normal(mu.shape)).astype(ml_dtypes.bfloat16)
    coef = (0.2 * rng.standard_normal((layers, channels, outside + channels))).astype(np.float32)
    offset = (0.01 * rng.standard_normal((layers, channels))).astype(np.float32)
    given = rng.standard_normal((layers, outside, tokens)).astype(np.float32)
    joint = speckv.Joint(channels, tokens, coef, offset, given, speckv.TokenScale())
    return x, mu, sigma, joint


@pytest.mark.parametrize("simd", ["0", "avx2"])
def test_joint_streams_decode_alike_under_every_kernel(simd):
    """A joint stream coded here (AVX-512 where the processor has it) decodes to the same bits
    in a child whose vector kernels are turned off (``0``) or stopped at AVX2."""
    from helpers import decoded_in_child, words_digest

    x, mu, sigma, joint = _joint_case()
    stream = speckv.encode(x, mu, sigma, chunk_size=x[0].size, joint=joint)
    assert decoded_in_child(stream, simd, "codec.test_joint", "_joint_case()") == words_digest(x)


def test_a_joint_model_without_a_prediction_is_refused_by_every_call():
    """The joint model conditions on residuals from mu: without mu and sigma, encode, decode
    and ideal_bits refuse it with speckv's own error before the extension runs."""
    x = np.zeros((1, 2, 4), np.float16)
    joint = speckv.Joint(2, 4, np.zeros((1, 2, 2), np.float32), np.zeros((1, 2), np.float32))
    data = speckv.encode(x)
    for call in (
        lambda: speckv.encode(x, joint=joint),
        lambda: speckv.ideal_bits(x, joint=joint),
        lambda: speckv.decode(data, joint=joint),
    ):
        with pytest.raises(speckv.SpeckvError, match="needs mu and sigma"):
            call()
