"""``speckv info``: the facts of a speckv stream or cache container file (no torch needed)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .._api import info
from .common import read_file


def add_parser(sub: Any) -> None:
    p = sub.add_parser("info", help="describe a speckv stream or cache container file (no torch needed)")
    p.add_argument("file")
    p.add_argument("--streams", action="store_true", help="a container: list every stream's facts too")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> None:
    out = info(read_file(args.file, "file"))
    if out.get("container") and not args.streams:
        out["streams"] = len(out["streams"])
    print(json.dumps(out, indent=2, default=str))
