"""Speculative coding of Hugging Face KV caches (extra ``hf``: torch, transformers).

A cheap predictor (by default the model's own first two thirds of layers, then maps from the
layers already decoded; or an fp8-quantised copy of the model, the reference method) predicts
the cache of a prompt; the true cache is coded against that prediction with sigmas measured on
calibration text, and decoded back bit for bit by running the same predictor. ``PrefixStore``
keeps many such caches, deduplicated by token block, on a ``speckv.store`` backend;
``FreePrefixStore`` keeps them without a predictor (speckv's fast lane: larger, restored by
decoding alone).

>>> from speckv.hf import SpeculativeCodec, bundled_text, load_demo_model, prefill, prompts  # doctest: +SKIP
>>> model, tokenizer = load_demo_model()                                     # doctest: +SKIP
>>> codec = SpeculativeCodec(model)                                          # doctest: +SKIP
>>> codec.calibrate(prompts(tokenizer, bundled_text("calibration"), 512, 32))  # doctest: +SKIP
>>> input_ids = prompts(tokenizer, bundled_text("evaluation"), 512, 1)[0]    # doctest: +SKIP
>>> cache = prefill(model, input_ids)                                        # doctest: +SKIP
>>> data = codec.compress(cache, input_ids, dtype="bf16")                    # doctest: +SKIP
>>> cache2 = codec.decompress(data, input_ids)                               # doctest: +SKIP
"""

from __future__ import annotations

from .codec.blocks import BlockCodec
from .codec.codec import SpeculativeCodec
from .models.cache import build_cache, extract_kv, prefill
from .models.demo import bundled_text, demo_gguf_path, load_demo_model, load_model, prompts
from .predictors.base import ChannelStatsPredictor, Fp8Predictor, Predictor
from .predictors.calibration import Calibration, model_fingerprint
from .predictors.early_exit import ModelPrefixPredictor, PrefixState
from .predictors.layerwise import LayerRun, LayerwisePredictor
from .stores.free_store import FreePrefixStore
from .stores.prefix_store import PrefixStore

__all__ = [
    "BlockCodec",
    "Calibration",
    "ChannelStatsPredictor",
    "Fp8Predictor",
    "FreePrefixStore",
    "LayerRun",
    "LayerwisePredictor",
    "ModelPrefixPredictor",
    "PrefixState",
    "PrefixStore",
    "Predictor",
    "SpeculativeCodec",
    "build_cache",
    "bundled_text",
    "demo_gguf_path",
    "extract_kv",
    "load_demo_model",
    "load_model",
    "model_fingerprint",
    "prefill",
    "prompts",
]
