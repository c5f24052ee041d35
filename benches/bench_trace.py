"""Replays a production request trace through vLLM's own tiered offloading manager (a CPU
primary tier, then one secondary tier) at a sweep of secondary-tier budgets: speckv's tier
against a raw in-memory tier of the same bytes (the same class, eviction and keys, no codec)
and vLLM's own ``fs`` tier (raw files, no budget: the unbounded reference).

    python benches/bench_trace.py                        # Mooncake's conversation trace, 2,000 requests
    python benches/bench_trace.py --requests 500 --budgets 1000,4000 --tiers speckv,raw

Runs in the vLLM virtualenv (``.ci/vllm-venv``): ``$(.ci/vllm-venv) benches/bench_trace.py``.

The trace (``--trace``, any file in the Mooncake format: one JSON object a line with
``timestamp``, ``input_length`` and ``hash_ids``, 512-token prefix blocks) names blocks by
hash id and carries no tokens, so each id gets a real payload: the KV of one layer of one
512-token block of the demo model's cache of the bundled texts (``--windows`` windows x every
layer = the pool), picked by a hash of the id, so that coded sizes and decode times are real.
A payload is one layer of a block (``kv bytes per token / layers`` of it): budgets and stored
bytes are those payloads', and the sweep's budgets are in raw payloads (``--budgets``).

Requests are replayed in arrival order, as vLLM's scheduler drives the manager
(``benches/tiering_driver.py``): the longest prefix found in the primary or the secondary tier
is loaded, the rest is computed and stored (cascaded to the secondary tier); every store
finishes before the next request (hits do not depend on timing). Per row: blocks resident,
prompt tokens served from each tier, the tier's decode seconds per block measured here,
bytes read, and a TTFT modelled for a GPU server from the stated assumptions (printed; flags):
computed tokens at a prefill throughput, loaded tokens' KV over PCIe, plus for speckv their
decoding at the per-core speed measured here on ``--decode-cores`` host cores, for ``fs``
their reading at an NVMe bandwidth.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import machine  # noqa: E402

TRACE = HERE.parent.parent / "shared" / "traces" / "mooncake_conversation_trace.jsonl"
BLOCK_TOKENS = 512
# the modelled GPU server: Llama-3.1-8B (32 layers, 8 KV heads of 128, bf16) on one H100
ASSUMPTIONS = {
    "prefill_tokens_per_s": 12000.0,
    "kv_bytes_per_token": 32 * 2 * 8 * 128 * 2,
    "pcie_gb_s": 25.0,
    "nvme_gb_s": 7.0,
    "decode_cores": 8,
}


def payload_pool(windows: int) -> list[np.ndarray]:
    """Real payloads: for each of ``windows`` 512-token windows of the bundled texts, the demo
    model's K and V of each layer, ``[2, heads, 512, dim]`` bf16 bits."""
    import torch

    from speckv.models.cache import prefill
    from speckv.models.demo import bundled_text, load_demo_model, prompts

    model, tokenizer = load_demo_model()
    ids = prompts(tokenizer, bundled_text("evaluation") + bundled_text("legal"), BLOCK_TOKENS, count=windows)
    pool = []
    for window in ids:
        for k, v in prefill(model, window):
            pool.append(torch.stack([k[0], v[0]]).contiguous().view(torch.int16).numpy().view(np.uint8).reshape(-1))
    return pool


def pick(block_id: int, size: int) -> int:
    """The pool payload of a hash id (deterministic)."""
    return int.from_bytes(hashlib.blake2b(block_id.to_bytes(8, "little"), digest_size=8).digest(), "little") % size


