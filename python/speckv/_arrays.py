"""Turning numpy arrays and torch tensors into flat integer words, and back.

The Rust core sees only bit patterns: uint8/uint16/uint32 words, C order. Everything here is
about getting those words out of whatever the user holds without changing a single bit.
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

# dtype name (as the stream records it) -> numpy dtype, word dtype
_NUMPY: dict[str, tuple[np.dtype, np.dtype]] = {
    "bfloat16": (np.dtype(ml_dtypes.bfloat16), np.dtype(np.uint16)),
    "float16": (np.dtype(np.float16), np.dtype(np.uint16)),
    "float8_e4m3fn": (np.dtype(ml_dtypes.float8_e4m3fn), np.dtype(np.uint8)),
    "float8_e5m2": (np.dtype(ml_dtypes.float8_e5m2), np.dtype(np.uint8)),
    "float32": (np.dtype(np.float32), np.dtype(np.uint32)),
}

SUPPORTED_DTYPES: tuple[str, ...] = tuple(_NUMPY)


def is_torch(obj: Any) -> bool:
    mod = type(obj).__module__
    return mod.startswith("torch") and type(obj).__name__ in ("Tensor", "Parameter")


def _torch_word_dtype(torch: Any, bits: int) -> Any:
    return {8: torch.uint8, 16: torch.int16, 32: torch.int32}[bits]


def dtype_name(arr: Any, what: str) -> str:
    """The stream dtype name of a numpy array or torch tensor; TypeError naming `what`."""
    if is_torch(arr):
        name = str(arr.dtype).replace("torch.", "")
    else:
        name = np.dtype(arr.dtype).name if hasattr(arr, "dtype") else type(arr).__name__
    if name not in _NUMPY:
        raise TypeError(f"{what}: dtype {name} is not supported; use one of {', '.join(SUPPORTED_DTYPES)}")
    return name


def numpy_dtype(name: str) -> np.dtype:
    return _NUMPY[name][0]


def to_numpy(arr: Any) -> np.ndarray:
    """A numpy view (or, for torch tensors on another device, a copy) with identical bits."""
    if is_torch(arr):
        import torch

        t = arr.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        name = str(t.dtype).replace("torch.", "")
        if name in _NUMPY:
            bits = _NUMPY[name][1].itemsize * 8
            words = t.view(_torch_word_dtype(torch, bits)).numpy()
            return words.view(_NUMPY[name][0])
        return t.numpy()
    if isinstance(arr, np.ndarray):
        return arr
    return np.asarray(arr)


def words_of(arr: np.ndarray, name: str) -> np.ndarray:
    """Flat C-ordered words of `arr` (already of dtype `name`); copies only if not contiguous."""
    return np.ascontiguousarray(arr).view(_NUMPY[name][1]).reshape(-1)


def to_torch(arr: np.ndarray) -> Any:
    import torch

    name = arr.dtype.name
    bits = _NUMPY[name][1].itemsize * 8
    signed = {8: np.uint8, 16: np.int16, 32: np.int32}[bits]
    t = torch.from_numpy(np.ascontiguousarray(arr).view(signed))
    return t.view(getattr(torch, name))
