"""The demo model converted once: ``cached_folder`` keeps the GGUF file's weights and tokenizer
as a transformers folder under ``$SPECKV_CACHE_DIR/models`` so that later loads read bf16
safetensors (~0.2 s) instead of dequantising the GGUF and rebuilding its tokenizer (~20 s on
two cores); ``restore_config`` gives a model loaded from it the config the GGUF load gives.

The folder is keyed by the GGUF file's BLAKE2b, the dtype and the transformers version (whose
code converts it), written under a lock into a temporary folder and renamed into place, so
processes loading at once convert once and never read half a folder. A model loaded from it
is the GGUF load's bit for bit: the same parameters, and a config that differs only where
saving a dequantised model must differ (its architectures, its GGUF quantisation settings),
which ``restore_config`` puts back and then checks; a folder it cannot make identical is not
used. ``SPECKV_MODEL_CACHE=0`` turns the cache off.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from .._cache_dir import cache_dir

SOURCE_CONFIG = "speckv-source-config.json"  # the GGUF load's config, in the cached folder


def enabled() -> bool:
    return os.environ.get("SPECKV_MODEL_CACHE", "1") != "0"


def config_dict(model: Any) -> dict[str, Any]:
    """The model's config as JSON values, less where it was loaded from: stricter than the
    model's fingerprint (``predictors.calibration.model_fingerprint``), which leaves out the
    versions and the dtype too."""
    config = model.config.to_dict()
    for where in ("_name_or_path", "name_or_path", "_commit_hash"):
        config.pop(where, None)
    return dict(json.loads(json.dumps(config, sort_keys=True, default=str)))


def _file_digest(path: Path) -> str:
    h = hashlib.blake2b(digest_size=8)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def folder_for(gguf: Path, dtype: torch.dtype) -> Path:
    """Where ``gguf`` converted to ``dtype`` is cached."""
    import transformers  # imported where used, as everywhere in ``speckv.hf``

    name = (
        f"{gguf.stem}-{_file_digest(gguf)}-{str(dtype).removeprefix('torch.')}-transformers{transformers.__version__}"
    )
    return cache_dir() / "models" / name


def cached_folder(gguf: Path, dtype: torch.dtype, load: Any) -> Path:
    """The cached folder of ``gguf`` in ``dtype``, converted first where there is none:
    ``load(path, dtype)`` is the GGUF loader (``demo.load_model`` without the cache)."""
    from filelock import FileLock  # a requirement of torch and of transformers' hub client

    folder = folder_for(gguf, dtype)
    if (folder / SOURCE_CONFIG).exists():
        return folder
    folder.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        if (folder / SOURCE_CONFIG).exists():  # another process converted it meanwhile
            return folder
        print(f"speckv: converting {gguf.name} once, into {folder} (SPECKV_MODEL_CACHE=0: never)", file=sys.stderr)
        model, tokenizer = load(gguf, dtype)
        source = config_dict(model)
        work = Path(tempfile.mkdtemp(prefix=".converting-", dir=folder.parent))
        try:
            save_dequantised(model, tokenizer, work)
            (work / SOURCE_CONFIG).write_text(json.dumps(source, sort_keys=True))
            os.replace(work, folder)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return folder


def save_dequantised(model: Any, tokenizer: Any, out: Path) -> None:
    """``model`` (GGUF weights, dequantised on loading) as plain safetensors: a config still
    naming the GGUF quantiser would make readers dequantise them again."""
    if hasattr(model, "hf_quantizer"):
        model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    if hasattr(model, "is_quantized"):
        model.is_quantized = False
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))


def restore_config(model: Any, folder: Path) -> bool:
    """Gives ``model``, loaded from the cached ``folder``, the config of the GGUF load (its
    architectures and quantisation settings): whether it now is that config exactly."""
    source = json.loads((folder / SOURCE_CONFIG).read_text())
    model.config.architectures = source.get("architectures")
    quantization = source.get("quantization_config")
    if quantization is not None:
        from transformers.utils.quantization_config import GgufConfig

        if quantization.get("quant_method") != "gguf":
            return False
        model.config.quantization_config = GgufConfig.from_dict(quantization)
    return config_dict(model) == source
