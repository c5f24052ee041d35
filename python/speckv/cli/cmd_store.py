"""``speckv store``: put the caches of a text's prompts into a directory store, get them back,
or print its statistics. A store's block size and dtype are fixed by its first ``put``."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from .calibration_cache import calibrated_codec
from .common import CommandError, load, need_hf, text


def add_parser(sub: Any) -> None:
    p = sub.add_parser("store", help="put caches of a text's prompts into a directory store, get them, stats")
    p.add_argument("action", choices=("put", "get", "stats"))
    p.add_argument("folder", help="the store's folder")
    p.add_argument("--model", help="a local GGUF file or transformers folder (default: the demo model)")
    p.add_argument(
        "--text", help="text whose prompts to store or restore: a file or a bundled text name (default: evaluation)"
    )
    p.add_argument("--prompts", type=int, default=4, help="prompts cut from the text (default 4)")
    p.add_argument("--seq-len", type=int, default=512, help="tokens per prompt (default 512)")
    p.add_argument(
        "--block-size", type=int, default=None, metavar="TOKENS", help="tokens per block (first put; default 256)"
    )
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp8"), default=None, help="storage dtype (first put)")
    p.add_argument("--calibration", help="a calibration file (default: the cached one of `speckv demo`)")
    p.add_argument("--calibration-text", help="calibration text file (default: the bundled text)")
    p.add_argument("--samples", type=int, default=32)
    p.add_argument("--recalibrate", action="store_true")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


STORE_SETTINGS = "speckv-store.json"


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    """A directory store's block size and dtype: fixed by its first ``put`` (kept in
    speckv-store.json), so that later commands read what was written."""
    from ..store import write_whole

    path = Path(args.folder) / STORE_SETTINGS
    if path.exists():
        try:
            settings = json.loads(path.read_text())
            block, dtype = settings["block_size"], settings["dtype"]
            if type(block) is not int or block < 1 or not isinstance(dtype, str):
                raise ValueError(f"block_size {block!r}, dtype {dtype!r}")
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise CommandError(f"{path} is damaged ({e}); it is not a speckv store's settings file") from None
        for name in ("block_size", "dtype"):
            given = getattr(args, name, None)
            if given is not None and given != settings[name]:
                raise CommandError(f"{args.folder} holds {name} {settings[name]!r}, not {given!r}")
        return settings
    if args.action != "put":
        raise CommandError(f"{args.folder} is not a speckv store (no {STORE_SETTINGS}): put something first")
    from ..prefix.prefix_store import DEFAULT_BLOCK_SIZE

    settings = {"block_size": args.block_size or DEFAULT_BLOCK_SIZE, "dtype": args.dtype or "bf16"}
    Path(args.folder).mkdir(parents=True, exist_ok=True)
    write_whole(path, json.dumps(settings).encode())  # a store is never left with half a file
    return settings


def run(args: argparse.Namespace) -> None:
    from ..store import DirectoryBackend

    settings = settings_of(args)
    backend = DirectoryBackend(args.folder)
    if args.action == "stats":
        out = {"folder": args.folder, **settings, "blocks": len(backend.keys()), "bytes": backend.nbytes()}
        print(json.dumps(out, indent=2) if args.json else "\n".join(f"{k}: {v}" for k, v in out.items()))
        return
    need_hf()
    text(args.text)  # a bad --text fails before the model loads
    from ..hf import PrefixStore
    from ..models.cache import prefill
    from ..models.demo import prompts

    model, tokenizer, label = load(args.model, demo_label="demo model")
    # the calibration of `speckv demo` (512-token prompts), whatever the prompts stored here
    cal_args = argparse.Namespace(
        calibration=args.calibration,
        calibration_text=args.calibration_text,
        samples=args.samples,
        seq_len=512,
        block_size=None,
        predictor=None,
        recalibrate=args.recalibrate,
        json=args.json,
    )
    codec, _, _ = calibrated_codec(cal_args, model, tokenizer, label)
    store = PrefixStore(codec, backend, block_size=settings["block_size"], dtype=settings["dtype"])
    batch = prompts(tokenizer, text(args.text), args.seq_len, args.prompts)
    iterator: Any = batch
    if not args.json:
        from tqdm.auto import tqdm

        iterator = tqdm(batch, desc=args.action, unit="prompt")
    rows = []
    for ids in iterator:
        t = time.perf_counter()
        if args.action == "put":
            n = store.put(ids, prefill(model, ids))
        else:
            _, n = store.get(ids)
        rows.append({"tokens": n, "seconds": time.perf_counter() - t})
    out = {"action": args.action, "prompts": len(rows), **store.stats()}
    out["tokens"] = sum(r["tokens"] for r in rows)
    out["seconds"] = sum(r["seconds"] for r in rows)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        verb = "stored" if args.action == "put" else "restored"
        print(f"{verb} {out['tokens']} tokens of {len(rows)} prompts in {out['seconds']:.2f} s")
        print(f"store: {out['blocks']} blocks, {out['bytes']:,} bytes in {args.folder}")
