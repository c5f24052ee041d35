"""Tiny random models for the tests (built here: no download), their prompts, calibrated codecs
and a checkpoint folder, and the check that a restored cache is the stored one bit for bit.
Test modules that need torch import this after ``pytest.importorskip("torch")``; fixtures
(``calibrated``, ``checkpoint``) are imported into the module that uses them."""

from __future__ import annotations

import pytest
import torch
import transformers

from speckv.hf import Fp8Predictor, ModelPrefixPredictor, SpeculativeCodec
from speckv.predictors.calibration import fp8_quantize


def tiny_model(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    common = dict(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
    )
    if kind == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**common))
    else:
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**common))
    return model.to(torch.bfloat16).eval()


def ids(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 96, (1, n), generator=g)


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def calibrated(request):
    model = tiny_model(request.param)
    codec = SpeculativeCodec(model, predictor=Fp8Predictor(model))
    codec.calibrate([ids(64, s) for s in range(4)])
    return model, codec


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny model as a transformers folder and a map-predictor calibration of it."""
    folder = tmp_path_factory.mktemp("ckpt")
    model = tiny_model("llama")
    model.save_pretrained(str(folder))
    codec = SpeculativeCodec(model, predictor=ModelPrefixPredictor(model, layers=1))
    codec.calibrate([ids(48, s) for s in range(6)], fp8_scale=1.0)
    cal = folder / "cal.safetensors"
    codec.save(str(cal))
    return folder, cal, model


WORDS = {"bf16": torch.int16, "fp16": torch.int16, "fp8": torch.uint8}


def stored(codec, mode, layer, which, t):
    if mode == "fp8":
        return fp8_quantize(t, float(codec.calibration.fp8_scales[layer, which]))
    return t.to({"bf16": torch.bfloat16, "fp16": torch.float16}[mode])


def assert_same(codec, mode, cache, back):
    word = WORDS[mode]
    for layer, ((k, v), (k2, v2)) in enumerate(zip(cache, back)):
        for which, (a, b) in enumerate(((k, k2), (v, v2))):
            ref = stored(codec, mode, layer, which, a)
            assert b.dtype == ref.dtype and b.shape == ref.shape
            assert torch.equal(ref.view(word), b.view(word)), (layer, which)
