"""What every ``speckv`` command shares: messages, the hf extra's check, model and text loading.

Errors a user can cause (a missing file, a damaged stream, a model the package cannot run) end
the command through ``CommandError`` or one of speckv's typed exceptions; ``cli.main`` prints
them as one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

DEMO_LABEL = "SmolLM2-135M-Instruct"


class CommandError(Exception):
    """A command cannot go on: its message is printed as ``speckv COMMAND: message``."""


def add_fp8_scale_block(p: argparse.ArgumentParser) -> None:
    """``--fp8-scale-block TOKENS``: the fp8 predictor's scale blocks (``args.block_size``), named
    apart from the stores' ``--block-size`` (tokens per stored block)."""
    p.add_argument(
        "--fp8-scale-block",
        dest="block_size",
        metavar="TOKENS",
        type=int,
        default=None,
        help="tokens per fp8 scale block of the fp8 predictor (default: one scale per tensor)",
    )


def say(args: argparse.Namespace, *parts: Any) -> None:
    """A progress line on stdout, unless the command prints JSON."""
    if not args.json:
        print(*parts, flush=True)


def need_hf() -> None:
    """Ends the command with the install line when torch or transformers is missing."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError:
        raise CommandError("this command needs the hf extra: pip install 'speckv-rs[hf]'") from None


def read_file(path: str, what: str) -> bytes:
    """A file the user named, or ``CommandError`` saying which and why it cannot be read."""
    try:
        return Path(path).read_bytes()
    except OSError as e:
        raise CommandError(f"{what} {path}: {e.strerror or e}") from None


def text(spec: str | None) -> str:
    """``--text``: a file, or the name of a bundled text (default: the evaluation text)."""
    from ..models.demo import BUNDLED_TEXTS, bundled_text

    if spec is None or spec in BUNDLED_TEXTS:
        return bundled_text(spec or "evaluation")
    return _decoded(read_file(spec, "--text"), spec, "--text")


def calibration_text(spec: str | None) -> str:
    """``--calibration-text``: a file (default: the bundled calibration text)."""
    from ..models.demo import bundled_text

    if not spec:
        return bundled_text("calibration")
    return _decoded(read_file(spec, "--calibration-text"), spec, "--calibration-text")


def _decoded(data: bytes, path: str, what: str) -> str:
    try:
        return data.decode()
    except UnicodeDecodeError as e:
        raise CommandError(f"{what} {path}: not UTF-8 text ({e.reason} at byte {e.start})") from None


def text_name(spec: str | None) -> str:
    """How a ``--text`` is named in messages."""
    from ..models.demo import BUNDLED_TEXTS

    return f"bundled {spec or 'evaluation'} text" if spec is None or spec in BUNDLED_TEXTS else Path(spec).name


def load(model: str | None, demo_label: str = DEMO_LABEL) -> tuple[Any, Any, str]:
    """``--model`` (a GGUF file or a transformers folder; default: the demo model, labelled
    ``demo_label``): the model, its tokenizer and its label."""
    from ..hf import load_demo_model, load_model

    if model is None:
        try:
            loaded = load_demo_model()
        except FileNotFoundError as e:
            raise CommandError(str(e)) from None
        return loaded[0], loaded[1], demo_label
    if not Path(model).exists():
        raise CommandError(f"--model {model}: no such file or folder")
    loaded = load_model(model)
    return loaded[0], loaded[1], Path(model).name
