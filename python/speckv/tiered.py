"""Moved to ``speckv.store.tiered`` (every backend in ``speckv.store``); this path imports it,
with a ``DeprecationWarning``, until the release after 0.1."""

from __future__ import annotations

import warnings

from .store.tiered import TieredBackend

warnings.warn(
    "speckv.tiered moved to speckv.store.tiered (the old path goes after 0.1)", DeprecationWarning, stacklevel=2
)

__all__ = ["TieredBackend"]