def replay(requests: list[dict[str, Any]], pool: list[np.ndarray], tier: dict[str, Any] | None, args: Any) -> dict:
    """One run: the trace through a primary of ``--primary`` payloads and ``tier``."""
    from tiering_driver import TieringDriver, offload_key

    block_bytes = pool[0].nbytes
    tiers = [] if tier is None else [tier]
    driver = TieringDriver(tiers, cpu_chunks=args.primary, block_bytes=block_bytes)
    from vllm.v1.kv_offload.base import LookupResult, ReqContext

    probe = ReqContext(req_id="probe")
    served = {"primary": 0, "secondary": 0}
    total = 0
    ttft = []
    bytes_secondary = 0
    load_s = 0.0
    loaded = 0
    progress = _progress(len(requests), tier["type"] if tier else "primary only", args)
    for req in requests:
        keys = [offload_key(h) for h in req["hash_ids"]]
        length = int(req["input_length"])
        total += length
        in_primary = [driver.manager.primary_tier.lookup(k, probe) is LookupResult.HIT for k in keys]
        t0 = time.perf_counter()
        ready, _ = driver.lookup(keys)
        rows = driver.load(keys[:ready])
        wall = time.perf_counter() - t0
        for key, row in zip(keys[:ready], rows):
            want = pool[pick(int.from_bytes(bytes(key)[:8], "little"), len(pool))]
            if not np.array_equal(row[: want.nbytes], want):
                raise AssertionError(f"block {int.from_bytes(bytes(key)[:8], 'little')}: not the stored bytes")
        from_primary = sum(1 for k, p in zip(range(ready), in_primary) if p)
        from_secondary = ready - from_primary
        if from_secondary:
            load_s += wall
            loaded += from_secondary
        tokens_p = min(from_primary * BLOCK_TOKENS, length)
        tokens_s = min(ready * BLOCK_TOKENS, length) - tokens_p
        served["primary"] += tokens_p
        served["secondary"] += tokens_s
        ttft.append((length - tokens_p - tokens_s, tokens_p, tokens_s))
        new = keys[ready:]
        driver.store(new, [pool[pick(h, len(pool))] for h in req["hash_ids"][ready:]])
        driver.settle()
        progress.update(1)
    progress.close()
    out: dict[str, Any] = {
        "tokens": total,
        "served_primary": served["primary"],
        "served_secondary": served["secondary"],
        "served_fraction": (served["primary"] + served["secondary"]) / total,
        "ttft_parts": ttft,
        "secondary_load_wall_s_per_block": load_s / loaded if loaded else None,
    }
    if tier is not None and tier["type"] == "SpeckvTier":
        c = driver.tiers[0].jobs.counters()
        out.update(
            resident_blocks=_resident(driver),
            resident_bytes=c.get("resident_bytes"),
            chunks_loaded=c["chunks_loaded"],
            bytes_read=c["bytes_loaded"],
            decode_s_per_block=c["decode_seconds"] / c["chunks_loaded"] if c["chunks_loaded"] else None,
            load_s_per_block=c["load_seconds"] / c["chunks_loaded"] if c["chunks_loaded"] else None,
            coded_over_raw=c["coded_bytes_stored"] / c["raw_bytes_stored"] if c["raw_bytes_stored"] else None,
            evictions=c["evictions"],
            faults=c["faults"],
        )
        bytes_secondary = c["bytes_loaded"]
    out["bytes_read"] = out.get("bytes_read", bytes_secondary)
    driver.shutdown()
    return out


def _resident(driver: Any) -> int:
    return len(driver.tiers[0].jobs.backend.keys())


def modelled_ttft(parts: list[tuple[int, int, int]], kind: str, decode_s_per_byte: float | None, a: dict) -> float:
    """Mean TTFT (s) of the modelled server (module docs) over the requests' (computed,
    primary, secondary) tokens."""
    per_token = a["kv_bytes_per_token"]
    pcie = a["pcie_gb_s"] * 1e9
    if kind == "SpeckvTier" and decode_s_per_byte is not None:
        secondary = 1 / pcie + decode_s_per_byte / a["decode_cores"]
    elif kind == "fs":
        secondary = 1 / pcie + 1 / (a["nvme_gb_s"] * 1e9)
    else:
        secondary = 1 / pcie
    times = [c / a["prefill_tokens_per_s"] + p * per_token / pcie + s * per_token * secondary for c, p, s in parts]
    return float(np.mean(times))


