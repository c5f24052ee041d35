"""Speculative coding of Hugging Face KV caches (extra ``hf``: torch, transformers): the
names of the workflow in one import. The code lives in ``speckv.codec``, ``speckv.predictors``,
``speckv.models``, ``speckv.prefix`` and ``speckv.cuda`` (``docs/concepts/architecture.md``);
their modules' old paths under ``speckv.hf`` (``speckv.hf.codec.codec``, ...) still import, with a
``DeprecationWarning``, until the release after 0.1 (``CHANGELOG``).

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

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings

from ..codec.blocks import BlockCodec
from ..codec.codec import SpeculativeCodec
from ..models.cache import build_cache, extract_kv, prefill
from ..models.demo import bundled_text, demo_gguf_path, load_demo_model, load_model, prompts
from ..predictors.base import ChannelStatsPredictor, Fp8Predictor, Predictor
from ..predictors.calibration import Calibration, model_fingerprint
from ..predictors.early_exit import ModelPrefixPredictor, PrefixState
from ..predictors.layerwise import LayerRun, LayerwisePredictor
from ..prefix.free_store import FreePrefixStore
from ..prefix.prefix_store import PrefixStore

# where each package under ``speckv.hf`` went (0.1 -> 0.2)
MOVED = {
    # modules merged into another (the more specific paths first)
    "speckv.hf.codec.coding_params": "speckv.codec.plan",
    "speckv.hf.codec.joint_models": "speckv.codec.plan",
    "speckv.hf.codec.parallel": "speckv.codec.block_layout",
    "speckv.hf.codec": "speckv.codec",
    "speckv.hf.predictors": "speckv.predictors",
    "speckv.hf.models": "speckv.models",
    "speckv.hf.cuda": "speckv.cuda",
    "speckv.hf.stores": "speckv.prefix",
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``speckv.hf.codec.codec`` and the like as the module they moved to (the same
    module object, so ``isinstance`` and monkeypatching see one module), warning once each."""

    def find_spec(self, name: str, path: object = None, target: object = None) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(name, self) if _new_name(name) is not None else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        new = _new_name(spec.name)
        assert new is not None
        warnings.warn(f"{spec.name} moved to {new} (the old path goes after 0.1)", DeprecationWarning, stacklevel=2)
        return importlib.import_module(new)

    def exec_module(self, module: types.ModuleType) -> None:
        pass  # the module it moved to is imported already


def _new_name(name: str) -> str | None:
    for old, new in MOVED.items():
        if name == old or name.startswith(old + "."):
            return new + name[len(old) :]
    return None


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())  # before the path finder, which would load a second copy

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
