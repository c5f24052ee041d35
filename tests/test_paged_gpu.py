"""vLLM's GPU paged layouts (FlashAttention, FlashInfer, Triton; every ``KVCacheLayout``) read
and written by ``speckv.integrations.paged``, on CPU tensors that the installed vLLM's own code
lays out: ``tests/paged_gpu_cases.py`` (hypothesis) run inside the vLLM virtualenv, where vLLM
is importable. Skips with the reason where that virtualenv is missing, as ``test_vllm`` does;
nothing here needs a GPU (the GPU half of issue 37 runs on a lent machine: ``cuda/``)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
from test_vllm import _vllm_python  # noqa: E402

HERE = Path(__file__).parent


def test_every_gpu_layout_of_the_installed_vllm_round_trips_bit_for_bit():
    python = _vllm_python()
    run = subprocess.run(
        [python, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(HERE / "paged_gpu_cases.py")],
        capture_output=True,
        text=True,
        cwd=HERE.parent,
        timeout=1200,
    )
    tail = run.stdout[-4000:] + run.stderr[-2000:]
    assert run.returncode == 0, tail
    assert " passed" in run.stdout and "skipped" not in run.stdout, tail