def _progress(total: int, what: str, args: Any) -> Any:
    try:
        from tqdm import tqdm

        return tqdm(total=total, desc=what, unit="req", disable=args.quiet, mininterval=2.0)
    except ImportError:  # pragma: no cover

        class Quiet:
            def update(self, n: int) -> None: ...
            def close(self) -> None: ...

        return Quiet()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", type=Path, default=TRACE, help="a trace in Mooncake's format (default: %(default)s)")
    p.add_argument("--requests", type=int, default=2000, help="first N requests of the trace (default 2000)")
    p.add_argument("--budgets", default="1000,2000,3500,5000,8000", help="secondary budgets, in raw payloads")
    p.add_argument("--tiers", default="speckv,raw,fs", help="of speckv, raw, fs (default: all three)")
    p.add_argument("--primary", type=int, default=300, help="the CPU primary's size in payloads (default 300)")
    p.add_argument("--windows", type=int, default=4, help="512-token windows of real KV in the pool (x layers)")
    p.add_argument("--workers", type=int, default=2, help="the speckv tier's threads (default 2)")
    for key, value in ASSUMPTIONS.items():
        p.add_argument("--" + key.replace("_", "-"), type=type(value), default=value, help=f"assumed (default {value})")
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--plot", type=Path, help="write a PNG of tokens served and modelled TTFT by budget (matplotlib)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--plot-only", type=Path, metavar="JSON", help="only plot a run's JSON (to --plot), no vLLM needed")
    p.add_argument("--markdown", type=Path, metavar="JSON", help="only print a run's JSON as the docs' Markdown table")
    args = p.parse_args(argv)
    if args.plot_only or args.markdown:
        out = json.loads((args.plot_only or args.markdown).read_text())
        if args.markdown:
            print(markdown_table(out), end="")
        else:
            plot(out, args.plot or args.plot_only.with_suffix(".png"))
        return out
    from tiering_driver import SPECKV_TIER

    assumptions = {k: getattr(args, k) for k in ASSUMPTIONS}
    with open(args.trace) as f:
        requests = [json.loads(line) for _, line in zip(range(args.requests), f)]
    print(f"{machine.line()}\ntrace {args.trace.name}: {len(requests)} requests; assumptions: {assumptions}")
    t0 = time.perf_counter()
    pool = payload_pool(args.windows)
    raw_bytes = pool[0].nbytes
    print(
        f"pool: {len(pool)} real payloads of {raw_bytes} bytes (one layer of a 512-token block), "
        f"{time.perf_counter() - t0:.0f} s"
    )
    tiers = args.tiers.split(",")
    budgets = [int(b) for b in args.budgets.split(",")]
    entry = raw_bytes + 40  # a raw entry: the payload, the chunk header (16) and the entry frame (24)
    rows: list[dict[str, Any]] = []
    base = replay(requests, pool, None, args)
    no_tier = modelled_ttft(base["ttft_parts"], "none", None, assumptions)
    rows.append({"tier": "none", "budget_payloads": 0, **_summary(base, no_tier, no_tier)})
    decode_s_per_byte = None
    for budget in budgets:
        for kind in [t for t in tiers if t in ("speckv", "raw")]:
            codec = "fast" if kind == "speckv" else "none"
            tier = {
                **SPECKV_TIER,
                "store": "memory",
                "max_bytes": budget * entry,
                "codec": codec,
                "workers": args.workers,
            }
            result = replay(requests, pool, tier, args)
            if kind == "speckv" and result["decode_s_per_block"]:
                decode_s_per_byte = result["decode_s_per_block"] / raw_bytes
            ttft = modelled_ttft(
                result["ttft_parts"], "SpeckvTier" if kind == "speckv" else "raw", decode_s_per_byte, assumptions
            )
            rows.append(
                {
                    "tier": kind,
                    "budget_payloads": budget,
                    "budget_bytes": budget * entry,
                    **_summary(result, ttft, no_tier),
                }
            )
            _print_row(rows[-1])
    if "fs" in tiers:
        with tempfile.TemporaryDirectory(prefix="speckv-trace-fs-") as root:
            result = replay(
                requests, pool, {"type": "fs", "root_dir": root, "n_read_threads": 2, "n_write_threads": 2}, args
            )
            ttft = modelled_ttft(result["ttft_parts"], "fs", None, assumptions)
            rows.append({"tier": "fs", "budget_payloads": None, **_summary(result, ttft, no_tier)})
            _print_row(rows[-1])
    out = {
        "machine": machine.describe(),
        "date": time.strftime("%Y-%m-%d"),
        "trace": args.trace.name,
        "requests": len(requests),
        "payload_bytes": raw_bytes,
        "pool": len(pool),
        "primary_payloads": args.primary,
        "assumptions": assumptions,
        "decode_s_per_byte_per_core": decode_s_per_byte,
        "rows": rows,
    }
    _print_table(out)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    if args.plot:
        plot(out, args.plot)
    return out


