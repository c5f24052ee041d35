"""The rotary position embedding as the layer-wise maps need it: a pure rotation per
(position, channel pair) and its inverse, from tables computed exactly (the same bits on every
machine) where the model's RoPE kind allows it."""

from __future__ import annotations

import inspect
import math
from typing import Any

import numpy as np
import torch

from ..models.architecture import layer_types, text_config


class Rope:
    """The model's rotary position embedding as a pure rotation per (position, channel pair),
    float32, and its inverse: ``unrope(k)`` takes a cached K back to before RoPE (up to the
    model's scaling), ``rope(u)`` applies it. Identity for models without a rotary module
    covering the whole head (partial rotary is left alone). ``layer_type``: the RoPE of that
    kind of layer, for models whose layer types have their own (Gemma 3: another base on its
    sliding layers). A tensor of fewer tokens than ``seq`` holds the last positions (a
    sliding-window layer's cache)."""

    def __init__(self, model: Any, seq: int, head_dim: int, start: int = 0, layer_type: str | None = None) -> None:
        inner = getattr(model, "model", model)
        rotary = getattr(inner, "rotary_emb", None)
        if layer_type is not None and layer_type != "full_attention" and hasattr(inner, "rotary_emb_local"):
            rotary = inner.rotary_emb_local  # older transformers: a module per layer type
        self.cos: torch.Tensor | None = None
        self.sin: torch.Tensor | None = None
        # ``tables``' flat copies, per token count
        self._flat: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        # whether the tables are the same bits on every machine (``_exact_tables``)
        self.exact = rotary is None
        if rotary is None:
            return
        buffer = getattr(rotary, "inv_freq", None)
        dtype = buffer.dtype if isinstance(buffer, torch.Tensor) else torch.float32
        tables = _exact_tables(text_config(model), layer_type, seq, start, head_dim, dtype)
        if tables is not None:
            self.cos, self.sin = tables
            self.exact = True
            return
        positions = torch.arange(start, start + seq)[None, :]
        args: tuple[Any, ...] = (torch.zeros(1, dtype=torch.float32), positions)
        if "layer_type" in inspect.signature(rotary.forward).parameters:
            args = (*args, layer_type if layer_type is not None else "full_attention")
        with torch.no_grad():
            cos, sin = rotary(*args)
        if cos.shape[-1] != head_dim:
            return
        scale = float(getattr(rotary, "attention_scaling", 1.0)) or 1.0
        self.cos = (cos.float() / scale)[:, None]  # [1, 1, seq, head_dim]
        self.sin = (sin.float() / scale)[:, None]

    @staticmethod
    def _half(x: torch.Tensor) -> torch.Tensor:
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), dim=-1)

    def _last(self, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The tables of the last ``n`` positions."""
        assert self.cos is not None and self.sin is not None
        if n == self.cos.shape[2]:
            return self.cos, self.sin
        return self.cos[:, :, -n:], self.sin[:, :, -n:]

    def tokens(self, lo: int, hi: int) -> Rope:
        """This rotation over positions ``lo:hi`` of its own (the same tables, sliced: the
        same bits)."""
        part = Rope.__new__(Rope)
        part.exact, part._flat = self.exact, {}
        part.cos = None if self.cos is None else self.cos[:, :, lo:hi].contiguous()
        part.sin = None if self.sin is None else self.sin[:, :, lo:hi].contiguous()
        return part

    def tables(self, n: int) -> tuple[np.ndarray, np.ndarray] | None:
        """``cos`` and ``sin`` of the last ``n`` positions (what ``unrope`` of ``n`` tokens
        reads), each ``n x head_dim`` flat float32; None without a rotation."""
        if self.cos is None or self.sin is None:
            return None
        got = self._flat.get(n)
        if got is None:
            cos, sin = self._last(n)
            got = self._flat[n] = (cos.contiguous().reshape(-1).numpy(), sin.contiguous().reshape(-1).numpy())
        return got

    def unrope(self, k: torch.Tensor) -> torch.Tensor:
        if self.cos is None or self.sin is None:
            return k
        cos, sin = self._last(k.shape[2])
        return k * cos - self._half(k) * sin

    def rope(self, u: torch.Tensor) -> torch.Tensor:
        if self.cos is None or self.sin is None:
            return u
        cos, sin = self._last(u.shape[2])
        return u * cos + self._half(u) * sin


def _rope_parameters(config: Any, layer_type: str | None) -> dict[str, Any] | None:
    """The RoPE parameters of a layer type (``rope_type``, ``rope_theta``, ``factor``...), from
    transformers 5's ``rope_parameters`` (per layer type where the model has several) or 4's
    ``rope_theta`` / ``rope_scaling``."""
    params = getattr(config, "rope_parameters", None)
    if isinstance(params, dict):
        if "rope_theta" not in params and "rope_type" not in params:
            params = params.get(layer_type or "full_attention")
        return dict(params) if isinstance(params, dict) else None
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        return None
    scaling = getattr(config, "rope_scaling", None) or {}
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    return {"rope_theta": theta, **scaling, "rope_type": kind}


def _exact_tables(
    config: Any, layer_type: str | None, seq: int, start: int, head_dim: int, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """cos and sin of RoPE (``[1, 1, seq, head_dim]``, float32) computed in float64 with
    Python's correctly rounded ``math`` functions, then rounded once: the same bits on every
    machine, unlike torch's float32 tables (its ``pow``, ``cos`` and ``sin`` kernels differ
    between SIMD widths), which the maps' features must not depend on (the decoder on
    another machine has to rebuild the encoder's prediction). For the plain and linearly
    scaled RoPE that covers the whole head; ``None`` for any other kind (the model's own
    tables are used then). ``dtype``: the model's inverse frequencies' (a model cast to
    bfloat16 as a whole rotates by bfloat16 frequencies: they are rounded to it first, as
    the model's are, correctly rounded from float64 here)."""
    params = _rope_parameters(config, layer_type)
    if params is None or params.get("rope_type", "default") not in ("default", "linear"):
        return None
    if float(params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)) or 1.0) != 1.0:
        return None
    theta = float(params["rope_theta"])
    factor = float(params.get("factor", 1.0)) if params.get("rope_type") == "linear" else 1.0
    key = (theta, factor, head_dim, str(dtype))
    cos, sin = _TABLES.get(key, (torch.zeros(0, head_dim), torch.zeros(0, head_dim)))
    if cos.shape[0] < start + seq:  # extend the cached tables (a prompt's blocks reuse them)
        half = head_dim // 2
        inv = [1.0 / (theta ** (2 * i / head_dim)) / factor for i in range(half)]
        if dtype != torch.float32:  # a float32 model's: float64 is closer to its rotation
            inv = torch.tensor(inv, dtype=torch.float64).to(dtype).double().tolist()
        grow = range(cos.shape[0], max(start + seq, 2 * cos.shape[0]))
        c = torch.tensor([[math.cos(p * f) for f in inv] for p in grow], dtype=torch.float64).float()
        s_ = torch.tensor([[math.sin(p * f) for f in inv] for p in grow], dtype=torch.float64).float()
        cos = torch.cat([cos, torch.cat([c, c], dim=-1)])
        sin = torch.cat([sin, torch.cat([s_, s_], dim=-1)])
        _TABLES[key] = (cos, sin)
    return cos[start : start + seq][None, None], sin[start : start + seq][None, None]


