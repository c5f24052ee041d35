"""A cache container's identity: what its metadata records (storage mode, model, calibration,
predictor, prompt) and the checks that refuse to decode it with anything else, all made before
any predictor runs."""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from .. import container
from .._speckv import CorruptStreamError
from ..predictors.base import describe
from ..predictors.calibration import Calibration, CalibrationMismatchError
from .modes import MODES


def _digest(data: bytes, size: int = 16) -> str:
    return hashlib.blake2b(data, digest_size=size).hexdigest()


def prompt_digest(input_ids: torch.Tensor) -> str:
    """The digest of a prompt's token ids (and shape) that a container records."""
    ids = input_ids.detach().cpu().to(torch.int64).contiguous()
    return _digest(str(tuple(ids.shape)).encode() + ids.numpy().tobytes())


def metadata(mode: str, fingerprint: str, cal: Calibration, predictor: Any, input_ids: torch.Tensor) -> dict[str, Any]:
    """The identity a container of ``input_ids``' cache stored as ``mode`` records."""
    return {
        "mode": mode,
        "model": fingerprint,
        "calibration": cal.digest(),
        "predictor": describe(predictor),
        "prompt": prompt_digest(input_ids),
    }


def read_header(data: bytes) -> container.Container:
    """Validates the container's header and stream index (``speckv.container.parse``) and its
    storage mode; the streams' payloads are checked as they are decoded."""
    c = container.parse(data)
    mode = c.metadata.get("mode")
    if not isinstance(mode, str) or mode not in MODES:  # JSON: could be a list, unhashable
        raise CorruptStreamError(f"cache container: unknown storage mode {mode!r}")
    return c


def check(header: dict[str, Any], fingerprint: str, cal: Calibration, predictor: Any, input_ids: torch.Tensor) -> None:
    """Refuses a container made with another model, calibration, predictor or prompt
    (``header``: its metadata)."""
    for key, mine, what in (
        ("model", fingerprint, "model"),
        ("calibration", cal.digest(), "calibration"),
        ("prompt", prompt_digest(input_ids), "prompt (input_ids)"),
    ):
        if header.get(key) != mine:
            raise CalibrationMismatchError(f"the stream was made with another {what}")
    if header.get("predictor") != describe(predictor):
        raise CalibrationMismatchError(
            f"the stream was made with predictor {header.get('predictor')}, not {describe(predictor)}"
        )
