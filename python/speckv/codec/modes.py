"""Storage modes: the dtype each mode stores a cache in, the joint model each reads, and fp8's
dequantisation (what attention reads from an fp8 cache)."""

from __future__ import annotations

import torch

MODES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp8": torch.float8_e4m3fn}


def joint_key(mode: str) -> str:
    """The calibration's joint model for a storage mode: fp8's own; the 16-bit modes share
    bf16's (fp16 values differ from bf16's by less than the residuals)."""
    return "fp8" if mode == "fp8" else "bf16"


def dequantize(k: torch.Tensor, v: torch.Tensor, k_scale: float, v_scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8 values times their scale, in bfloat16 (what attention reads from a vLLM fp8 cache)."""
    return (k.float() * k_scale).to(torch.bfloat16), (v.float() * v_scale).to(torch.bfloat16)
