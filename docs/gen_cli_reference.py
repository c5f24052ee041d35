"""Writes docs/cli.md from the ``speckv`` command's own parser (``python docs/gen_cli_reference.py``);
``tests/repo/test_docs.py`` checks that the page is what this script writes."""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

PAGE = Path(__file__).resolve().parent / "cli.md"
# the help text's width (what a 100-column terminal gets)
WIDTH = 98


def render() -> str:
    """The page: the command's description, then each subcommand's usage and options, as
    ``speckv COMMAND --help`` prints them."""
    from speckv.cli import build_parser

    parser = build_parser()
    out = [
        "# CLI reference",
        "",
        "<!-- written by docs/gen_cli_reference.py from the parser itself: do not edit -->",
        "",
        "`speckv` is installed with the package; the commands that load a model need the `hf` extra.",
        "Every command ends with one line on stderr and exit status 1 for what a user can get wrong",
        "(`SPECKV_TRACEBACK=1` shows the traceback).",
        "",
    ]
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in sub.choices.items():
        command.prog = f"speckv {name}"
        # argparse wraps help to the terminal's width unless told one: the page's is fixed
        command.formatter_class = functools.partial(command.formatter_class, width=WIDTH)
        text = command.format_help().rstrip()
        out += [f"## `speckv {name}`", "", "```text", text, "```", ""]
    return "\n".join(out)


if __name__ == "__main__":
    PAGE.write_text(render())
    sys.stdout.write(f"wrote {PAGE}\n")
