"""vLLM's GPU paged layouts (FlashAttention, FlashInfer, Triton; every ``KVCacheLayout``) read
and written by ``speckv.integrations.paged``, on CPU tensors that the installed vLLM's own code
lays out: ``tests/paged_gpu_cases.py`` (hypothesis) run inside the vLLM virtualenv, where vLLM
is importable. Skips with the reason where that virtualenv is missing, as ``test_vllm`` does;
nothing here needs a GPU (the GPU half of issue 37 runs on a lent machine: ``cuda/``)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
from vllm_engine import vllm_python  # noqa: E402

from helpers import pytest_elsewhere  # noqa: E402

TESTS = Path(__file__).resolve().parents[1]


def test_every_gpu_layout_of_the_installed_vllm_round_trips_bit_for_bit():
    pytest_elsewhere(vllm_python(), TESTS / "paged_gpu_cases.py")


def test_the_gpu_paged_benchmark_runs_on_the_host(tmp_path):
    """``benches/bench_paged_gpu.py`` whole (every layout and dtype of the exported file checked
    bit for bit, the bandwidth table), small, on CPU tensors: a GPU run (scarce) must not be
    the first to execute it."""
    import importlib.util
    import json

    path = TESTS.parent / "benches" / "bench_paged_gpu.py"
    spec = importlib.util.spec_from_file_location("bench_paged_gpu", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = bench.main(
        ["--device", "cpu", "--geometry", "demo", "--request-blocks", "3", "--json", str(tmp_path / "o.json")]
    )
    layouts = json.loads(bench.LAYOUTS.read_text())["layouts"]
    demo = [c for c in layouts if c["geometry"] == "demo"]
    assert len(out["checked"]) == len(demo) == 18  # 6 layouts x bf16, fp16, fp8
    assert len(out["bandwidth"]) == 12 and all(b["copy_blocks_gb_s"] > 0 for b in out["bandwidth"].values())
    assert json.loads((tmp_path / "o.json").read_text())["geometry"] == "demo"