# (theta, linear factor, head_dim, frequencies' dtype) -> cos, sin of positions 0.. (``_exact_tables``)
_TABLES: dict[tuple[float, float, int, str], tuple[torch.Tensor, torch.Tensor]] = {}


class Ropes:
    """Each layer's ``Rope`` (one per layer type, made on first use) over ``seq`` positions
    from ``start``."""

    def __init__(self, model: Any, seq: int, head_dim: int, start: int = 0, types: list[str] | None = None) -> None:
        self.model, self.seq, self.head_dim, self.start = model, seq, head_dim, start
        self.types = layer_types(text_config(model)) if types is None else types
        self._made: dict[str, Rope] = {}
        # ``tokens``: the Ropes whose tables these slice, and the positions
        self._whole: Ropes | None = None
        self._span: tuple[int, int] | None = None

    def of(self, layer: int) -> Rope:
        kind = self.types[layer] if layer < len(self.types) else "full_attention"
        if kind not in self._made:
            made = self._whole.of(layer) if self._whole is not None else None
            if made is not None and self._span is not None:
                self._made[kind] = made.tokens(*self._span)
            else:
                self._made[kind] = Rope(self.model, self.seq, self.head_dim, self.start, kind)
        return self._made[kind]

    def tokens(self, lo: int, hi: int) -> Ropes:
        """These rotations over positions ``lo:hi`` of their own: each layer type's tables
        the whole range's, sliced (``Rope.tokens``; the same bits)."""
        part = Ropes(self.model, hi - lo, self.head_dim, self.start + lo, types=self.types)
        part._whole, part._span = self, (lo, hi)
        return part
