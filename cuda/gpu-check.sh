#!/usr/bin/env bash
# The CUDA module's device check (issue 10), one prepared run on a GPU machine: the GPU tests,
# then the benchmark, results under $OUT. The extension comes as a wheel built here for the
# GPU machine's Python (3.12 there), carried in .whl/ (kept out of git by .git/info/exclude):
#
#   .ci/build-wheel .whl   (abi3: any CPython 3.9+, the GPU machine's 3.12 too)
#   device run, carry [".whl"]: bash cuda/gpu-check.sh
set -uo pipefail
OUT="${OUT:-/tmp/speckv-gpu-check}"
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/speckv_rs-*.whl || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 SPECKV_CACHE_DIR=/tmp/speckv-cache
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
python3 -c "import speckv.cuda as c; print('available:', c.available(), 'sources', c.source_digest())" 2>&1 | tee "$OUT/env.txt"
# SPECKV_REQUIRE=cuda: a test that would skip for want of the device fails instead
(cd tests && SPECKV_REQUIRE=cuda timeout 240 python3 -m pytest -q -rs -p no:cacheprovider --durations=8 cuda) 2>&1 | tee "$OUT/tests.txt"
timeout 150 python3 benches/bench_cuda.py --json "$OUT/bench_cuda.json" 2>&1 | tee "$OUT/bench.txt"
# vLLM's GPU paged layouts on CUDA tensors (issue 37): every layout and dtype read, written and
# round-tripped exactly, and the device<->host copies of a request's blocks against pinned copies
timeout 90 python3 benches/bench_paged_gpu.py --json "$OUT/bench_paged_gpu.json" 2>&1 | tee "$OUT/paged.txt"
# speckv's secondary tier under a GPU engine (benches/gpu_tier_check.py): vLLM's
# OffloadingConnector + TieringOffloadingSpec + SpeckvTier, the same prompt twice with the
# prefix cache reset between, outputs equal to an engine without the connector. Needs vLLM
# (a GPU build) on the machine and a model folder (SPECKV_GPU_MODEL); says why where either
# is missing.
if [ -n "${SPECKV_GPU_MODEL:-}" ]; then
    python3 benches/gpu_tier_check.py --model "$SPECKV_GPU_MODEL" --json "$OUT/gpu_tier.json" 2>&1 | tail -n 40 | tee "$OUT/gpu_tier.txt"
else
    echo "skipped: SPECKV_GPU_MODEL (a transformers folder, e.g. speckv export smollm2-hf) is not set" | tee "$OUT/gpu_tier.txt"
fi
