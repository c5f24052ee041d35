"""Restoring a cache on the demo model (SmolLM2-135M-Instruct, a 512-token prompt of the
bundled evaluation text): ``decompress`` with the default predictor, the statistics predictor
(bins model) and the model's own prefill, in one run; the restores as multiples of the prefill
in ``extra_info`` and the closing table. Skips without the hf extra or the demo model;
calibrations are made once and cached (``speckv.cli.calibration_cache``)."""

from __future__ import annotations

import argparse

import pytest
from conftest import record

SEQ = 512


@pytest.fixture(scope="module")
def demo():
    pytest.importorskip("transformers", reason="the hf extra: pip install 'speckv-rs[hf]'")
    import torch

    from speckv.hf import load_demo_model
    from speckv.models.demo import bundled_text, prompts

    try:
        model, tokenizer = load_demo_model()
    except FileNotFoundError as e:
        pytest.skip(f"the demo model: {e}")
    torch.set_num_threads(2)
    prompt = prompts(tokenizer, bundled_text("evaluation"), SEQ, 1)[0]
    return model, tokenizer, prompt


def _codec(demo, predictor: str):
    from speckv.cli.calibration_cache import calibrated_codec

    model, tokenizer, _ = demo
    args = argparse.Namespace(
        calibration=None,
        calibration_text=None,
        samples=32,
        seq_len=SEQ,
        block_size=None,
        predictor=predictor,
        recalibrate=False,
        json=True,
    )
    return calibrated_codec(args, model, tokenizer, "SmolLM2-135M-Instruct")[0]


def _scalars(cache) -> int:
    from speckv.hf import extract_kv

    return sum(t.numel() for pair in extract_kv(cache) for t in pair)


def test_prefill(benchmark, demo, rates):
    from speckv.models.cache import prefill

    model, _, prompt = demo
    cache = benchmark.pedantic(prefill, (model, prompt), rounds=3, warmup_rounds=1)
    record(benchmark, rates, "demo prefill", _scalars(cache))


@pytest.mark.parametrize(("predictor", "coder"), [("prefix", "exact"), ("stats", "bins")])
def test_restore(benchmark, demo, rates, predictor, coder):
    import torch

    from speckv.hf import extract_kv
    from speckv.models.cache import other_kernels

    model, _, prompt = demo
    codec = _codec(demo, predictor)
    cache = other_kernels(model, prompt)
    data = codec.compress(cache, prompt, "bf16", model=coder)
    back = benchmark.pedantic(codec.decompress, (data, prompt), rounds=3, warmup_rounds=1)
    for (k, v), (k2, v2) in zip(extract_kv(cache), extract_kv(back)):
        assert torch.equal(k.view(torch.int16), k2.view(torch.int16))
        assert torch.equal(v.view(torch.int16), v2.view(torch.int16))
    n = _scalars(cache)
    record(benchmark, rates, f"demo restore {predictor}", n, bits_per_scalar=len(data) * 8 / n)
