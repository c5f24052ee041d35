"""speckv: lossless compression of LLM KV caches by speculative coding.

A cheap predictor guesses every cache scalar (`mu`) with a typical error (`sigma`); a range
coder driven by a Gaussian mixture around the guess stores the true value in a few bits, and
`decode` gives it back bit for bit.

>>> import numpy as np, ml_dtypes, speckv
>>> rng = np.random.default_rng(0)
>>> mu = rng.standard_normal((64, 128)).astype(np.float32)
>>> sigma = np.full(128, 0.05, dtype=np.float32)
>>> x = (mu + 0.05 * rng.standard_normal(mu.shape)).astype(ml_dtypes.bfloat16)
>>> data = speckv.encode(x, mu, sigma)
>>> y = speckv.decode(data, mu, sigma)
>>> bool((y.view(np.uint16) == x.view(np.uint16)).all())
True
"""

from ._api import (
    THREADS_ENV,
    Joint,
    TokenScale,
    cut_stream,
    decode,
    encode,
    ideal_bits,
    info,
    join_streams,
    joint_integer,
    kernel_report,
    residuals,
    restore_model,
    sigma_codes,
)
from ._arrays import SUPPORTED_DTYPES
from ._speckv import (
    BINS_VERSION,
    FAST_LANE_VERSION,
    FORMAT_VERSION,
    ChecksumError,
    CorruptStreamError,
    PredictionMismatchError,
    SpeckvError,
    UnsupportedStreamError,
    kernels,
)

__version__ = "0.1.0"

__all__ = [
    "BINS_VERSION",
    "FAST_LANE_VERSION",
    "FORMAT_VERSION",
    "SUPPORTED_DTYPES",
    "THREADS_ENV",
    "ChecksumError",
    "Joint",
    "TokenScale",
    "CorruptStreamError",
    "PredictionMismatchError",
    "SpeckvError",
    "UnsupportedStreamError",
    "cut_stream",
    "decode",
    "encode",
    "ideal_bits",
    "info",
    "join_streams",
    "joint_integer",
    "kernel_report",
    "kernels",
    "residuals",
    "restore_model",
    "sigma_codes",
]
