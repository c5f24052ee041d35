"""What the vLLM engine tests share (``test_vllm``, ``test_vllm_workloads``, and the modules
that run their cases in the vLLM virtualenv): where that virtualenv is, the fixtures that
start an engine (registered for every module by ``conftest``), and readers of a run's records.
Imports neither torch nor vLLM at module level: ``conftest`` imports it in every virtualenv."""

from __future__ import annotations

import functools
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from helpers import made_once

HERE = Path(__file__).parent
VLLM_PYTHON = os.environ.get("SPECKV_VLLM_PYTHON", str(Path.home() / ".cache/speckv-vllm-venv/bin/python"))
BLOCK = 128  # vLLM's CPU block size


@functools.cache
def vllm_python() -> str:
    if not Path(VLLM_PYTHON).exists():
        pytest.skip(f"no vLLM virtualenv at {VLLM_PYTHON} (.ci/vllm-venv builds one; SPECKV_VLLM_PYTHON names another)")
    probe = subprocess.run(
        [VLLM_PYTHON, "-c", "import vllm, speckv.integrations.engine"], capture_output=True, text=True
    )
    if probe.returncode != 0:
        pytest.skip(f"the vLLM virtualenv cannot import vllm and speckv: {probe.stderr.strip().splitlines()[-1:]}")
    return VLLM_PYTHON


@pytest.fixture(scope="session")
def vllm_calibration(tmp_path_factory, demo_folder) -> Path:
    """A ``map`` calibration of the demo model, made once per test run in the engine's
    virtualenv (its torch is the one that runs the predictor) and shared by the pytest-xdist
    workers; on two short samples (the tests check exactness, not bits; on one the fit is
    degenerate and the blocks grow past raw)."""
    from vllm_driver import engine_env  # imported where used: it sets vLLM's variables on import

    python = vllm_python()

    def calibrate(out: Path) -> None:
        argv = ["calibrate", "--model", str(demo_folder), "--predictor", "map", "--fp8-scale", "1.0"]
        argv += ["--samples", "2", "--seq-len", "128", "-o", str(out), "--json"]
        subprocess.run(
            [python, "-m", "speckv.cli", *argv], check=True, capture_output=True, env=engine_env(str(HERE)), timeout=900
        )

    return made_once(tmp_path_factory, "vllm-map-calibration.safetensors", calibrate)


@pytest.fixture(scope="module")
def engine(tmp_path_factory, demo_folder, vllm_calibration):
    """The module's engine: its runs forked by an engine host (``vllm_driver.EngineHost``)."""
    from transformers import AutoTokenizer
    from vllm_driver import Engine, EngineHost

    from speckv.models.demo import bundled_text

    python = vllm_python()
    tmp = tmp_path_factory.mktemp("vllm")
    host = EngineHost(python, str(tmp / "host.log"))
    try:
        ids = AutoTokenizer.from_pretrained(str(demo_folder)).encode(bundled_text("evaluation"))
        shared = ids[: 2 * BLOCK]
        prompts = [shared + ids[3000 + 200 * i : 3000 + 200 * i + 60] for i in range(3)]
        # a smaller batch than vLLM's default: each start's warm-up pass is sized by it
        yield Engine(python, str(demo_folder), str(vllm_calibration), prompts, str(tmp), host=host, batch_tokens=1024)
    finally:
        host.close()


def speckv_lines(run) -> str:
    """What the connector logged in a run (its faults say why a block was not served)."""
    return "\n".join(line for line in run.get("log", "").splitlines() if "speckv" in line)[-3000:]


def records(run, kind: str) -> dict[str, dict[int, tuple[Any, Any]]]:
    import torch

    folder = run["record"]
    if not folder.exists():
        return {}
    return {p.stem.split("-", 1)[1]: torch.load(p) for p in sorted(folder.glob(f"{kind}-*.pt"))}


def swap_payloads(a: Path, b: Path) -> None:
    """Each entry's payload framed for the other's key: entries that pass every frame check
    (so matching accepts them) but hold another block's cache."""
    from speckv.store import pack_entry, unpack_entry

    pa, pb = unpack_entry(a.read_bytes(), a.stem), unpack_entry(b.read_bytes(), b.stem)
    a.write_bytes(pack_entry(pb, a.stem))
    b.write_bytes(pack_entry(pa, b.stem))
