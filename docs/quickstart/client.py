"""The quickstart's client (``serve.sh`` runs it): plain HTTP to vLLM's OpenAI-compatible server.

Sends a long document, then other documents that push it out of vLLM's own (small) cache, then
the first again, each as a greedy completion; after each, reads vLLM's Prometheus endpoint and
prints what served the prompt: vLLM's prefix cache (``vllm:prefix_cache_hits``) or the
connector (``vllm:external_prefix_cache_hits``, speckv's own ``vllm:speckv_tokens_loaded``).
Writes the completions and counters to ``--out``."""

from __future__ import annotations

import argparse
import json
import os
import time
import urllib.request
from importlib.resources import files

COUNTERS = ("vllm:prefix_cache_hits_total", "vllm:external_prefix_cache_hits_total", "vllm:speckv_tokens_loaded_total")


def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


def counters(base: str) -> dict[str, float]:
    """The counters' totals over every label set (0 where the server has none)."""
    out = dict.fromkeys(COUNTERS, 0.0)
    for line in get(f"{base}/metrics").splitlines():
        name = line.split("{")[0].split(" ")[0]
        if name in out:
            out[name] += float(line.rsplit(" ", 1)[1])
    return out


def complete(base: str, model: str, prompt: str) -> str:
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 16, "temperature": 0}).encode()
    req = urllib.request.Request(f"{base}/v1/completions", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())["choices"][0]["text"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--out", default="outputs.json")
    ap.add_argument("--wait", type=float, default=600, help="seconds to wait for the server to start")
    ap.add_argument("--server-pid", type=int, help="the server's process: stop waiting if it dies")
    a = ap.parse_args()
    base = f"http://127.0.0.1:{a.port}"
    deadline = time.monotonic() + a.wait
    while True:
        try:
            get(f"{base}/health")
            break
        except OSError:
            if a.server_pid is not None and not _alive(a.server_pid):
                raise SystemExit("the server stopped while starting (see server.log)") from None
            if time.monotonic() > deadline:
                raise SystemExit(f"no server on {base} after {a.wait:.0f} s (see server.log)") from None
            time.sleep(1)
    model = json.loads(get(f"{base}/v1/models"))["data"][0]["id"]
    text = (files("speckv") / "data" / "evaluation.txt").read_text()
    docs = [text[i * 3000 : (i + 1) * 3000] + "\n\nSummary:" for i in range(3)]
    workload = [(f"document {i + 1}", doc) for i, doc in enumerate(docs)] + [("document 1 again", docs[0])]
    rows = []
    before = counters(base)
    print(f"{'request':<18} {'vLLM cache':>10} {'connector':>10} {'speckv':>8}  (prompt tokens served from each)")
    for name, prompt in workload:
        out = complete(base, model, prompt)
        time.sleep(1.0)  # the counters reach the endpoint with the engine's next stats update
        now = counters(base)
        got = {k: int(now[k] - before[k]) for k in COUNTERS}
        before = now
        rows.append({"request": name, "text": out, **got})
        print(f"{name:<18} {got[COUNTERS[0]]:>10} {got[COUNTERS[1]]:>10} {got[COUNTERS[2]]:>8}")
    with open(a.out, "w") as f:
        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
