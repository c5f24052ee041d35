"""Where a restore's time goes, per predictor: the model's prefix forward pass, the maps, the
coding parameters (mu and sigma codes), the core's decode calls (joint sums and coder), the
residuals handed between K and V, copies and the rest, each as a share of the restore and
against the model's own prefill of the same prompt.

    python benches/profile_restore.py                       # prefix, map, stats; bf16
    python benches/profile_restore.py --predictors stats --coder bins --json out.json
    python benches/profile_restore.py --perf                # and the core's symbols (perf)
    python benches/profile_restore.py --capture DIR         # and the decode calls, to replay

The core's decode speed per core: the restore's own decode calls, recorded once and replayed
on one thread (best of ``--decode-rounds``), as scalars per second. ``--capture DIR`` writes
those calls for ``cargo run --release --example decode_replay -- DIR/<predictor>`` (per call
``i``: ``i.stream``, ``i.mu`` float32, ``i.codes`` int16 broadcast to every scalar, and for the
joint model ``i.outside``, ``i.coef``, ``i.offset`` with ``C T E`` in ``index.txt``, and with the
integer form ``i.scale``, ``i.icoef`` int16, ``i.unit`` and a fifth field 1), which
times the same calls without Python and, with ``--reencode``, as this build codes them.

The phases are wall time on the restoring thread (functions wrapped for the run; nothing in
the package changes). With ``--perf`` (Linux ``perf``, software clock) the core's own time is
split by symbol: joint sums (``joint::``), coder (``decode``/``bins``/``exact``), token scale.
Demo model, held-out text of another genre (``legal``) by default; run it alone."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

import machine

# the prefix of phases timed on the token walks' threads (summed over them)
WALKS = "walks: "


class Phases:
    """Wall time per named phase on the thread that runs the restore (nested phases count in
    the innermost only). Where the walk splits into token walks side by side
    (``decode_walk.split_walk``), that thread's phase is the wait for them, and their own
    phases are summed over their threads under names of their own (``WALKS``): they add up
    to more than the wall time they take."""

    def __init__(self) -> None:
        self.total: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.local = threading.local()
        self.lock = threading.Lock()

    def _stack(self) -> list[list[Any]]:
        stack = getattr(self.local, "stack", None)
        if stack is None:
            stack = self.local.stack = []
        return stack

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            stack = self._stack()
            here = name if threading.current_thread() is threading.main_thread() else WALKS + name
            now = time.perf_counter()
            with self.lock:
                if stack:
                    outer = stack[-1]
                    self.total[outer[0]] += now - outer[1]
            stack.append([here, now])
            try:
                return fn(*args, **kwargs)
            finally:
                end = time.perf_counter()
                with self.lock:
                    self.total[here] += end - stack.pop()[1]
                    self.calls[here] += 1
                if stack:
                    stack[-1][1] = end

        return timed

    def reset(self) -> None:
        self.total.clear()
        self.calls.clear()


@contextlib.contextmanager
def instrumented(phases: Phases) -> Iterator[None]:
    """The restore path's functions wrapped with ``phases`` (restored on exit)."""
    from speckv import _api
    from speckv.codec import decode_walk, plan, target
    from speckv.predictors import early_exit, prefix_run

    patches = [
        (_api, "decode", "core decode (joint sums + coder)"),
        (_api, "decode_many", "core decode (joint sums + coder)"),
        (_api, "residuals", "residuals (K for V)"),
        (plan.CodingPlan, "target", "coding params (mu, sigma codes)"),
        (plan.CodingPlan, "joint_model", "joint model arrays"),
        (plan.CodingPlan, "observed", "observed (to float)"),
        (early_exit.ModelPrefixPredictor, "map_predict", "maps"),
        (prefix_run._PrefixRun, "wait", "forward pass (waited for)"),
        (target, "channel_major", "copies (channel-major)"),
        (decode_walk, "join", "copies (join blocks)"),
        (decode_walk, "channel_major", "copies (channel-major)"),
        (decode_walk, "split_walk", "token walks side by side (waited for)"),
        (decode_walk, "split_whole", "token walks side by side (waited for)"),
    ]
    saved = []
    for owner, attr, name in patches:
        fn = getattr(owner, attr)
        saved.append((owner, attr, fn))
        setattr(owner, attr, phases.wrap(name, fn))
    # the walk's predict of a prefix layer waits for the forward pass: its own phase
    run_predict = prefix_run._PrefixRun.predict

    def predict(self: Any, layer: int, which: int) -> Any:
        name = "forward pass (waited for)" if layer < self.p.layers else "maps (walk)"
        return phases.wrap(name, run_predict)(self, layer, which)

    prefix_run._PrefixRun.predict = predict  # type: ignore[method-assign]
    saved.append((prefix_run._PrefixRun, "predict", run_predict))
    try:
        yield
    finally:
        for owner, attr, fn in reversed(saved):
            setattr(owner, attr, fn)


