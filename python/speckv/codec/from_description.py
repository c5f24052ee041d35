"""The built-in predictor a description names (as ``describe()`` records it in calibrations
and containers): how ``SpeculativeCodec.load`` and the engine connector rebuild the predictor
a calibration was made with."""

from __future__ import annotations

from typing import Any

import torch

from ..predictors.base import AnyPredictor, ChannelStatsPredictor, Fp8Predictor
from ..predictors.calibration import CalibrationMismatchError
from ..predictors.early_exit import PREFILL_CHUNK, ModelPrefixPredictor


def predictor_from_description(model: Any, description: dict[str, Any]) -> AnyPredictor:
    """The built-in predictor whose ``describe()`` is ``description`` (as recorded in
    calibrations and streams); ``CalibrationMismatchError`` for others."""
    name = description.get("name")
    if name == "model-prefix":
        chunk = int(description.get("prefill_chunk", PREFILL_CHUNK))
        return ModelPrefixPredictor(
            model,
            int(description["layers"]),
            threads=int(description["threads"]),
            prefill_chunk=chunk,
            hidden="hidden" in description,
        )
    if name == "fp8":
        scale = str(description.get("scale", ""))
        block = None if scale.startswith("per-tensor") else int(scale.split("x")[0])
        threads = description.get("threads", 1)
        dtype = getattr(torch, str(description.get("compute_dtype", "float32")))
        # made on a GPU: on one here if there is one, else on the CPU (the prediction
        # fingerprint then says whether the bits agree)
        device = "cuda" if "device" in description and torch.cuda.is_available() else None
        threads = "all" if threads == "any" else int(threads)
        return Fp8Predictor(model, block_size=block, threads=threads, dtype=dtype, device=device)
    if name == "channel-stats":
        return ChannelStatsPredictor()  # its means come from the calibration's state
    raise CalibrationMismatchError(f"the calibration's predictor {description} is not built in: pass predictor=")
