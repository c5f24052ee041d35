"""Writes the version-1 cache containers in ``containers/`` with the version-1 code itself.

Run once, with the package as it was at cea71cb (the last commit before container version 2)
first on the path, never with the current one (its containers are version 2):

    git worktree add /tmp/v1 cea71cb && (cd /tmp/v1 && maturin build --release -o /tmp/v1w)
    python -m zipfile -e /tmp/v1w/*.whl /tmp/v1site
    PYTHONPATH=/tmp/v1site python tests/goldens/v1/make_containers.py

What it writes (all read by ``tests/core/test_goldens.py``, none rewritten by any test):

- ``model/``: a tiny random-weight Llama (config and safetensors), so that the model
  fingerprint a container records is the one the test loads, whatever torch's initialisers do;
- ``calibration.safetensors``: the version-1 calibration of the statistics predictor (the one
  predictor whose prediction needs no forward pass, so decoding it is exact on any torch);
- ``prompt.json``: the token ids every container was made from;
- ``{mode}-{layout}-{coder}.spkc``: containers of that prompt's cache;
- ``manifest.json``: per container, the SHA-256 of each layer's stored K and V words (the
  cache as the mode stores it: bf16/fp16 bits, fp8 bytes) computed here, before encoding.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import sys
from pathlib import Path

import torch
import transformers

from speckv.codec import codec as codec_module
from speckv.hf import ChannelStatsPredictor, SpeculativeCodec
from speckv.models.cache import extract_kv, prefill
from speckv.predictors.calibration import Calibration

OUT = Path(__file__).resolve().parent / "containers"
WORDS = {"bf16": torch.int16, "fp16": torch.int16, "fp8": torch.uint8}


def digest(t: torch.Tensor, mode: str) -> str:
    return hashlib.sha256(t.contiguous().view(WORDS[mode]).numpy().tobytes()).hexdigest()


def main() -> None:
    if importlib.util.find_spec("speckv.container") is not None:  # came with version 2
        sys.exit("this is not the version-1 code: see the module docstring")
    OUT.mkdir(exist_ok=True)
    torch.manual_seed(25)
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        max_position_embeddings=128,
    )
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16).eval()
    model.save_pretrained(OUT / "model")
    model = transformers.LlamaForCausalLM.from_pretrained(OUT / "model", torch_dtype=torch.bfloat16).eval()

    g = torch.Generator().manual_seed(7)
    samples = [torch.randint(0, 64, (1, 48), generator=g) for _ in range(4)]
    prompt = torch.randint(0, 64, (1, 40), generator=g)
    (OUT / "prompt.json").write_text(json.dumps(prompt[0].tolist()) + "\n")

    # version 1's statistics predictor took its means from a first calibration
    first = SpeculativeCodec(model, predictor=ChannelStatsPredictor(torch.zeros(3, 2, 1, 16)))
    means = first.calibrate(samples).means
    codec = SpeculativeCodec(model, predictor=ChannelStatsPredictor(means))
    calibration = codec.calibrate(samples)
    codec.save(str(OUT / "calibration.safetensors"))
    assert Calibration.load(str(OUT / "calibration.safetensors")).digest() == calibration.digest()

    cache = prefill(model, prompt)
    manifest: dict[str, dict[str, object]] = {}
    layouts = {"stacked": codec_module._layout, "per-layer": lambda jobs: "per-layer"}
    for mode in ("bf16", "fp16", "fp8"):
        for layout, choose in layouts.items():
            for coder in ("exact", "fast"):
                codec_module._layout = choose
                data = codec.compress(cache, prompt, mode, model=coder)
                header, _ = SpeculativeCodec.read_header(data)
                assert header["layout"] == layout, header["layout"]
                name = f"{mode}-{layout}-{coder}"
                (OUT / f"{name}.spkc").write_bytes(data)
                stored = [
                    [digest(codec._stored(mode, layer, which, t), mode) for which, t in enumerate(kv)]
                    for layer, kv in enumerate(cache)
                ]
                back = codec.decompress(data, prompt, dequantize=False)
                assert [[digest(t, mode) for t in kv] for kv in extract_kv(back)] == stored
                manifest[name] = {"mode": mode, "layout": layout, "coder": coder, "layers": stored}
    codec_module._layout = layouts["stacked"]
    (OUT / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(manifest)} containers to {OUT}")


if __name__ == "__main__":
    main()