@contextlib.contextmanager
def recorded_decodes(calls: list[tuple[tuple[Any, ...], dict[str, Any]]]) -> Iterator[None]:
    """The extension's ``decode`` calls made inside, appended to ``calls``; each stream of a
    ``decode_many`` call as a ``decode`` call of its own."""
    from speckv import _api

    real, real_many = _api._speckv.decode, _api._speckv.decode_many

    def record(*args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    def record_many(items: Any, threads: int = 1) -> Any:
        calls.extend(((data, prediction), {"threads": threads}) for data, prediction in items)
        return real_many(items, threads=threads)

    _api._speckv.decode, _api._speckv.decode_many = record, record_many
    try:
        yield
    finally:
        _api._speckv.decode, _api._speckv.decode_many = real, real_many


def decode_per_core(calls: list[tuple[tuple[Any, ...], dict[str, Any]]], rounds: int) -> float:
    """Scalars per second of ``calls`` replayed on one thread, the best of ``rounds``."""
    from speckv import _speckv

    scalars = sum(args[1][0].size for args, _ in calls)  # (stream, (mu, ...))
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        for args, kwargs in calls:
            _speckv.decode(*args, **{**kwargs, "threads": 1})
        best = min(best, time.perf_counter() - t)
    return scalars / best


def write_calls(calls: list[tuple[tuple[Any, ...], dict[str, Any]]], folder: str) -> None:
    """``calls`` as ``examples/decode_replay.rs`` reads them (module doc)."""
    import numpy as np

    os.makedirs(folder, exist_ok=True)
    lines = []
    for i, (args, _) in enumerate(calls):
        stream, (mu, mu_shape, sigma, sigma_shape, joint) = args
        if sigma.dtype != np.int16:
            raise SystemExit("--capture: a decode call took float sigmas, not codes")
        codes = np.broadcast_to(sigma.reshape(sigma_shape), mu_shape).astype(np.int16)
        np.asarray(stream, np.uint8).tofile(f"{folder}/{i}.stream")
        mu.astype(np.float32).tofile(f"{folder}/{i}.mu")
        codes.tofile(f"{folder}/{i}.codes")
        if joint:
            channels, tokens, outside_channels, outside, coef, offset, integer = joint
            for name, a in (("outside", outside), ("coef", coef), ("offset", offset)):
                np.asarray(a, np.float32).tofile(f"{folder}/{i}.{name}")
            line = f"{i} {channels} {tokens} {outside_channels}"
            if integer is not None:
                scale, icoef, unit = integer
                np.asarray(scale, np.float32).tofile(f"{folder}/{i}.scale")
                np.asarray(icoef, np.int16).tofile(f"{folder}/{i}.icoef")
                np.asarray(unit, np.float32).tofile(f"{folder}/{i}.unit")
                line += " 1"
            lines.append(line)
        else:
            lines.append(str(i))
    with open(f"{folder}/index.txt", "w") as f:
        f.write("\n".join(lines) + "\n")


def perf_symbols(script_args: list[str]) -> dict[str, float] | None:
    """The core's self time by symbol group over the restores (``perf record`` with a
    control fifo: only the timed restores are sampled); None without perf."""
    import shutil

    if shutil.which("perf") is None:
        return None
    with tempfile.TemporaryDirectory() as d:
        ctl, ack, data = (os.path.join(d, n) for n in ("ctl", "ack", "perf.data"))
        os.mkfifo(ctl)
        os.mkfifo(ack)
        cmd = ["perf", "record", "-q", "-e", "cpu-clock", "-F", "4000", "-D", "-1"]
        cmd += [f"--control=fifo:{ctl},{ack}", "-o", data, sys.executable, __file__, *script_args]
        subprocess.run(cmd, check=True, env={**os.environ, "SPECKV_PROFILE_CTL": f"{ctl},{ack}"})
        rep = subprocess.run(
            ["perf", "report", "-i", data, "--stdio", "--no-children", "--sort", "dso,symbol", "-q"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    groups: dict[str, float] = defaultdict(float)
    for line in rep.splitlines():
        parts = line.split()
        if not parts or not parts[0].endswith("%"):
            continue
        share = float(parts[0].rstrip("%"))
        dso, sym = parts[1], " ".join(parts[3:])
        groups[symbol_group(dso, sym)] += share
    return dict(sorted(groups.items(), key=lambda kv: -kv[1]))


def symbol_group(dso: str, sym: str) -> str:
    """A perf sample's group: the core's kernels by module, torch, python, the rest."""
    if "_speckv" in dso:
        for key, name in (
            ("joint", "core: joint sums"),
            ("token_scale", "core: token scale"),
            ("bins", "core: bins coder"),
            ("exact", "core: exact coder"),
            ("fast_lane", "core: fast lane"),
            ("residual", "core: residuals"),
            ("linear_map", "core: maps (integer sums)"),
            ("sigma", "core: sigma codes"),
            ("decoder", "core: range decoder"),
            ("model", "core: model tables"),
        ):
            if key in sym:
                return name
        return "core: other (" + sym[:60] + ")"
    if "torch" in dso or "libgomp" in dso or "mkl" in dso or "dnnl" in dso:
        return "torch"
    if "python" in dso:
        return "python"
    return dso


def control(cmd: str) -> None:
    """Enables/disables perf sampling when run under ``perf_symbols``."""
    spec = os.environ.get("SPECKV_PROFILE_CTL")
    if not spec:
        return
    ctl, ack = spec.split(",")
    with open(ctl, "w") as f:
        f.write(cmd + "\n")
    with open(ack) as f:
        f.read(5)


def profile(
    predictor: str, coder: str, mode: str, text: str, seq: int, repeat: int, decode_rounds: int, capture: str | None
) -> dict[str, Any]:
    import argparse as ap

    import torch

    from speckv.cli.calibration_cache import calibrated_codec
    from speckv.cli.common import text as bundled
    from speckv.hf import extract_kv, load_demo_model
    from speckv.models.cache import other_kernels, prefill
    from speckv.models.demo import prompts

    model, tokenizer = load_demo_model()
    torch.set_num_threads(os.cpu_count() or 1)
    args = ap.Namespace(
        calibration=None,
        calibration_text=None,
        samples=32,
        seq_len=512,
        block_size=None,
        predictor=predictor,
        recalibrate=False,
        json=True,
    )
    codec = calibrated_codec(args, model, tokenizer, "SmolLM2-135M-Instruct")[0]
    ids = prompts(tokenizer, bundled(text), seq, 1)[0]
    cache = other_kernels(model, ids)
    coder = codec.restore_model(mode) if coder == "auto" else coder  # auto: what compress picks
    data = codec.compress(cache, ids, mode, model=coder)
    scalars = sum(t.numel() for pair in extract_kv(cache) for t in pair)
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
    with recorded_decodes(calls):
        codec.decompress(data, ids, dequantize=False)  # warm: maps built, tables made
    if capture:
        write_calls(calls, os.path.join(capture, predictor))
    per_core = decode_per_core(calls, decode_rounds)
    phases = Phases()
    runs = []
    prefills = []
    # rounds of (prefill, restore) back to back: this VM's speed drifts by 10-20% within
    # minutes, so the ratio is taken per round (its median reported) rather than between the
    # best of each timed apart
    with instrumented(phases):
        for _ in range(repeat):
            prefills.append(_timed(lambda: prefill(model, ids)))
            control("enable")
            phases.reset()
            t = time.perf_counter()
            back = codec.decompress(data, ids, dequantize=False)
            wall = time.perf_counter() - t
            control("disable")
            runs.append((wall, dict(phases.total), dict(phases.calls)))
    ratios = sorted(r[0] / p for r, p in zip(runs, prefills))
    best_prefill = min(prefills)
    stored = codec.params.plan(mode, joint=False, threads=1)
    for layer, pair in enumerate(extract_kv(cache)):
        for which, true in enumerate(pair):
            want = stored.stored(layer, which, true)
            got = extract_kv(back)[layer][which]
            word = torch.int16 if want.element_size() == 2 else torch.uint8
            if not torch.equal(want.view(word), got.view(word)):
                raise AssertionError(f"layer {layer} {'KV'[which]}: the restore is not exact")
    wall, total, calls = min(runs, key=lambda r: r[0])
    named = sum(s for name, s in total.items() if not name.startswith(WALKS))
    shares = {name: s for name, s in sorted(total.items(), key=lambda kv: -kv[1])}
    shares["other (python walk, torch glue)"] = max(wall - named, 0.0)
    return {
        "predictor": predictor,
        "coder": coder,
        "mode": mode,
        "tokens": int(ids.numel()),
        "scalars": int(scalars),
        "bits_per_scalar": len(data) * 8 / scalars,
        "prefill_s": best_prefill,
        "restore_s": wall,
        # the median over rounds of restore / the prefill just before it
        "restore_over_prefill": ratios[len(ratios) // 2],
        "restore_over_prefill_range": [ratios[0], ratios[-1]],
        # the core's decode calls, wall time on every thread the coder runs
        "decode_msym_per_s": scalars
        / (
            total.get("core decode (joint sums + coder)", 0.0)
            + total.get(WALKS + "core decode (joint sums + coder)", 0.0)
        )
        / 1e6,
        # the same calls replayed on one thread (best of the rounds): the speed per core
        "decode_msym_per_core": per_core / 1e6,
        "decode_calls": len(calls),
        "threads": os.cpu_count(),
        "phases_s": shares,
        "calls": calls,
    }


def _timed(fn: Callable[[], Any]) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--predictors", default="prefix,map,stats")
    p.add_argument(
        "--coder", default="auto", choices=("auto", "exact", "bins"), help="default auto: what compress picks"
    )
    p.add_argument("--mode", default="bf16")
    p.add_argument("--text", default="legal")
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--repeat", type=int, default=7, help="rounds of prefill then restore (default 7)")
    p.add_argument("--perf", action="store_true", help="split the core's time by symbol with Linux perf")
    p.add_argument("--decode-rounds", type=int, default=10, help="replays of the decode calls on one thread")
    p.add_argument("--capture", metavar="DIR", help="write the decode calls here (DIR/<predictor>), to replay")
    p.add_argument("--json", help="write the results here")
    a = p.parse_args()
    out = {**machine.describe(), "date": time.strftime("%Y-%m-%d"), "runs": []}
    for predictor in a.predictors.split(","):
        r = profile(predictor, a.coder, a.mode, a.text, a.seq_len, a.repeat, a.decode_rounds, a.capture)
        if a.perf and not os.environ.get("SPECKV_PROFILE_CTL"):
            argv = ["--predictors", predictor, "--coder", r["coder"], "--mode", a.mode, "--text", a.text]
            argv += ["--seq-len", str(a.seq_len), "--repeat", str(a.repeat)]
            r["perf_self_percent"] = perf_symbols(argv)
        out["runs"].append(r)
        if os.environ.get("SPECKV_PROFILE_CTL"):
            continue
        print(
            f"\n{predictor} ({r['coder']}, {a.mode}, {r['tokens']} tokens, {a.text}) on {machine.line()}:\n  "
            f"{r['bits_per_scalar']:.3f} b/s, restore {r['restore_s'] * 1e3:.0f} ms = "
            f"{r['restore_over_prefill']:.2f}x the prefill (median of {a.repeat} rounds, range "
            f"{r['restore_over_prefill_range'][0]:.2f}-{r['restore_over_prefill_range'][1]:.2f}; "
            f"prefill {r['prefill_s'] * 1e3:.0f} ms at best); core decode {r['decode_msym_per_s']:.0f} Msym/s "
            f"in the restore, {r['decode_msym_per_core']:.0f} Msym/s per core (its {r['decode_calls']} calls on "
            "one thread)"
        )
        for name, s in r["phases_s"].items():
            print(f"  {name:40s} {s * 1e3:8.1f} ms  {s / r['restore_s']:6.1%}  {s / r['prefill_s']:.3f}x prefill")
        for name, pct in (r.get("perf_self_percent") or {}).items():
            if pct >= 0.5:
                print(f"    perf {name:50s} {pct:5.1f}%")
    if a.json and not os.environ.get("SPECKV_PROFILE_CTL"):
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
