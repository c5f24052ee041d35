"""The integrations' typed settings (``speckv.settings``): every key checked at start-up with
one line naming it, the configuration reference written from the same declarations, and every
key and environment variable the code reads listed there."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from speckv.integrations.connector_config import ConnectorConfig
from speckv.integrations.lmcache_config import LMCacheSerdeConfig
from speckv.integrations.tier_config import TierConfig
from speckv.settings import ENVIRONMENT, ConfigError

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = [ConnectorConfig, TierConfig, LMCacheSerdeConfig]
# the least each configuration needs
MINIMAL = {
    ConnectorConfig: {"store": "memory", "predictor": "none"},
    TierConfig: {"store": "memory", "max_bytes": "1GB"},
    LMCacheSerdeConfig: {},
}


def refused(cls, options) -> str:
    with pytest.raises(ConfigError) as e:
        cls.parse(options)
    message = str(e.value)
    assert "\n" not in message and message.startswith(cls.WHO + ":"), message
    return message


def test_the_configuration_reference_is_the_declarations():
    """docs/configuration.md is what docs/gen_config_reference.py writes (rerun it after
    changing a setting)."""
    sys.path.insert(0, str(ROOT / "docs"))
    try:
        import gen_config_reference
    finally:
        sys.path.remove(str(ROOT / "docs"))
    page = (ROOT / "docs" / "configuration.md").read_text()
    assert gen_config_reference.render() == page, "docs/configuration.md is stale: python docs/gen_config_reference.py"
    for cls in CONFIGS:
        for key in cls.keys():
            assert f"| `{key}` |" in page


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_every_example_parses_and_every_default_is_valid(cls):
    cls.parse(cls.EXAMPLE)
    made = cls.parse(MINIMAL[cls])
    for key in MINIMAL[cls]:
        assert getattr(made, key) is not None


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_a_typo_in_any_key_fails_naming_the_closest(cls):
    for key in cls.keys():
        typo = key[:-1] if len(key) > 3 else key + "x"
        message = refused(cls, {**MINIMAL[cls], typo: 1})
        assert f"unknown key {typo!r}" in message and f"did you mean {key!r}" in message, message
    assert "did you mean" not in refused(cls, {**MINIMAL[cls], "zzzzzz": 1})


def test_the_connector_refuses_values_and_combinations_naming_the_key():
    ok = MINIMAL[ConnectorConfig]
    cases = {
        "save_queue": ({**ok, "save_queue": -1}, "save_queue: expected an int from 0 to 4096"),
        "save_queue str": ({**ok, "save_queue": "8"}, "save_queue: expected an int"),
        "save_nice": ({**ok, "save_nice": 20}, "save_nice: expected an int from -20 to 19"),
        "save_wait_s": ({**ok, "save_wait_s": -0.5}, "save_wait_s: expected a number from 0 to 3600"),
        "size": ({**ok, "max_bytes": "8 gigs"}, "max_bytes: '8 gigs' is not a size"),
        "no store": ({"predictor": "none"}, "store: required"),
        "store type": ({**ok, "store": 3}, "store: expected a store"),
        "no predictor": ({"store": "memory"}, "calibration: required unless predictor"),
        "map": ({**ok, "predictor": "map"}, "take their predictor from `calibration`"),
        "both": ({**ok, "calibration": "cal.safetensors"}, "give it or a calibration, not both"),
        "joint": ({**ok, "joint": True}, "joint: the joint residual model is a calibration's"),
        "by layer": ({"store": "memory", "calibration": "c", "load_by_layer": True}, "load_by_layer"),
        "one budget, two stores": ({**ok, "store": ["memory", "/kv"], "max_bytes": "1GB"}, "need one budget each"),
        "budgets, one store": ({**ok, "max_bytes": ["1GB", None]}, "a list of budgets is for a list of stores"),
        "lengths": ({**ok, "store": ["memory", "/kv"], "max_bytes": [1]}, "1 budgets for 2 stores"),
        "redis budget": ({**ok, "store": "redis://127.0.0.1:6379/0", "max_bytes": "1GB"}, "maxmemory"),
        "load_failure": ({**ok, "load_failure": "retry"}, 'load_failure: expected one of "recompute", "fail"'),
        "bool": ({**ok, "load_by_layer": "false"}, "load_by_layer: expected true or false"),
        "null": ({**ok, "save_queue": None}, "save_queue: a value is needed"),
    }
    for what, (options, message) in cases.items():
        assert message in refused(ConnectorConfig, options), what


def test_the_connector_accepts_what_users_write():
    c = ConnectorConfig.parse({"store": ["memory", "/var/kv"], "max_bytes": [8e9, None], "predictor": "none"})
    assert c.stores == ("memory", "/var/kv") and c.max_bytes == (8_000_000_000, None)
    assert c.layer_loads and c.coding == "fast"
    c = ConnectorConfig.parse({"store": "/kv", "max_bytes": "512MiB", "predictor": "raw", "load_by_layer": False})
    assert c.max_bytes == 512 << 20 and not c.layer_loads and c.coding == "raw"
    c = ConnectorConfig.parse({"store": "redis://h:1/0", "calibration": "cal.safetensors", "save_nice": None})
    assert c.save_nice is None and not c.layer_loads and c.save_wait_s == 1.0
    assert ConnectorConfig.parse({**MINIMAL[ConnectorConfig], "save_queue": 8.0}).save_queue == 8


def test_the_lmcache_serde_refuses_what_cannot_work():
    assert "stats: required" in refused(LMCacheSerdeConfig, {"model": "stats"})
    assert "read only with model" in refused(LMCacheSerdeConfig, {"stats": "s.safetensors"})
    assert "model: expected one of" in refused(LMCacheSerdeConfig, {"model": "map"})
    assert "max_workers" in refused(LMCacheSerdeConfig, {"max_workers": 0})
    assert LMCacheSerdeConfig.parse({"type": "speckv", "model": "free"}).max_workers == 1


# the modules that read each configuration, and the names they read it by
READERS = {
    ConnectorConfig: (
        [
            "integrations/vllm/context.py",
            "integrations/vllm/scheduler.py",
            "integrations/vllm/worker.py",
        ],
        r"\b(?:self\.context\.config|context\.config|config)\.(\w+)",
    ),
    TierConfig: (["integrations/vllm_tier.py"], r"\bself\.config\.(\w+)"),
    LMCacheSerdeConfig: (["integrations/lmcache.py"], r"\bconfig\.(\w+)"),
}


@pytest.mark.parametrize("cls", CONFIGS, ids=lambda c: c.__name__)
def test_the_code_reads_settings_only_through_the_declarations(cls):
    """Every ``config.NAME`` the integration reads is a declared key (or computed from them),
    and no module reads the raw mapping (``extra.get("...")``)."""
    files, pattern = READERS[cls]
    read: set[str] = set()
    for name in files:
        text = (ROOT / "python" / "speckv" / name).read_text()
        assert not re.search(r"\bextra(?:\.get\(|\[)|kwargs\.get\(|options\.get\(", text), name
        read |= set(re.findall(pattern, text))
    assert read, "no setting read: the pattern is stale"
    # the keys, and what the class computes from them (properties, methods of its own)
    allowed = set(cls.keys()) | {n for n, v in vars(cls).items() if isinstance(v, property) or callable(v)}
    assert read <= allowed, sorted(read - allowed)


def test_every_environment_variable_read_is_listed():
    """Every ``SPECKV_*`` variable the package, tests, benchmarks, CI and GPU scripts read is
    in ``speckv.settings.ENVIRONMENT`` (so on the reference page), and every one listed is read."""
    used: set[str] = set()
    quoted = re.compile(r"""["'](SPECKV_[A-Z0-9_]+)["']|\$\{?(SPECKV_[A-Z0-9_]+)""")
    for folder in ("python", "rust", "tests", "benches", ".ci", "cuda"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".cu", ".cuh", ".so") or not path.is_file() or "target" in path.parts:
                continue
            try:
                text = path.read_text()
            except UnicodeDecodeError:
                continue
            for m in quoted.finditer(text):
                used.add(m.group(1) or m.group(2))
    assert used == set(ENVIRONMENT), (sorted(used - set(ENVIRONMENT)), sorted(set(ENVIRONMENT) - used))
