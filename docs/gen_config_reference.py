"""Writes docs/configuration.md from the integrations' typed settings (``speckv.settings``:
``python docs/gen_config_reference.py``); ``tests/integrations/test_config.py`` checks that the page is what
this script writes."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

PAGE = Path(__file__).resolve().parent / "configuration.md"

# each integration's settings: (title, class path, where they go, what reads the rest)
SECTIONS = [
    (
        "vLLM: speckv's connector",
        "speckv.integrations.connector_config.ConnectorConfig",
        '`kv_connector_extra_config` of a `KVTransferConfig` with `kv_connector="SpeckvConnector"` and '
        '`kv_connector_module_path="speckv.integrations.vllm"` ([guide](guides/vllm.md)). Both of '
        "the connector's processes parse it: the scheduler (matching prompts) and each worker "
        "(decoding and storing); the *read by* column says which one uses a key.",
    ),
    (
        "vLLM: a speckv tier in vLLM's own offloading",
        "speckv.integrations.tier_config.TierConfig",
        "an entry of `secondary_tiers` in the `kv_connector_extra_config` of vLLM's "
        '`OffloadingConnector` with `"spec_name": "TieringOffloadingSpec"` '
        "([guide](guides/vllm-offloading.md)). vLLM reads `type`, `module_path` and "
        "`backpressure` itself and hands the other keys to the tier, in the scheduler's process.",
    ),
    (
        "LMCache: the speckv serde",
        "speckv.integrations.lmcache_config.LMCacheSerdeConfig",
        "the `serde` entry of an LMCache L2 adapter's spec ([guide](guides/lmcache.md)); LMCache "
        'reads `type` (`"speckv"`) and hands the other keys to the serde when it builds the adapter.',
    ),
]


def _class(path: str) -> Any:
    module, name = path.rsplit(".", 1)
    return getattr(__import__(module, fromlist=[name]), name)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _default(value: Any) -> str:
    if isinstance(value, tuple):
        value = list(value)
    return f"`{json.dumps(value)}`"


def render() -> str:
    """The page: per integration, where its settings go, an example and every key; then the
    environment variables."""
    from speckv.settings import ENVIRONMENT, describe

    out = [
        "# Configuration reference",
        "",
        "<!-- written by docs/gen_config_reference.py from the settings' declarations: do not edit -->",
        "",
        "Every integration reads its settings once, when it starts, and refuses what cannot work",
        "with one line naming the key (`speckv.settings.ConfigError`, a `ValueError`): an unknown",
        "key names the closest known one (`unknown key 'max_byte' (did you mean 'max_bytes'?)`), a",
        "value of the wrong type or out of range names its key, and so do combinations that cannot",
        'work. Sizes are bytes written as `8589934592`, `8e9`, `"8GB"` or `"512MiB"` (kB, MB, GB,',
        "TB are powers of 1000; KiB, MiB, GiB, TiB powers of 1024). `null` in JSON is `None` in Python.",
        "",
    ]
    for title, path, where in SECTIONS:
        cls = _class(path)
        out += [f"## {title}", "", f"`{path}`: {where}", "", "```json", json.dumps(cls.EXAMPLE), "```", ""]
        out += ["| key | type | default | unit | read by | meaning |", "|---|---|---|---|---|---|"]
        defaults = cls.defaults()
        for key, spec in cls.specs().items():
            kind = describe(spec) + (" or `null`" if spec.nullable and defaults[key] is not None else "")
            out.append(
                f"| `{key}` | {_cell(kind)} | {_default(defaults[key])} | {spec.unit or ''} | {spec.side} "
                f"| {_cell(spec.doc)} |"
            )
        if cls.PASSED_THROUGH:
            names = ", ".join(f"`{k}`" for k in cls.PASSED_THROUGH)
            out += ["", f"Read by the host, accepted and passed over: {names}."]
        out.append("")
    out += [
        "## Environment variables",
        "",
        "| variable | read by | meaning |",
        "|---|---|---|",
    ]
    for name, (reader, meaning) in ENVIRONMENT.items():
        out.append(f"| `{name}` | {reader} | {_cell(meaning)} |")
    out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    PAGE.write_text(render())
    sys.stdout.write(f"wrote {PAGE}\n")