def _summary(result: dict[str, Any], ttft: float, no_tier: float) -> dict[str, Any]:
    keep = {k: v for k, v in result.items() if k != "ttft_parts"}
    return {**keep, "modelled_ttft_s": ttft, "ttft_vs_no_tier": ttft / no_tier}


def _print_row(row: dict[str, Any]) -> None:
    print(
        f"  {row['tier']:>6} budget {row['budget_payloads']}: served {row['served_fraction']:.3%} "
        f"(secondary {row['served_secondary']} tokens), modelled TTFT {row['ttft_vs_no_tier']:.3f}x no tier"
    )


def _print_table(out: dict[str, Any]) -> None:
    print("\ntier    budget  resident  served   from 2nd   decode us/blk  load us/blk  TTFT vs none")
    for r in out["rows"]:
        dec = r.get("decode_s_per_block")
        load = r.get("load_s_per_block") or r.get("secondary_load_wall_s_per_block")
        print(
            f"{r['tier']:<6} {r['budget_payloads'] or '-':>7} {r.get('resident_blocks', '-'):>9} "
            f"{r['served_fraction']:7.2%} {r['served_secondary']:>10} "
            f"{dec * 1e6 if dec else float('nan'):>14.0f} {load * 1e6 if load else float('nan'):>12.0f} "
            f"{r['ttft_vs_no_tier']:>13.3f}"
        )
    raw = {r["budget_payloads"]: r for r in out["rows"] if r["tier"] == "raw"}
    for r in out["rows"]:
        if r["tier"] == "speckv" and r["budget_payloads"] in raw:
            other = raw[r["budget_payloads"]]
            gain = r["served_secondary"] / other["served_secondary"] if other["served_secondary"] else float("inf")
            print(f"budget {r['budget_payloads']}: speckv serves {gain:.2f}x the raw tier's secondary tokens")


def markdown_table(out: dict[str, Any]) -> str:
    """The run's rows as the Markdown table of docs/benchmarks/trace.md (a test renders it
    from the committed JSON and compares)."""
    lines = [
        "| tier | budget (raw payloads) | blocks held | prompt tokens served | from the secondary tier "
        "| vs raw, from the tier | vs raw, all served | load per block | modelled TTFT vs no tier |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    raw = {r["budget_payloads"]: r for r in out["rows"] if r["tier"] == "raw"}
    for r in out["rows"]:
        other = raw.get(r["budget_payloads"]) if r["tier"] == "speckv" else None
        tier_gain = f"{r['served_secondary'] / other['served_secondary']:.2f}x" if other else ""
        all_gain = f"{r['served_fraction'] / other['served_fraction']:.2f}x" if other else ""
        load = r.get("load_s_per_block") or r.get("secondary_load_wall_s_per_block")
        held = r.get("resident_blocks")
        lines.append(
            f"| {r['tier']} | {r['budget_payloads'] or '-'} | {held if held is not None else '-'} "
            f"| {r['served_fraction']:.2%} | {r['served_secondary'] / r['tokens']:.2%} | {tier_gain} | {all_gain} "
            f"| {f'{load * 1e6:.0f} us' if load else '-'} | {r['ttft_vs_no_tier']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def plot(out: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for kind in ("speckv", "raw"):
        rows = [r for r in out["rows"] if r["tier"] == kind]
        budgets = [r["budget_payloads"] for r in rows]
        ax1.plot(budgets, [r["served_fraction"] * 100 for r in rows], marker="o", label=kind)
        ax2.plot(budgets, [r["ttft_vs_no_tier"] for r in rows], marker="o", label=kind)
    for r in out["rows"]:
        if r["tier"] == "fs":
            ax1.axhline(r["served_fraction"] * 100, ls="--", color="grey", label="fs (unbounded)")
    ax1.set(xlabel="secondary budget (raw payloads)", ylabel="prompt tokens served (%)")
    ax2.set(xlabel="secondary budget (raw payloads)", ylabel="modelled TTFT / no tier")
    ax1.legend()
    ax2.legend()
    fig.suptitle(f"{out['trace']}, {out['requests']} requests; {out['machine']['cpu']}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
