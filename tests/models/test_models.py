"""Every decoder a user brings: tiny random-weight Gemma 3 (sliding windows shorter than the
prompt, QK-norm, RoPE of another base per layer type, one KV head), Qwen2 (biases on q/k/v)
and Qwen3 (QK-norm) built here, no download. Every predictor in every storage dtype round-trips
bit for bit; a restored sliding-window cache continues the prompt as the original does;
architectures speckv cannot predict are refused up front with a typed error."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import speckv  # noqa: E402
from speckv.hf import (  # noqa: E402
    ChannelStatsPredictor,
    Fp8Predictor,
    ModelPrefixPredictor,
    SpeculativeCodec,
    build_cache,
    extract_kv,
)
from speckv.models.architecture import UnsupportedModelError, check_architecture  # noqa: E402
from speckv.models.cache import prefill  # noqa: E402
from speckv.predictors.calibration import JointFit, fp8_quantize  # noqa: E402

WORDS = {"bf16": torch.int16, "fp16": torch.int16, "fp8": torch.uint8}
WINDOW = 8


def tiny(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    common = dict(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=2,
        max_position_embeddings=256,
    )
    if kind == "gemma3":
        config = transformers.Gemma3TextConfig(
            **common,
            num_hidden_layers=5,
            num_key_value_heads=1,
            head_dim=32,
            sliding_window=WINDOW,
            layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention"]
            + ["full_attention"],
        )
        model = transformers.Gemma3ForCausalLM(config)
    elif kind == "qwen2":
        config = transformers.Qwen2Config(**common, num_hidden_layers=4, num_key_value_heads=1)
        model = transformers.Qwen2ForCausalLM(config)
        with torch.no_grad():  # random biases on q/k/v, as trained Qwen2 models have
            for layer in model.model.layers:
                for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                    proj.bias.normal_(0, 0.5)
    else:
        config = transformers.Qwen3Config(**common, num_hidden_layers=4, num_key_value_heads=1, head_dim=32)
        model = transformers.Qwen3ForCausalLM(config)
    return model.to(torch.bfloat16).eval()


def ids(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 96, (1, n), generator=g)


PREDICTORS = {
    "stats": lambda m: ChannelStatsPredictor(),
    "map": lambda m: ModelPrefixPredictor(m, 1),
    "prefix": lambda m: ModelPrefixPredictor(m, 2),
    # the forward pass in steps of 7 tokens (chunked prefill; Gemma's window is 8)
    "prefix-steps": lambda m: ModelPrefixPredictor(m, 3, prefill_chunk=7),
    "fp8": lambda m: Fp8Predictor(m),
}


@pytest.fixture(scope="module", params=[(k, p) for k in ("gemma3", "qwen2", "qwen3") for p in PREDICTORS])
def codec(request):
    kind, name = request.param
    model = tiny(kind)
    codec = SpeculativeCodec(model, predictor=PREDICTORS[name](model))
    codec.calibrate([ids(24, s) for s in range(4)])
    return codec


def stored(codec, mode, layer, which, t):
    if mode == "fp8":
        return fp8_quantize(t, float(codec.calibration.fp8_scales[layer, which]))
    return t.to({"bf16": torch.bfloat16, "fp16": torch.float16}[mode])


@pytest.mark.parametrize("mode", list(WORDS))
@pytest.mark.parametrize("block_size", [None, 5])
def test_every_predictor_round_trips_every_dtype(codec, mode, block_size):
    prompt = ids(21, 99)
    kv = prefill(codec.model, prompt)
    if codec.model.config.model_type == "gemma3_text":
        # the sliding layers hold the last WINDOW - 1 tokens, the full ones all 21
        assert [k.shape[2] for k, _ in kv] == [WINDOW - 1, WINDOW - 1, 21, WINDOW - 1, 21]
    data = codec.compress(build_cache(kv), prompt, mode, block_size=block_size)
    back = extract_kv(codec.decompress(data, prompt, dequantize=False))
    word = WORDS[mode]
    for layer, ((k, v), (k2, v2)) in enumerate(zip(kv, back)):
        for which, (a, b) in enumerate(((k, k2), (v, v2))):
            ref = stored(codec, mode, layer, which, a)
            assert b.dtype == ref.dtype and b.shape == ref.shape, (layer, which)
            assert torch.equal(ref.view(word), b.view(word)), (layer, which)
    for layer in (0, len(kv) - 1):
        k1, v1 = codec.decompress_layer(data, prompt, layer)
        assert torch.equal(k1.view(word), back[layer][0].view(word))
        assert torch.equal(v1.view(word), back[layer][1].view(word))
    # the container says what each layer holds (tiny caches: sizes are the benchmarks' job)
    assert speckv.info(data)["layer_tokens"] in ([k.shape[2] for k, _ in kv], [])


@pytest.mark.parametrize("kind", ["gemma3"])
def test_a_restored_sliding_window_cache_continues_the_prompt_as_the_original(kind):
    """The restored cache is what the model made: sliding layers of its kind, which know how
    many tokens they have seen, so the next token's logits are the original cache's."""
    model = tiny(kind)
    codec = SpeculativeCodec(model, predictor=ModelPrefixPredictor(model, 2))
    codec.calibrate([ids(24, s) for s in range(4)])
    prompt = ids(21, 7)
    with torch.no_grad():
        out = model(input_ids=prompt, use_cache=True)
    original = out.past_key_values
    data = codec.compress(original, prompt, "bf16")
    restored = codec.decompress(data, prompt)
    assert restored.get_seq_length() == original.get_seq_length() == 21
    nxt = ids(3, 8)
    with torch.no_grad():
        a = model(input_ids=nxt, cache=original, use_cache=True).logits
        b = model(input_ids=nxt, cache=restored, use_cache=True).logits
    assert torch.equal(a, b)


def test_a_cache_that_kept_every_token_is_restored_whole():
    """A Gemma 3 cache made with a plain ``DynamicCache()`` keeps every token in every layer
    (the masks apply the window): the restored cache keeps them too, none dropped."""
    model = tiny("gemma3")
    codec = SpeculativeCodec(model, predictor=ChannelStatsPredictor())
    codec.calibrate([ids(24, s) for s in range(2)])
    prompt = ids(21, 3)
    full = transformers.DynamicCache()
    with torch.no_grad():
        model(input_ids=prompt, cache=full, use_cache=True)
    kv = extract_kv(full)
    assert all(k.shape[2] == 21 for k, _ in kv)
    back = extract_kv(codec.decompress(codec.compress(full, prompt, "bf16"), prompt))
    for (k, v), (k2, v2) in zip(kv, back):
        assert torch.equal(k, k2) and torch.equal(v, v2)


def test_architectures_it_cannot_predict_are_refused_up_front():
    model = tiny("qwen3")
    model.config.layer_types = ["full_attention", "linear_attention", "full_attention", "full_attention"]
    with pytest.raises(UnsupportedModelError, match="linear_attention"):
        check_architecture(model)
    with pytest.raises(UnsupportedModelError):
        SpeculativeCodec(model)
    model = tiny("qwen3")
    model.config.kv_lora_rank = 16
    with pytest.raises(UnsupportedModelError, match="latent"):
        SpeculativeCodec(model)

    class NoLayers(torch.nn.Module):
        config = tiny("qwen3").config

    with pytest.raises(UnsupportedModelError, match="no decoder layers"):
        SpeculativeCodec(NoLayers())


def test_the_joint_fit_survives_degenerate_channels_and_says_so():
    """A constant channel and two identical ones (a rank-deficient covariance): the fit
    decouples the constant channel, records it, and gives finite coefficients."""
    g = torch.Generator().manual_seed(0)
    fit = JointFit(1, 1, 4)
    for _ in range(3):
        e = torch.randn(1, 1, 200, 4, generator=g).double()
        e[..., 0] = 0.25  # constant
        e[..., 2] = e[..., 1]  # duplicate
        fit.add(0, e, e.clone(), torch.randn(e.shape, generator=g).double(), torch.randn(e.shape, generator=g).double())
    out = fit.solve([0], 0.0)
    assert all(bool(torch.isfinite(t).all()) for t in out.values())
    assert fit.repairs["0"]["degenerate_channels"] == [0, 4]
    assert bool((out["sigma"] > 0).all())


def test_the_prefix_store_serves_sliding_window_models_from_caches_that_kept_every_token():
    """A stored block holds every layer's tokens; a model's own sliding cache (tokens dropped)
    is refused with the reason; ``generate`` keeps every token and continues as the model."""
    from speckv.hf import PrefixStore
    from speckv.store import MemoryBackend

    model = tiny("gemma3")
    codec = SpeculativeCodec(model, predictor=ModelPrefixPredictor(model, 2))
    codec.calibrate([ids(32, s) for s in range(4)])
    store = PrefixStore(codec, MemoryBackend(), block_size=4)
    prompt = ids(18, 5)
    with torch.no_grad():
        windowed = model(input_ids=prompt, use_cache=True).past_key_values
    with pytest.raises(UnsupportedModelError, match="sliding window"):
        store.put(prompt, windowed)
    full = transformers.DynamicCache()
    with torch.no_grad():
        model(input_ids=prompt, cache=full, use_cache=True)
    assert store.put(prompt, full) == 16
    cache, n = store.get(prompt, dequantize=False)
    assert n == 16
    for (k, v), (k2, v2) in zip(extract_kv(full), extract_kv(cache)):
        assert torch.equal(k[:, :, :16].to(torch.bfloat16), k2) and torch.equal(v[:, :, :16].to(torch.bfloat16), v2)
    # a prompt that shares the stored blocks: generation from the restored prefix is the
    # model's own from the same 16 tokens' cache
    longer = torch.cat([prompt, ids(6, 6)], dim=1)
    cut = build_cache([(k[:, :, :16].clone(), v[:, :, :16].clone()) for k, v in extract_kv(full)])
    want = model.generate(longer, max_new_tokens=4, do_sample=False, cache=cut)
    got = store.generate(longer, max_new_tokens=4, do_sample=False)
    assert torch.equal(got, want)
    assert store.stats()["hits"] == 4 + 4  # get's four blocks, then generate's
    # generate stored the new blocks from a cache that kept every token
    assert store.match(got) == 24


@pytest.mark.parametrize("kind", ["gemma3", "qwen2"])
def test_the_joint_model_codes_layers_of_different_token_counts(kind):
    """Sliding layers hold fewer tokens than full ones, so the container is per layer: each
    layer with a joint model is its own channel-major stream, V given K's residuals; the
    whole-prompt decode, the layer-wise walk and one layer alone all read it back."""
    import speckv

    model = tiny(kind)
    for predictor in (Fp8Predictor(model), ModelPrefixPredictor(model, 2)):
        codec = SpeculativeCodec(model, predictor=predictor, joint=True)
        codec.calibrate([ids(24, s) for s in range(4)])
        assert codec.calibration.joint
        prompt = ids(21, 4)
        kv = prefill(model, prompt)
        for mode, word in WORDS.items():
            data = codec.compress(build_cache(kv), prompt, mode, block_size=8)
            assert codec.read_header(data).metadata["joint"] is True
            facts = speckv.info(data)
            assert facts["layout"] == ("per-layer" if kind == "gemma3" else "stacked")
            back = extract_kv(codec.decompress(data, prompt, dequantize=False))
            for layer, ((k, v), (k2, v2)) in enumerate(zip(kv, back)):
                for which, (a, b) in enumerate(((k, k2), (v, v2))):
                    ref = stored(codec, mode, layer, which, a)
                    assert torch.equal(ref.view(word), b.view(word)), (type(predictor).__name__, mode, layer, which)
            last = len(kv) - 1
            k1, v1 = codec.decompress_layer(data, prompt, last)
            assert torch.equal(v1.view(word), back[last][1].view(word))


@pytest.mark.parametrize("kind", ["gemma3", "qwen2"])
def test_the_prefix_in_steps_hands_over_what_the_whole_forward_pass_makes(kind):
    """Chunked prefill: every layer's K/V of every position reach the sink once, equal to a
    one-step forward pass's up to rounding (other matmul shapes), on full and sliding layers."""
    model = tiny(kind)
    prompt = ids(30, 5)
    got: dict[str, dict[int, tuple]] = {"steps": {}, "whole": {}}
    for name, chunk in (("steps", 8), ("whole", 64)):
        p = ModelPrefixPredictor(model, 3, prefill_chunk=chunk)

        def sink(layer, k, v, out=got[name]):
            assert layer not in out, "a layer reached the sink twice"
            out[layer] = (k.float(), v.float())

        p.prefix(prompt, sink)
    assert sorted(got["steps"]) == sorted(got["whole"]) == [0, 1, 2]
    for layer, (k, v) in got["whole"].items():
        k2, v2 = got["steps"][layer]
        assert k2.shape == k.shape and k.shape[2] == 30
        scale = float(k.abs().max()) + float(v.abs().max())
        assert float((k2 - k).abs().max()) < 0.05 * scale and float((v2 - v).abs().max()) < 0.05 * scale
