"""speckv's secondary tier inside vLLM's own tiered offloading manager: ``tests/vllm_tier_cases.py``
run in the vLLM virtualenv (``.ci/vllm-venv``), where vLLM is importable; skips with the reason
where that virtualenv is missing, as ``test_vllm`` does. The tier's engine-free half is
``tests/test_tier_jobs.py``."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
from test_vllm import _vllm_python  # noqa: E402

HERE = Path(__file__).parent


def test_the_speckv_tier_in_vllms_tiering_manager():
    python = _vllm_python()
    run = subprocess.run(
        [python, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(HERE / "vllm_tier_cases.py")],
        capture_output=True,
        text=True,
        cwd=HERE.parent,
        timeout=1200,
    )
    tail = run.stdout[-4000:] + run.stderr[-2000:]
    assert run.returncode == 0, tail
    assert " passed" in run.stdout and "skipped" not in run.stdout, tail
