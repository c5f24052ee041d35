"""``speckv eval``: one or several predictors on any local model and text (per-layer table, or
the predictors' trade-off table); ``--ablate``: the joint model's components in turn."""

from __future__ import annotations

import argparse
from typing import Any

from .ablation import ablate
from .common import CommandError, load, need_hf, text
from .evaluation import add_eval_arguments, run_eval
from .predictor_spec import parse_spec
from .tables import print_result, print_tradeoff


def add_parser(sub: Any) -> None:
    p = sub.add_parser("eval", help="per-layer evaluation on any local model and text")
    add_eval_arguments(p, demo=False)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    need_hf()
    # a bad --text or --predictor fails before the model loads
    text(args.text)
    specs = [p for p in (args.predictors or args.predictor or "prefix").split(",") if p]
    for spec in specs:
        parse_spec(spec)
    model, tokenizer, label = load(args.model)
    if args.ablate:
        ablate(args, model, tokenizer, label)
        return
    results = [run_eval(args, model, tokenizer, label, spec) for spec in specs]
    if len(results) == 1:
        print_result(args, results[0], per_layer=True)
    if len(results) > 1 or not args.json:
        print_tradeoff(args, results)
    if not all(m["exact_round_trip"] for r in results for m in r["modes"].values()):
        raise CommandError("a round trip was not exact")
