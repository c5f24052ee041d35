"""``speckv export``: a GGUF model (default: the demo model) written as a transformers folder."""

from __future__ import annotations

import argparse
from typing import Any

from .common import need_hf


def add_parser(sub: Any) -> None:
    p = sub.add_parser(
        "export", help="write a GGUF model (default: the demo model) as a transformers folder (bf16), e.g. for vLLM"
    )
    p.add_argument("output", help="the folder to write")
    p.add_argument("--model", help="a local GGUF file (default: the demo model)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    need_hf()
    from ..models.demo import export_folder

    print(f"wrote {export_folder(args.model, args.output)}")
