"""The speckv tier under a real GPU engine: vLLM (a GPU build) with ``OffloadingConnector``,
``TieringOffloadingSpec`` and ``SpeckvTier`` as its secondary tier, on a small model from a
local folder. The same long prompt runs twice with vLLM's prefix cache reset between them, so
that the second reading comes from the offload tiers; outputs must equal an engine without
the connector, and the tier must have loaded chunks (its counters, read from the engine's
scheduler through vLLM's connector stats).

    python benches/gpu_tier_check.py --model /path/to/hf-folder [--json OUT]

Run by ``cuda/gpu-check.sh`` where a GPU is lent and vLLM is installed there; it exits 0 with
the reason where vLLM or CUDA is missing (nothing here runs on the CPU build: vLLM's GPU worker
refuses it).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="a transformers model folder (no hub access)")
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--store", default="memory", help="the tier's store (default: memory)")
    args = p.parse_args(argv)
    try:
        import torch
        from vllm import LLM, SamplingParams
        from vllm.config import KVTransferConfig
    except ImportError as e:
        print(f"skipped: vLLM is not installed here ({e})")
        return 0
    if not torch.cuda.is_available():
        print("skipped: no CUDA device")
        return 0
    words = (Path(__file__).resolve().parent.parent / "python" / "speckv" / "data" / "legal.txt").read_text()
    prompt = words[:12000] + "\n\nSummarise the text above in one sentence."
    params = SamplingParams(temperature=0.0, max_tokens=32)
    common = {"model": args.model, "gpu_memory_utilization": 0.3, "max_model_len": 8192, "enforce_eager": True}

    plain = LLM(**common)
    want = plain.generate([prompt], params)[0].outputs[0].token_ids
    del plain
    torch.cuda.empty_cache()

    tier = {"type": "SpeckvTier", "module_path": "speckv.integrations.vllm_tier", "store": args.store}
    if args.store == "memory":
        tier["max_bytes"] = "2GB"
    config = KVTransferConfig(
        kv_connector="OffloadingConnector",
        kv_role="kv_both",
        kv_connector_extra_config={
            "spec_name": "TieringOffloadingSpec",
            # a small primary: the prompt's chunks are pushed out of it by the filler below
            "cpu_bytes_to_use": 64 << 20,
            "secondary_tiers": [tier],
        },
    )
    llm = LLM(**common, kv_transfer_config=config)
    first = llm.generate([prompt], params)[0].outputs[0].token_ids
    filler = words[20000:40000]
    llm.generate([filler], params)  # pushes the prompt's chunks out of the 64 MB primary
    llm.reset_prefix_cache()  # the GPU's prefix cache forgets the prompt: the tiers must serve it
    second = llm.generate([prompt], params)[0].outputs[0].token_ids
    stats = {}
    try:  # the scheduler's tier, where it lives in this process (in-process engine core)
        engine = llm.llm_engine.engine_core.engine_core
        manager = engine.scheduler.connector.connector_scheduler.manager
        stats = manager.secondary_tiers[0].jobs.counters()
    except AttributeError as e:
        stats = {"unavailable": str(e)}
    out = {
        "equal_first": list(first) == list(want),
        "equal_second": list(second) == list(want),
        "tier": stats,
        "gpu": torch.cuda.get_device_name(0),
    }
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    loaded = stats.get("chunks_loaded", 0)
    ok = out["equal_first"] and out["equal_second"] and (loaded > 0 or "unavailable" in stats)
    print("PASS" if ok else "FAIL", f"(tier chunks loaded: {loaded})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
