"""A synthetic KV-like workload shared by `speckv bench` and benches/bench_codec.py."""

from __future__ import annotations

import ml_dtypes
import numpy as np


def workload(n_scalars: int, channels: int = 512, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """bf16 ``x = mu + noise``: float32 ``mu``, per-channel sigma log-spaced over two decades
    (times a random per-channel magnitude), 0.5% outliers at 20 sigma. Returns x, mu, sigma."""
    rng = np.random.default_rng(seed)
    rows = max(1, n_scalars // channels)
    channel_scale = np.exp(rng.normal(0.0, 0.7, channels)).astype(np.float32)
    sigma = np.logspace(-2.5, -0.5, channels).astype(np.float32) * channel_scale
    mu = (rng.standard_normal((rows, channels)).astype(np.float32) * channel_scale).astype(np.float32)
    noise = rng.standard_normal((rows, channels)).astype(np.float32) * sigma
    outliers = rng.random((rows, channels)) < 0.005
    noise[outliers] *= 20.0
    x = (mu + noise).astype(ml_dtypes.bfloat16)
    return x, mu, sigma
