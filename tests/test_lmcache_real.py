"""The LMCache serde against LMCache's own classes: ``tests/test_lmcache.py`` run in the LMCache
virtualenv (``.ci/lmcache-venv``: LMCache 0.5.6 and its pins, apart from the core's and vLLM's
virtualenvs), where none of its tests may skip. Skips with the reason where that virtualenv is
missing (``SPECKV_LMCACHE_PYTHON`` names another)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

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
    run = subprocess.run(
        [LMCACHE_PYTHON, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(HERE / "test_lmcache.py")],
        capture_output=True,
        text=True,
        cwd=HERE.parent,
        timeout=1200,
    )
    tail = run.stdout[-4000:] + run.stderr[-2000:]
    assert run.returncode == 0, tail
    assert " passed" in run.stdout and "skipped" not in run.stdout, tail
