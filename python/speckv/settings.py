"""Typed settings parsed once from the mappings users write: ``Settings``, ``setting`` and
``ConfigError``.

Every integration's configuration (the vLLM connector's ``kv_connector_extra_config``, a
speckv tier's entry in vLLM's ``secondary_tiers``, an LMCache serde spec) is one frozen
dataclass subclassing ``Settings``, each field declared with ``setting(...)``: its type,
default, unit, allowed values, range and the process that reads it. ``parse`` checks a mapping
at start-up and answers with one line naming the key for anything wrong:

- an unknown key, with the closest known one (``max_byte`` -> did you mean ``max_bytes``);
- a value of the wrong type or out of range (sizes accept ``8e9``, ``"8GB"``, ``"512MiB"``:
  ``speckv._sizes``);
- combinations that cannot work (the class's ``check``), with the reason.

``docs/configuration.md`` is written from the same declarations
(``docs/gen_config_reference.py``), so the reference and the code cannot disagree.

>>> from dataclasses import dataclass
>>> @dataclass(frozen=True)
... class Example(Settings):
...     WHO = "Example"
...     max_bytes: int | None = setting(None, "size", "the budget", unit="bytes")
>>> Example.parse({"max_bytes": "1KiB"}).max_bytes
1024
>>> Example.parse({"max_byte": 1})
Traceback (most recent call last):
...
speckv.settings.ConfigError: Example: unknown key 'max_byte' (did you mean 'max_bytes'?); known keys: max_bytes
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from ._sizes import parse_size
from ._speckv import SpeckvError

# the kinds of value a setting takes -> how the reference names them
KINDS = {
    "bool": "bool",
    "int": "int",
    "float": "number",
    "str": "string",
    "path": "path",
    "choice": "one of",
    "size": "size",
    "stores": "store or list of stores",
    "sizes": "size or list of sizes",
}
# who reads a setting, as the reference names them
SIDES = ("scheduler", "worker", "both", "tier", "serde")

# every environment variable speckv, its tests and its CI read -> (who reads it, what it does);
# the configuration reference lists them and a test finds every one the code reads
ENVIRONMENT: dict[str, tuple[str, str]] = {
    "SPECKV_NUM_THREADS": (
        "the core",
        "codec threads when a call names none (default: every core); bytes never depend on it",
    ),
    "SPECKV_SIMD": (
        "the core",
        "`0`: portable kernels only; `avx2`: no AVX-512 kernels (every kernel computes the same bits)",
    ),
    "SPECKV_AMX": (
        "the core",
        "`0`: the layer maps' sums without AMX's int8 tiles (Intel Xeon from Sapphire Rapids, Linux), "
        "with AVX-512 VNNI instead (the same sums)",
    ),
    "SPECKV_CACHE_DIR": (
        "the CLI, model loading, the CUDA module",
        "where calibrations, the converted demo model and compiled CUDA kernels are cached "
        "(default `$XDG_CACHE_HOME/speckv`, else `~/.cache/speckv`)",
    ),
    "SPECKV_MODEL_CACHE": (
        "model loading",
        "`0`: load the demo model from its GGUF file every time (~20 s) instead of from the bf16 "
        "folder converted once under `$SPECKV_CACHE_DIR/models` (~270 MB)",
    ),
    "SPECKV_TRACEBACK": ("the CLI", "`1`: show the traceback of an error instead of its one line"),
    "SPECKV_REQUIRE": (
        "tests",
        "comma-separated requirements (`vllm`, `redis`, `avx512`, ...) whose absence fails instead of skipping",
    ),
    "SPECKV_HYPOTHESIS_EXAMPLES": ("tests", "examples per hypothesis property (default 150)"),
    "SPECKV_VLLM_PYTHON": (
        "tests",
        "the python of the vLLM virtualenv (default `~/.cache/speckv-vllm-venv/bin/python`)",
    ),
    "SPECKV_VLLM_NEWEST": ("tests", "the folder the newest vLLM's Python modules are unpacked in (`.ci/vllm-newest`)"),
    "SPECKV_LMCACHE_PYTHON": (
        "tests",
        "the python of the LMCache virtualenv (default `~/.cache/speckv-lmcache-venv/bin/python`)",
    ),
    "SPECKV_REAL_MODELS": ("tests", "`1`: run the opt-in tests on Qwen2.5-Coder-0.5B and Gemma-3-270M"),
    "SPECKV_MODELS": ("tests", "where `fetch-models.sh` put those models (default `~/.cache/speckv-models`)"),
    "SPECKV_TEST_RECORD": (
        "tests",
        "set by the vLLM engine tests in their engine's processes (a folder for its records)",
    ),
    "SPECKV_TEST_SAVE_DELAY_S": ("tests", "set by the vLLM engine tests: seconds each background save is slowed by"),
    "SPECKV_PROFILE_CTL": ("benches", "set by `benches/profile_restore.py` in the processes it profiles"),
    "SPECKV_GPU_MODEL": ("cuda/gpu-check.sh", "a transformers folder the GPU check serves through vLLM"),
    "SPECKV_VENV": (".ci/run", "the development virtualenv (default `~/.cache/speckv-venv`)"),
    "SPECKV_CORE_VENV": (".ci/run", "the virtualenv of the core-only install (default `~/.cache/speckv-core-venv`)"),
    "SPECKV_WHEEL_VENV": (
        ".ci/run",
        "the virtualenv the built wheel is tested in (default `~/.cache/speckv-wheel-venv`)",
    ),
    "SPECKV_BUILD_VENV": (
        ".ci/build-wheel",
        "the virtualenv wheels are built in (default `~/.cache/speckv-build-venv`)",
    ),
    "SPECKV_WHEEL_TARGET": (
        ".ci/build-wheel",
        "cargo's target folder for wheels (default `~/.cache/speckv-wheel-target`)",
    ),
    "SPECKV_VLLM_VENV": (".ci/vllm-venv", "where the vLLM virtualenv is built (default `~/.cache/speckv-vllm-venv`)"),
    "SPECKV_LMCACHE_VENV": (
        ".ci/lmcache-venv",
        "where the LMCache virtualenv is built (default `~/.cache/speckv-lmcache-venv`)",
    ),
}


T = TypeVar("T", bound="Settings")


class ConfigError(SpeckvError):
    """A configuration refused at start-up: an unknown key, a value of the wrong type or out
    of range, or a combination that cannot work. The message is one line naming the key."""


@dataclass(frozen=True)
class Spec:
    """What ``setting`` records of one field (read by ``parse`` and the reference page)."""

    kind: str
    doc: str
    unit: str | None = None
    choices: tuple[Any, ...] = ()
    low: float | None = None
    high: float | None = None
    side: str = "both"
    nullable: bool = False
    hint: str | None = None


def setting(
    default: Any,
    kind: str,
    doc: str,
    *,
    unit: str | None = None,
    choices: Sequence[Any] = (),
    low: float | None = None,
    high: float | None = None,
    side: str = "both",
    nullable: bool | None = None,
    hint: str | None = None,
) -> Any:
    """A dataclass field of a ``Settings`` class: ``kind`` one of ``KINDS``, ``doc`` one
    sentence for the reference, ``unit`` where a number has one, ``choices`` for ``"choice"``,
    ``low``/``high`` for numbers (inclusive), ``side`` the process that reads it (``SIDES``);
    ``None`` is accepted where the default is ``None`` unless ``nullable`` says otherwise;
    ``hint`` ends the error of a bad value (what the user likely meant)."""
    if kind not in KINDS:
        raise ValueError(f"setting: kind {kind!r} is not one of {', '.join(KINDS)}")
    if side not in SIDES:
        raise ValueError(f"setting: side {side!r} is not one of {', '.join(SIDES)}")
    spec = Spec(
        kind,
        " ".join(doc.split()),
        unit,
        tuple(choices),
        low,
        high,
        side,
        default is None if nullable is None else nullable,
        hint,
    )
    return dataclasses.field(default=default, metadata={"speckv": spec})


class Settings:
    """Base of the typed configurations (see the module docs). Subclasses are frozen
    dataclasses naming themselves in ``WHO`` (the prefix of every error) and may refine
    ``check`` (combinations) and ``EXAMPLE`` (a mapping the reference shows, parsed by a
    test)."""

    WHO: ClassVar[str] = "speckv"
    # keys this configuration's host reads itself and hands on with the rest (vLLM's own
    # ``type`` and ``module_path`` of a tier): accepted, never stored
    PASSED_THROUGH: ClassVar[tuple[str, ...]] = ()
    EXAMPLE: ClassVar[dict[str, Any]] = {}

    @classmethod
    def specs(cls) -> dict[str, Spec]:
        """Each key's ``Spec``, in declaration order."""
        return {f.name: f.metadata["speckv"] for f in dataclasses.fields(cls) if "speckv" in f.metadata}  # type: ignore[arg-type]

    @classmethod
    def keys(cls) -> list[str]:
        """Every key this configuration reads, sorted."""
        return sorted(cls.specs())

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Each key's default."""
        return {f.name: f.default for f in dataclasses.fields(cls)}  # type: ignore[arg-type]

    @classmethod
    def parse(cls: type[T], options: Mapping[str, Any] | None) -> T:
        """The settings in ``options`` (``None``: all defaults), checked; ``ConfigError`` with
        one line naming the key otherwise."""
        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            raise ConfigError(f"{cls.WHO}: expected a mapping of settings, got {type(options).__name__}")
        specs = cls.specs()
        known = sorted(specs)
        values: dict[str, Any] = {}
        for key, value in options.items():
            if key in cls.PASSED_THROUGH:
                continue
            if key not in specs:
                close = difflib.get_close_matches(str(key), known, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise ConfigError(f"{cls.WHO}: unknown key {key!r}{hint}; known keys: {', '.join(known)}")
            try:
                values[key] = _convert(value, specs[key], f"{cls.WHO}: {key}")
            except ConfigError as e:
                note = specs[key].hint
                raise (ConfigError(f"{e} ({note})") if note else e) from None
        made = cls(**values)
        made.check(set(values))
        return made

    def check(self, given: set[str]) -> None:
        """Refuses combinations that cannot work (``ConfigError``); ``given``: the keys the
        user set (a default is never refused for another key's sake)."""


def _convert(value: Any, spec: Spec, what: str) -> Any:
    """``value`` as ``spec`` says, or ``ConfigError`` naming ``what``."""
    if value is None:
        if spec.nullable:
            return None
        raise ConfigError(f"{what}: a value is needed, got null")
    kind = spec.kind
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(f"{what}: expected true or false, got {value!r}")
        return value
    if kind in ("int", "float"):
        return _number(value, spec, what)
    if kind in ("str", "path"):
        if not isinstance(value, str) or not value:
            raise ConfigError(f"{what}: expected a non-empty string, got {value!r}")
        return value
    if kind == "choice":
        if value not in spec.choices:
            allowed = ", ".join(json.dumps(c) for c in spec.choices)
            raise ConfigError(f"{what}: expected one of {allowed}, got {value!r}")
        return value
    if kind == "size":
        return _size(value, what)
    if kind == "stores":
        items = [value] if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or not items:
            raise ConfigError(f"{what}: expected a store or a list of stores, got {value!r}")
        for item in items:
            if not isinstance(item, str) or not item:
                raise ConfigError(f"{what}: expected a store (a non-empty string), got {item!r}")
        return value if isinstance(value, str) else tuple(items)
    if kind == "sizes":
        if isinstance(value, (list, tuple)):
            return tuple(None if v is None else _size(v, what) for v in value)
        return _size(value, what)
    raise AssertionError(kind)  # setting() admits only KINDS


def _number(value: Any, spec: Spec, what: str) -> int | float:
    integral = spec.kind == "int"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{what}: expected {'an int' if integral else 'a number'}, got {value!r}")
    if integral and isinstance(value, float):
        if not value.is_integer():
            raise ConfigError(f"{what}: expected an int, got {value!r}")
        value = int(value)
    if (spec.low is not None and value < spec.low) or (spec.high is not None and value > spec.high):
        raise ConfigError(f"{what}: expected {_range(spec)}, got {value!r}")
    return value


def _range(spec: Spec) -> str:
    noun = "an int" if spec.kind == "int" else "a number"
    low, high = (None if b is None else _bound(b, spec) for b in (spec.low, spec.high))
    if low is not None and high is not None:
        return f"{noun} from {low} to {high}"
    if low is not None:
        return f"{noun} >= {low}"
    return f"{noun} <= {high}"


def _bound(b: float, spec: Spec) -> str:
    return str(int(b)) if spec.kind == "int" or float(b).is_integer() else str(b)


def _size(value: Any, what: str) -> int:
    try:
        return parse_size(value, what)
    except ValueError as e:
        raise ConfigError(str(e)) from None


def describe(spec: Spec) -> str:
    """The type column of the reference: the kind, its allowed values or range."""
    if spec.kind == "choice":
        return " or ".join(f"`{json.dumps(c)}`" for c in spec.choices)
    text = KINDS[spec.kind]
    if spec.kind in ("int", "float") and (spec.low is not None or spec.high is not None):
        text += ", " + _range(spec).split(" ", 2)[2]
    return text


__all__ = ["ENVIRONMENT", "KINDS", "SIDES", "ConfigError", "Settings", "Spec", "describe", "setting"]
