"""``ConnectorConfig``: the settings of speckv's vLLM connector
(``speckv.integrations.vllm.SpeckvConnector``), parsed once and checked at start-up.

They arrive as vLLM's ``kv_connector_extra_config``. Both of the connector's processes (the
scheduler, which matches prompts, and each worker, which decodes and stores) parse the same
mapping, so a typo fails in the first one vLLM starts, naming the key.

>>> ConnectorConfig.parse({"store": "memory", "max_bytes": "8GB", "predictor": "none"}).max_bytes
8000000000
>>> ConnectorConfig.parse({"store": "memory", "predictor": "map"})  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
speckv.settings.ConfigError: SpeckvConnector: predictor: expected one of "none", "raw", got 'map' (...)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..settings import ConfigError, Settings, setting
from ..store.redis_backend import SCHEMES as REDIS_SCHEMES

# predictor values that need no calibration -> how ``EngineStore`` codes blocks then
FREE_PREDICTORS = {"none": "fast", "raw": "raw"}
LOAD_FAILURES = ("recompute", "fail")


@dataclass(frozen=True)
class ConnectorConfig(Settings):
    """The connector's settings (every key, its type, default, unit and reader)."""

    WHO: ClassVar[str] = "SpeckvConnector"
    EXAMPLE: ClassVar[dict[str, Any]] = {"store": "memory", "max_bytes": "8GB", "predictor": "none"}

    store: str | tuple[str, ...] | None = setting(
        None,
        "stores",
        """required. `"memory"` (host RAM: a folder `/dev/shm/speckv-ENGINE_ID` every process
        of this engine shares, removed when the engine shuts down), a folder, or
        `redis://HOST:PORT/DB` / `redis-cluster://HOST:PORT`; or a list of them, upper first
        (`["memory", "/var/kv"]`: RAM over disk, written through to both, a lower tier's hit
        promoted)""",
    )
    max_bytes: int | tuple[int | None, ...] | None = setting(
        None,
        "sizes",
        """the tier's budget (memory and folders): least recently used prefix tails are
        evicted past it. For a list of stores, a list of budgets, one per store (null: none). A
        Redis server's budget is its own `maxmemory` with `maxmemory-policy allkeys-lru`""",
        unit="bytes",
    )
    calibration: str | None = setting(
        None,
        "path",
        """a calibration file (`speckv calibrate --model FOLDER --predictor map|stats|prefix:N
        -o FILE`, on the checkpoint vLLM serves; `--fp8-scale 1.0` for
        `kv_cache_dtype="fp8"`): blocks coded with that predictor. Give this or `predictor`""",
    )
    predictor: str | None = setting(
        None,
        "choice",
        """without a calibration: `"none"` (the predictor-free fast lane) or `"raw"` (blocks
        stored uncompressed: the baseline tier, same keys, budget and eviction). The predicted
        stores (`map`, `stats`, `prefix:N`) are chosen by their `calibration` file""",
        choices=tuple(FREE_PREDICTORS),
        hint="the predicted stores take their predictor from `calibration`: speckv calibrate --predictor map -o FILE",
    )
    joint: bool | None = setting(
        None,
        "bool",
        """with a calibration: code with its joint residual model (null: where it pays for that
        predictor)""",
        side="worker",
    )
    save_queue: int = setting(
        64,
        "int",
        """saves waiting for the background saver (each holds a copy of its blocks); past it
        or `save_backlog` the save is dropped (counted), never the step stalled. `0`: store
        inside the step""",
        low=0,
        high=4096,
        side="worker",
    )
    save_backlog: int = setting(
        1 << 30,
        "size",
        """the most bytes of block copies the saves waiting for the saver may hold (one save is
        always taken): host memory the saver may borrow while its codec falls behind""",
        unit="bytes",
        low=1,
        side="worker",
    )
    save_threads: int = setting(
        1,
        "int",
        "codec threads of a background save (1: the engine keeps the other cores)",
        low=1,
        high=256,
        side="worker",
    )
    save_nice: int | None = setting(
        19,
        "int",
        """the saver thread's nice value (19: it takes the cores the engine leaves idle; null
        keeps the engine's)""",
        low=-20,
        high=19,
        nullable=True,
        side="worker",
    )
    save_wait_s: float = setting(
        1.0,
        "float",
        """how long a request whose prompt extends a save still on its way to the tier waits for
        it instead of computing those tokens (from the end of the step that computed the saved
        blocks; 0: never)""",
        unit="seconds",
        low=0,
        high=3600,
        side="scheduler",
    )
    load_by_layer: bool | None = setting(
        None,
        "bool",
        """restore layer by layer while the forward pass runs (null: yes for `predictor`
        `"none"` and `"raw"`; the predicted stores restore every layer before the pass, their
        predictor needing the layers before)""",
        side="worker",
    )
    stats_file: str | None = setting(
        None,
        "path",
        """a JSON file each process writes its counters to when it shuts down (the scheduler
        next to it, `.scheduler.json`): hits, tokens served, bytes, evictions, saves dropped,
        faults, seconds""",
    )
    load_failure: str = setting(
        "recompute",
        "choice",
        """`"recompute"`: a block the tier cannot serve is computed (vLLM's
        `kv_load_failure_policy` set to match); `"fail"`: the request fails""",
        choices=LOAD_FAILURES,
        side="scheduler",
    )

    @property
    def stores(self) -> tuple[str, ...]:
        """``store`` as a tuple (one store or several)."""
        assert self.store is not None  # check() refused a config without one
        return (self.store,) if isinstance(self.store, str) else self.store

    @property
    def coding(self) -> str:
        """How ``EngineStore`` codes blocks: the fast lane, raw, or (with a calibration)
        ``"fast"`` too, its predictor named by the calibration."""
        return FREE_PREDICTORS[self.predictor] if self.predictor is not None else "fast"

    @property
    def layer_loads(self) -> bool:
        """Whether the worker restores layer by layer (``load_by_layer``, resolved)."""
        return self.predictor is not None and self.load_by_layer is not False

    def check(self, given: set[str]) -> None:
        who = self.WHO
        if self.store is None:
            raise ConfigError(f'{who}: store: required ("memory", a folder, a redis:// URL, or a list of them)')
        if self.calibration is None and self.predictor is None:
            raise ConfigError(
                f'{who}: calibration: required unless predictor is "none" or "raw" '
                "(speckv calibrate --predictor map -o FILE)"
            )
        if self.calibration is not None and self.predictor is not None:
            raise ConfigError(
                f"{who}: predictor: {self.predictor!r} stores blocks without a predictor; "
                "give it or a calibration, not both"
            )
        if "joint" in given and self.calibration is None:
            raise ConfigError(f"{who}: joint: the joint residual model is a calibration's; give a calibration")
        if self.load_by_layer and self.calibration is not None:
            raise ConfigError(
                f"{who}: load_by_layer: a predicted store restores every layer before the forward "
                "pass (its predictor reads the layers before); set it only with predictor none or raw"
            )
        stores = self.stores
        budgets = self.max_bytes
        if isinstance(budgets, tuple):
            if len(stores) == 1:
                raise ConfigError(f"{who}: max_bytes: a list of budgets is for a list of stores")
            if len(budgets) != len(stores):
                raise ConfigError(f"{who}: max_bytes: {len(budgets)} budgets for {len(stores)} stores")
        elif budgets is not None and len(stores) > 1:
            raise ConfigError(
                f"{who}: max_bytes: {len(stores)} stores need one budget each, upper first "
                f"(for example [{budgets}, null])"
            )
        per_store = budgets if isinstance(budgets, tuple) else (budgets,) * len(stores)
        for spec, budget in zip(stores, per_store):
            if spec.startswith(REDIS_SCHEMES) and budget is not None:
                raise ConfigError(
                    f"{who}: max_bytes: {spec} is a Redis server, whose budget is its own: set its "
                    "maxmemory and maxmemory-policy allkeys-lru (null for that store)"
                )


__all__ = ["FREE_PREDICTORS", "LOAD_FAILURES", "ConnectorConfig"]
