"""The LMCache serde against LMCache's own classes: ``tests/integrations/test_lmcache.py`` run in the LMCache
virtualenv (``.ci/lmcache-venv``: LMCache 0.5.6 and its pins, apart from the core's and vLLM's
virtualenvs), where none of its tests may skip. Skips with the reason where that virtualenv is
missing (``SPECKV_LMCACHE_PYTHON`` names another)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from helpers import pytest_elsewhere

HERE = Path(__file__).parent
LMCACHE_PYTHON = os.environ.get(
    "SPECKV_LMCACHE_PYTHON", str(Path.home() / ".cache" / "speckv-lmcache-venv" / "bin" / "python")
)


def test_the_serde_in_lmcaches_own_storage_path():
    if not Path(LMCACHE_PYTHON).exists():
        pytest.skip(f"no LMCache virtualenv at {LMCACHE_PYTHON} (.ci/lmcache-venv builds one)")
    probe = subprocess.run(
        [LMCACHE_PYTHON, "-c", "import lmcache, speckv.integrations.lmcache"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        pytest.skip(
            f"the LMCache virtualenv cannot import lmcache and speckv: {probe.stderr.strip().splitlines()[-1:]}"
        )
    pytest_elsewhere(LMCACHE_PYTHON, HERE / "test_lmcache.py")
