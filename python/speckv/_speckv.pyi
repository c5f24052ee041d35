"""Typed stub of the Rust extension (thin binding over the speckv core crate)."""

from typing import Any, TypedDict, final

import numpy as np
import numpy.typing as npt

FORMAT_VERSION: int
FAST_LANE_VERSION: int
BINS_VERSION: int
CONTAINER_VERSION: int
DEFAULT_CHUNK_SCALARS: int
FAST_LANE_CHUNK_SCALARS: int
LINEAR_MAP_MAX_SHIFT: int
DEFAULT_WEIGHTS: tuple[int, int, int]

class SpeckvError(ValueError): ...
class CorruptStreamError(SpeckvError): ...
class ChecksumError(CorruptStreamError): ...
class UnsupportedStreamError(CorruptStreamError): ...
class PredictionMismatchError(SpeckvError): ...

_Words = npt.NDArray[np.uint8] | npt.NDArray[np.uint16] | npt.NDArray[np.uint32]

_Sigma = npt.NDArray[np.float32] | npt.NDArray[np.int16]

# (channels, tokens, outside_channels, outside, coef, offset, integer form or None)
_F32 = npt.NDArray[np.float32]
_Integer = tuple[_F32, npt.NDArray[np.int16], _F32]
_Joint = tuple[int, int, int, _F32, _F32, _F32, _Integer | None]

# (mu flat, mu's shape, sigma values or codes flat, the shape they broadcast from, joint)
_Prediction = tuple[npt.NDArray[np.float32], list[int], _Sigma, list[int], _Joint | None]

class _Options(TypedDict):
    """The coder's options, every key (``speckv._api._options``)."""

    threads: int
    chunk_scalars: int
    model: str
    weights: tuple[int, int, int] | None
    token_scale: tuple[int, int] | None
    torch_hint: bool
    fast_lane: bool
    context_period: int | None

def encode(
    x: _Words, dtype_name: str, shape: list[int], options: _Options, prediction: _Prediction | None = None
) -> bytes: ...
def ideal_bits(
    x: _Words, dtype_name: str, shape: list[int], options: _Options, prediction: _Prediction | None = None
) -> float: ...
def decode(
    data: npt.NDArray[np.uint8],
    prediction: _Prediction | None = None,
    threads: int = 1,
    chunks: tuple[int, int] | None = None,
) -> tuple[_Words, dict[str, Any]]: ...
def decode_into(data: npt.NDArray[np.uint8], out: npt.NDArray[np.uint8], threads: int = 1) -> None: ...
def decode_many(
    items: list[tuple[npt.NDArray[np.uint8], _Prediction]], threads: int = 1
) -> list[tuple[_Words, str]]: ...
def info(data: npt.NDArray[np.uint8]) -> dict[str, Any]: ...
def sigma_codes(sigma: npt.NDArray[np.float32]) -> npt.NDArray[np.int16]: ...
def relative_sigma_codes(
    mu: npt.NDArray[np.float32],
    s: npt.NDArray[np.float32],
    r: npt.NDArray[np.float32],
    heads: int,
    tokens: int,
    dim: int,
) -> npt.NDArray[np.int16]: ...
def kernels() -> str: ...
def kernel_report() -> list[tuple[str, str]]: ...
def map_heads(
    y: npt.NDArray[np.float32],
    stride: int,
    col: int,
    shape: tuple[int, int, int, int],
    rope: tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]] | None = None,
) -> npt.NDArray[np.float32]: ...
def map_kernel() -> str: ...
def fast_lane_kernel() -> str: ...

@final
class LinearMap:
    """A calibrated integer linear map (the layer-wise predictor's maps): the same bits on
    every machine, SIMD width and thread count."""

    def __new__(
        cls,
        features: int,
        outputs: int,
        shift: npt.NDArray[np.int32],
        weights: npt.NDArray[np.int16],
        bias: npt.NDArray[np.float32],
        scale_shift: npt.NDArray[np.int32],
    ) -> LinearMap: ...
    @property
    def features(self) -> int: ...
    @property
    def outputs(self) -> int: ...
    def apply(self, x: npt.NDArray[np.float32], rows: int, threads: int = 1) -> npt.NDArray[np.float32]: ...
    def apply_sources(
        self,
        sources: list[
            tuple[
                npt.NDArray[np.float32],
                int,
                int,
                int,
                npt.NDArray[np.float32] | None,
                npt.NDArray[np.float32] | None,
            ]
        ],
        batch: int,
        rows: int,
        threads: int = 1,
    ) -> npt.NDArray[np.float32]: ...

def container_write(
    layout: tuple[bool, int, int, int, list[int] | None], metadata: bytes, streams: list[bytes]
) -> bytes: ...
def stream_join(streams: list[bytes]) -> bytes: ...
def entry_checksum(key: bytes, payload: bytes) -> int: ...
def stream_cut(data: npt.NDArray[np.uint8], start: int, stop: int) -> bytes: ...
def container_info(data: npt.NDArray[np.uint8]) -> dict[str, Any]: ...
def residuals(x: _Words, dtype_name: str, mu: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]: ...
def joint_integer(
    channels: int, outside: int, coef: npt.NDArray[np.float32], sigma: npt.NDArray[np.float32]
) -> tuple[_F32, npt.NDArray[np.int16], _F32]: ...
def cuda_sources() -> list[tuple[str, str]]: ...
def exact_tables(dtype_name: str) -> dict[str, Any]: ...
def assemble_predicted(
    dtype_name: str,
    shape: list[int],
    chunk_scalars: int,
    chunks: tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint32], npt.NDArray[np.uint64]],
    torch_hint: bool = False,
    joint: tuple[_Joint, tuple[int, int] | None] | None = None,
) -> bytes: ...
def channel_sums(
    t: npt.NDArray[np.float32],
    p: npt.NDArray[np.float32],
    p8: npt.NDArray[np.float32],
    q: npt.NDArray[np.float32],
    scale: float,
    block: tuple[int, int, int],
) -> npt.NDArray[np.uint64]: ...
