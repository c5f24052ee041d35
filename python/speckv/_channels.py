"""The channel period of a 1-D stream given without ``channels=``: found from its words.

A predictor-free stream models scalar ``i`` as channel ``i % channels``. A tensor gives it by
its shape (the last dimension); a flattened cache (``x.reshape(-1)``, as ZipNN's API invites)
has no shape to give, and taking its length would make every scalar its own channel (a demo
cache flattened so coded 14.74 bits per scalar instead of 10.50). `detect_period` instead picks,
among the periods KV layouts have (powers of two and three times them, up to
``MAX_PERIOD``), the one under which the scalars' top bytes (sign and exponent) are best
predicted per channel: each candidate's per-channel histograms (backed off to the pooled one)
are counted on the first half of a sample and scored by their cross-entropy on the second
half, so a period with too few scalars per channel to learn from loses to a shorter one.
Among periods within ``TOLERANCE`` bits of the best, the shortest wins (a multiple of the
true period scores as well as it).

The choice is the encoder's alone: the stream records its period, so decoding never depends
on it, and it depends only on the words (never on threads or the machine)."""

from __future__ import annotations

import numpy as np

# scalars read to choose: the first ones of the stream (a few milliseconds of numpy)
SAMPLE = 1 << 15
# longest period tried: 4,096 = 32 heads x 128 (one token's K of a large model's layer)
MAX_PERIOD = 4096
# bits of top-byte cross-entropy per scalar within which a shorter period is preferred
TOLERANCE = 0.01
# pooled scalars each channel's histogram starts from
PRIOR = 16.0
# a candidate needs this many scalars per channel in the half it learns from
MIN_PER_CHANNEL = 8


def candidates(n: int) -> list[int]:
    """The periods tried for a stream of ``n`` scalars, shortest first."""
    out = {1 << k for k in range(13)} | {3 << k for k in range(11)}
    half = min(n, SAMPLE) // 2
    return sorted(p for p in out if p <= MAX_PERIOD and p * MIN_PER_CHANNEL <= max(half, 1))


def detect_period(words: np.ndarray) -> int:
    """The channel period of the 1-D array of 8/16/32-bit ``words`` (see the module's notes).

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> scales = np.float32(2.0) ** rng.integers(-8, 8, 64)
    >>> x = (rng.standard_normal((512, 64)) * scales).astype(np.float32).reshape(-1)
    >>> detect_period(x.view(np.uint32))
    64
    """
    sample = np.ascontiguousarray(words[:SAMPLE]).reshape(-1)
    sample = sample.view(f"u{sample.dtype.itemsize}")  # the top byte of a signed view too
    n = int(sample.size)
    periods = candidates(n)
    if len(periods) <= 1:
        return 1
    bits = sample.dtype.itemsize * 8
    top = sample >> (bits - 8) if bits > 8 else sample
    symbols, inv = np.unique(top, return_inverse=True)
    k = int(symbols.size)
    half = n // 2
    index = np.arange(n, dtype=np.int64)
    train, test = slice(0, half), slice(half, n)
    # every channel's histogram backs off to the pooled one (PRIOR scalars' worth of it): a
    # channel seen a few hundred times is judged on what it shows, not on a flat prior
    pooled = np.bincount(inv[train], minlength=k) + 0.5
    pooled = pooled / pooled.sum()
    prior = PRIOR * pooled[inv[test]]
    scores = []
    for p in periods:
        channel = index % p
        key = channel * k + inv
        counts = np.bincount(key[train], minlength=p * k)
        seen = np.bincount(channel[train], minlength=p)
        prob = (counts[key[test]] + prior) / (seen[channel[test]] + PRIOR)
        scores.append(-float(np.log2(prob).mean()))
    best = min(scores)
    return next(p for p, s in zip(periods, scores) if s <= best + TOLERANCE)


__all__ = ["detect_period"]
