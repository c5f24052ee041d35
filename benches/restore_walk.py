"""A reader's walk of a restore, counted: which of speckv's modules ``decompress`` enters, and
how often per layer, for the demo model with each predictor a prefix store takes (one held-out
prompt, bf16, one thread so the walk is one call stack).

    python benches/restore_walk.py                      # default, map, stats
    python benches/restore_walk.py --predictors map --json

An entry is a call from one module into another (a call inside a module is not one), counted
with ``sys.setprofile``; the binding's functions (``speckv._speckv``) are counted where
Python calls them. Two views: every entry (helpers calling helpers included), and the walk's
own stops: the modules the decode walk (``speckv.codec.decode_walk``) calls into, what a
reader follows. "per layer" is the count divided by the model's layers: a module entered once
per layer and K/V shows 2.0. Counts, not times: the same on any machine.
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import sys
from types import FrameType
from typing import Any

import torch

from speckv.cli.predictor_spec import make_predictor
from speckv.hf import (
    SpeculativeCodec,
    bundled_text,
    load_demo_model,
    prefill,
    prompts,
)


def module_of(frame: FrameType | None) -> str:
    return frame.f_globals.get("__name__", "?") if frame is not None else "?"


# the decode walk's module (its old path too, to count a tree from before the move)
WALK = ("speckv.codec.decode_walk", "speckv.hf.codec.decode_walk")


def count_entries(fn: Any) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """Calls from one speckv module into another (or into the binding) while ``fn`` runs: all
    of them, and those the decode walk makes."""
    entries: collections.Counter[str] = collections.Counter()
    walk: collections.Counter[str] = collections.Counter()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event == "call":
            callee, caller = module_of(frame), module_of(frame.f_back)
        elif event == "c_call":
            callee, caller = getattr(arg, "__module__", None) or "?", module_of(frame)
        else:
            return
        if callee.startswith("speckv") and callee != caller:
            entries[callee] += 1
            if caller in WALK:
                walk[callee] += 1

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return entries, walk


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--predictors", default="default,map,stats", help="default, map, stats")
    parser.add_argument("--tokens", type=int, default=128, help="prompt length (default 128)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    args = parser.parse_args()
    torch.set_num_threads(1)
    model, tokenizer = load_demo_model()
    calibration = prompts(tokenizer, bundled_text("calibration"), 128, 4)
    (ids,) = prompts(tokenizer, bundled_text("evaluation"), args.tokens, 1)
    layers = model.config.num_hidden_layers
    cache = prefill(model, ids)
    out: dict[str, Any] = {}
    for name in args.predictors.split(","):
        codec = SpeculativeCodec(model, predictor=make_predictor("prefix" if name == "default" else name, model))
        codec.calibrate(calibration)
        data = codec.compress(cache, ids, threads=1)
        codec.decompress(data, ids, threads=1)  # warm: lazily built tables and imports
        entries, walk = count_entries(functools.partial(codec.decompress, data, ids, threads=1))
        out[name] = {"layers": layers, "entries": dict(entries.most_common()), "walk": dict(walk.most_common())}
    if args.json:
        print(json.dumps(out, indent=2))
        return
    for name, got in out.items():
        for view, title in (("entries", "module entries"), ("walk", "the walk's stops")):
            total = sum(got[view].values())
            print(f"\n{name}: {total} {title}, {total / layers:.1f} per layer ({layers} layers)")
            for module, n in got[view].items():
                print(f"  {module:40s} {n:6d}  {n / layers:6.2f} per layer")


if __name__ == "__main__":
    main()
