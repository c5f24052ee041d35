"""The maps' inputs (``speckv.predictors.map_sources._features``): made from a walk's cache of
its sources (float32, K un-RoPEd, by token) they are the same floats as made afresh, for every
number of rows a map asks (fewer than a source holds, as many, more: zeros first)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the hf extra: pip install 'speckv-rs[hf]'")

from speckv.predictors.map_sources import _features  # noqa: E402


class _Rope:
    """A stand-in un-RoPE that depends on position and channel, as a real one does."""

    def unrope(self, k: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(k.shape[2], dtype=torch.float32)[:, None]
        return k * torch.cos(pos * 0.1 + torch.arange(k.shape[3]) * 0.01)


class _Ropes:
    def of(self, layer: int) -> _Rope:
        return _Rope()


def test_cached_features_are_the_features() -> None:
    g = torch.Generator().manual_seed(0)
    observed = {
        (layer, w): torch.randn(2, 3, n, 4, generator=g).to(torch.bfloat16)
        for layer, n in ((0, 12), (1, 9))
        for w in (0, 1)
    }
    sources = [(0, 0), (0, 1), (1, 0), (1, 1)]
    cache: dict = {}
    for rows in (5, 9, 12, 16, 9):
        fresh = _features(observed, sources, _Ropes(), rows)
        cached = _features(observed, sources, _Ropes(), rows, cache)
        assert fresh.shape == (2 * rows, 4 * 12)
        assert torch.equal(fresh, cached), rows
    assert sorted(cache) == sources
    # a source holding fewer positions than asked: zeros at the first ones
    short = _features(observed, [(1, 1)], _Ropes(), 12, cache).reshape(2, 12, 12)
    assert torch.count_nonzero(short[:, :3]) == 0 and torch.count_nonzero(short[:, 3:]) > 0
