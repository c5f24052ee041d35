"""The storage backends a prefix store writes to: putting and getting entries of a
block's size, in memory and in a directory (checksummed, written whole)."""

from __future__ import annotations

import os

import pytest

from speckv.store import DirectoryBackend, MemoryBackend

ENTRIES, SIZE = 64, 96 * 1024  # about a 256-token block of the demo model's cache, coded


@pytest.fixture(params=["memory", "directory"])
def backend(request, tmp_path):
    return MemoryBackend() if request.param == "memory" else DirectoryBackend(tmp_path / "store")


def test_put(benchmark, backend):
    payloads = {f"{i:016x}": os.urandom(SIZE) for i in range(ENTRIES)}

    def put_all():
        for key, value in payloads.items():
            backend.put(key, value)

    benchmark.pedantic(put_all, rounds=5, warmup_rounds=1)
    assert sorted(backend.keys()) == sorted(payloads)
    _rate(benchmark)


def test_get(benchmark, backend):
    payloads = {f"{i:016x}": os.urandom(SIZE) for i in range(ENTRIES)}
    for key, value in payloads.items():
        backend.put(key, value)

    def get_all():
        return [backend.get(key) for key in payloads]

    got = benchmark(get_all)
    assert got == list(payloads.values())
    _rate(benchmark)


def _rate(benchmark) -> None:
    if benchmark.stats is not None:  # None under --benchmark-disable
        benchmark.extra_info["mb_per_s"] = ENTRIES * SIZE / benchmark.stats.stats.min / 1e6
