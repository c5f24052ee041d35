"""The pytest-benchmark suite (``pytest benches --benchmark-only``): shared workloads, and a
closing table of the ratios the README quotes, measured in the same run.

Each benchmark records its sizes and rates in ``benchmark.extra_info`` (saved with
``--benchmark-autosave``, compared with ``--benchmark-compare``); the functions that measure
live in the scripts beside this file (``bench_codec.py``, ``predictor_free.py``), so the
scripts' tables and these benchmarks share one implementation of each measurement.
"""

from __future__ import annotations

from typing import Any

import machine
import numpy as np
import pytest

from speckv._synthetic import workload

# scalars of the synthetic KV-like workload (bf16): a few chunks, a fraction of a second a call
SCALARS = 1 << 20


@pytest.fixture(scope="session")
def synthetic() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(x, mu, sigma)``: a bf16 cache-like tensor, its prediction and per-channel sigma."""
    return workload(SCALARS)


@pytest.fixture(scope="session")
def rates() -> dict[str, dict[str, Any]]:
    """Per benchmark name: what it measured (``msym_per_s``, ``bits_per_scalar``), for the
    closing table."""
    return {}


def record(benchmark: Any, rates: dict[str, dict[str, Any]], name: str, scalars: int, **info: Any) -> None:
    """After ``benchmark(...)``: its best time as Msym/s, with ``info``, into ``extra_info`` and
    the closing table (nothing when ``--benchmark-disable`` skipped the timing)."""
    stats = getattr(benchmark, "stats", None)
    if stats is None:
        return
    best = float(stats.stats.min)
    entry = {"msym_per_s": scalars / best / 1e6, **info}
    benchmark.extra_info.update(machine.describe())
    benchmark.extra_info.update(entry)
    rates[name] = entry


_RATES: dict[str, dict[str, Any]] = {}


@pytest.fixture(scope="session", autouse=True)
def _keep_rates(rates: dict[str, dict[str, Any]]) -> None:
    global _RATES
    _RATES = rates


# (numerator, denominator, what the ratio says)
RATIOS = (
    ("speckv exact decode", "constriction decode", "speckv's exact decode vs constriction's range coder, same symbols"),
    ("speckv bins decode", "constriction decode", "speckv's bins decode vs constriction's range coder, same symbols"),
    ("speckv exact encode", "constriction encode", "speckv's exact encode vs constriction's"),
    ("speckv fast lane decode", "zipnn decode", "predictor-free: speckv's fast lane decode vs ZipNN's"),
    ("speckv fast lane decode", "zstd -3 decode", "predictor-free: speckv's fast lane decode vs zstd -3's"),
    ("demo prefill", "demo restore prefix", "the demo model: restore (default predictor) as x its prefill"),
    ("demo prefill", "demo restore stats", "the demo model: restore (statistics, bins) as x its prefill"),
)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _RATES:
        return
    tr = terminalreporter
    tr.section("speckv: rates and ratios of this run (Msym/s; bits per scalar)")
    tr.write_line(f"measured on {machine.line()}")
    for name, entry in sorted(_RATES.items()):
        bits = entry.get("bits_per_scalar")
        note = "" if entry.get("exact", True) else "  (round trip NOT exact)"
        tr.write_line(f"{name:32s} {entry['msym_per_s']:9.1f} Msym/s" + (f"  {bits:7.3f} b/s" if bits else "") + note)
    for top, bottom, what in RATIOS:
        if top in _RATES and bottom in _RATES:
            ratio = _RATES[top]["msym_per_s"] / _RATES[bottom]["msym_per_s"]
            tr.write_line(f"{ratio:6.2f}x  {what}")
