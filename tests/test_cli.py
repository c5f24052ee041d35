"""The command line: bench and info run without the hf extra; demo needs the demo model."""

from __future__ import annotations

import json
import subprocess
import sys

import ml_dtypes
import numpy as np

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
