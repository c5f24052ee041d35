"""Where speckv keeps what it computes once and reads again: ``cache_dir()``."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """$SPECKV_CACHE_DIR, else $XDG_CACHE_HOME/speckv, else ~/.cache/speckv (not created here)."""
    if os.environ.get("SPECKV_CACHE_DIR"):
        return Path(os.environ["SPECKV_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "speckv"
