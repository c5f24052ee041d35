"""A model's first layers read from its transformers checkpoint, and the checkpoint's
fingerprint, without building the whole model: what a predictor needs inside a serving engine.

A serving engine (vLLM) holds the model in its own modules; speckv's layer-wise predictors
need only its embedding, its rotary embedding and its first ``layers`` decoder layers (the map
predictor: layer 0 alone). ``load_trunk`` builds the Hugging Face model with every parameter on
the ``meta`` device (no memory), then reads exactly those modules' weights from the folder's
safetensors files. The forward pass of ``ModelPrefixPredictor`` stops after its last layer, so
the rest is never touched. ``checkpoint_fingerprint`` hashes every parameter as
``model_fingerprint`` does (the same digest as the fully loaded model's, so calibrations made
with ``speckv calibrate --model FOLDER`` are accepted), streaming the tensors from the files.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from .._speckv import SpeckvError
from ..predictors.base import decoder_layers
from ..predictors.calibration import fingerprint_config


class CheckpointError(SpeckvError):
    """A transformers checkpoint folder is missing, unreadable, or lacks a tensor it must hold."""


def _weight_files(folder: Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (one file, or a sharded index)."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            mapping = json.loads(index.read_text())["weight_map"]
        except (OSError, ValueError, KeyError) as e:
            raise CheckpointError(f"{index}: unreadable index ({e})") from None
        return {name: folder / file for name, file in mapping.items()}
    single = folder / "model.safetensors"
    if not single.is_file():
        raise CheckpointError(f"{folder}: no model.safetensors or model.safetensors.index.json (a transformers folder)")
    from safetensors import safe_open

    try:
        with safe_open(str(single), "pt") as f:
            return {name: single for name in f.keys()}
    except Exception as e:  # safetensors raises its own errors for damaged files
        raise CheckpointError(f"{single}: {e}") from None


class _Tensors:
    """Reads named tensors from a checkpoint's files, keeping each file open once."""

    def __init__(self, folder: Path) -> None:
        self.files = _weight_files(folder)
        self._open: dict[Path, Any] = {}

    def get(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        path = self.files.get(name)
        if path is None:
            raise CheckpointError(f"the checkpoint holds no tensor {name!r}")
        try:
            if path not in self._open:
                self._open[path] = safe_open(str(path), "pt")
            return self._open[path].get_tensor(name)
        except CheckpointError:
            raise
        except Exception as e:
            raise CheckpointError(f"{path}: reading {name}: {e}") from None


def skeleton(folder: Path, dtype: torch.dtype) -> Any:
    """The model built from the folder's config with parameters on ``meta`` (buffers such as
    RoPE's frequencies are made for real), weights tied as ``from_pretrained`` ties them."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    if not (folder / "config.json").is_file():
        raise CheckpointError(f"{folder}: no config.json (expected a transformers checkpoint folder)")
    try:
        config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except Exception as e:
        raise CheckpointError(f"{folder}/config.json: {e}") from None
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.tie_weights()
    return model.eval()


def _checkpoint_name(name: str, names: set[str]) -> str:
    """The checkpoint's name for a parameter (transformers may prefix or not)."""
    if name in names:
        return name
    for candidate in (name.removeprefix("model."), "model." + name):
        if candidate in names:
            return candidate
    raise CheckpointError(f"the checkpoint holds no tensor for parameter {name!r}")


def load_trunk(folder: str | os.PathLike[str], layers: int, *, dtype: torch.dtype = torch.bfloat16) -> Any:
    """The checkpoint's model with only its embedding and first ``layers`` decoder layers in
    memory (``dtype``, as ``from_pretrained(..., dtype=dtype)`` casts them); every other
    parameter stays on ``meta``. Enough for ``ModelPrefixPredictor(model, layers)``."""
    path = Path(folder)
    model = skeleton(path, dtype)
    n = int(model.config.get_text_config(decoder=True).num_hidden_layers)
    if not 1 <= layers <= n:
        raise CheckpointError(f"layers: expected 1..{n}, got {layers}")
    inner = getattr(model, "model", model)
    wanted = [inner.get_input_embeddings(), *list(decoder_layers(model))[:layers]]
    tensors = _Tensors(path)
    names = set(tensors.files)
    prefix = {id(m): full for full, m in model.named_modules()}
    for module in wanted:
        base = prefix[id(module)]
        state = {}
        for local, param in module.named_parameters():
            t = tensors.get(_checkpoint_name(f"{base}.{local}", names))
            if tuple(t.shape) != tuple(param.shape):
                raise CheckpointError(
                    f"{base}.{local}: shape {tuple(t.shape)} in the checkpoint, {tuple(param.shape)} in the config"
                )
            state[local] = t.to(dtype)
        module.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()  # the embedding is a new tensor now: a tied LM head follows it
    return model


def checkpoint_fingerprint(folder: str | os.PathLike[str], model: Any) -> str:
    """``model_fingerprint`` of the checkpoint's fully loaded model (``model``: its skeleton or
    trunk, for the parameters' names, dtype and order), each tensor read from the files."""
    path = Path(folder)
    tensors = _Tensors(path)
    names = set(tensors.files)
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps(fingerprint_config(model), sort_keys=True, default=str).encode())
    for name, p in model.named_parameters():
        t = tensors.get(_checkpoint_name(name, names)).to(p.dtype).contiguous()
        h.update(f"{name}:{t.dtype}:{tuple(t.shape)}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


__all__ = ["CheckpointError", "checkpoint_fingerprint", "load_trunk"]
