"""``LMCacheSerdeConfig``: the settings of speckv's LMCache serde
(``speckv.integrations.lmcache``), parsed once and checked when LMCache builds the serde.

They arrive as the ``"serde"`` entry of an LMCache L2 adapter's spec; LMCache reads ``type``
(``"speckv"``) and hands the other keys to the serde's factory.

>>> LMCacheSerdeConfig.parse({"model": "free"}).model
'free'
>>> LMCacheSerdeConfig.parse({"model": "stats"})  # doctest: +ELLIPSIS
Traceback (most recent call last):
...
speckv.settings.ConfigError: LMCache serde speckv: stats: required with model "stats" (...)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from ..settings import ConfigError, Settings, setting

MODELS = ("free", "stats")


@dataclass(frozen=True)
class LMCacheSerdeConfig(Settings):
    """The serde's settings (every key, its type and default)."""

    WHO: ClassVar[str] = "LMCache serde speckv"
    PASSED_THROUGH: ClassVar[tuple[str, ...]] = ("type",)
    EXAMPLE: ClassVar[dict[str, Any]] = {"type": "speckv", "model": "stats", "stats": "/path/stats.safetensors"}

    model: str = setting(
        "free",
        "choice",
        """`"free"`: the predictor-free fast lane; `"stats"`: a Gaussian around per-channel means
        (`stats`), coded with the bins model for 16-bit formats""",
        choices=MODELS,
        side="serde",
    )
    stats: str | None = setting(
        None,
        "path",
        """with model `"stats"`: a safetensors file of per-channel `mean` and `std`
        (`speckv.integrations.lmcache.fit_stats`)""",
        side="serde",
    )
    max_workers: int = setting(
        1,
        "int",
        "threads of LMCache's asynchronous serde processor coding and decoding chunks",
        low=1,
        high=256,
        side="serde",
    )

    def check(self, given: set[str]) -> None:
        if self.model == "stats" and self.stats is None:
            raise ConfigError(f'{self.WHO}: stats: required with model "stats" (a file from fit_stats)')
        if self.model != "stats" and self.stats is not None:
            raise ConfigError(f'{self.WHO}: stats: read only with model "stats" (the model is {self.model!r})')


__all__ = ["MODELS", "LMCacheSerdeConfig"]
