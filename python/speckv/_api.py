"""The public numpy/torch API over the Rust core."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

from . import _arrays, _speckv, container
from ._channels import detect_period
from ._joint import DEFAULT_TOKEN_SCALE as DEFAULT_TOKEN_SCALE
from ._joint import Joint as Joint
from ._joint import TokenScale as TokenScale
from ._joint import joint_integer as joint_integer
from ._joint import token_scale_args as token_scale_args

if TYPE_CHECKING:
    from ._speckv import _Options

THREADS_ENV = "SPECKV_NUM_THREADS"

Model = Literal["exact", "fast", "bins"]
Lane = Literal["fast", "adaptive"]


def residuals(x: Any, mu: Any) -> np.ndarray:
    """``value(x) - mu`` per scalar in float32 (0 where not finite), flat: what the joint model
    conditions on, computed in Rust so encoder and decoder agree."""
    x_np, name = _target(x)
    mu_np = np.ascontiguousarray(_arrays.to_numpy(mu), dtype=np.float32).reshape(-1)
    return _speckv.residuals(_arrays.words_of(x_np, name).reshape(-1), name, mu_np)


def _check_model(model: str) -> str:
    if model not in ("exact", "fast", "bins"):
        raise ValueError(f"model: expected 'exact', 'fast' or 'bins', got {model!r}")
    return model


def resolve_threads(threads: int | None) -> int:
    """`threads`, else $SPECKV_NUM_THREADS, else every core."""
    if threads is None:
        env = os.environ.get(THREADS_ENV)
        if env is not None:
            try:
                threads = int(env)
            except ValueError:
                raise ValueError(f"{THREADS_ENV}={env!r} is not an integer") from None
        else:
            threads = os.cpu_count() or 1
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)):
        raise TypeError(f"threads: expected an int, got {type(threads).__name__}")
    if threads < 1:
        raise ValueError(f"threads: must be at least 1, got {threads}")
    return int(threads)


def _prediction(mu: Any, sigma: Any, sigma_codes: Any) -> tuple[Any, Any, Any, Any]:
    """The extension's prediction arguments: mu as flat float32 with its shape, sigma (float32
    values or int16 codes) flat with the shape it broadcasts from. Shapes are checked against
    the tensor's in the extension, in the same call that codes."""
    if sigma is not None and sigma_codes is not None:
        raise ValueError("give sigma or sigma_codes, not both")
    if sigma_codes is not None:
        sigma = sigma_codes
    if mu is None and sigma is None:
        return None, None, None, None
    if mu is None:
        raise ValueError("sigma was given without mu: give both or neither")
    if sigma is None:
        raise ValueError("mu was given without sigma: give both or neither")
    mu_np = _arrays.to_numpy(mu)
    if mu_np.dtype.kind not in "fV" and mu_np.dtype.name not in _arrays.SUPPORTED_DTYPES:
        raise TypeError(f"mu: expected a floating-point array, got dtype {mu_np.dtype}")
    # Rounded to float32 once, here: finer than any 8/16-bit target's grid, so a prediction
    # that falls between two representable values keeps that information.
    with np.errstate(over="ignore", invalid="ignore"):
        mu_words = np.ascontiguousarray(mu_np, dtype=np.float32).reshape(-1)
    sigma_np = _arrays.to_numpy(sigma)
    if sigma_codes is not None:
        if sigma_np.dtype != np.int16:
            raise TypeError(f"sigma_codes: expected int16 codes (see speckv.sigma_codes), got dtype {sigma_np.dtype}")
        values = np.ascontiguousarray(sigma_np).reshape(-1)
    else:
        if sigma_np.dtype.kind not in "fiuV" and sigma_np.dtype.name not in _arrays.SUPPORTED_DTYPES:
            raise TypeError(f"sigma: expected positive floats, got dtype {sigma_np.dtype}")
        values = np.ascontiguousarray(sigma_np, dtype=np.float32).reshape(-1)
    return mu_words, list(mu_np.shape), values, list(sigma_np.shape)


def sigma_codes(sigma: Any) -> np.ndarray:
    """The integer form of `sigma` the coder uses: ``round(8 log2 sigma)`` per value, as int16,
    same shape. Pass it as ``sigma_codes=`` to `encode`/`decode`/`ideal_bits` to skip the
    conversion (or to feed codes that another producer, e.g. a GPU kernel, computed).

    >>> import numpy as np, speckv
    >>> speckv.sigma_codes(np.array([1.0, 0.5, 0.01], dtype=np.float32)).tolist()
    [0, -8, -53]
    """
    arr = np.asarray(_arrays.to_numpy(sigma), dtype=np.float32)
    return _speckv.sigma_codes(np.ascontiguousarray(arr).reshape(-1)).reshape(arr.shape)


def _target(x: Any) -> tuple[np.ndarray, str]:
    if not (isinstance(x, np.ndarray) or _arrays.is_torch(x)):
        raise TypeError(f"x: expected a numpy array or torch tensor, got {type(x).__name__}")
    name = _arrays.dtype_name(x, "x")
    return _arrays.to_numpy(x), name


def _coding_args(x: Any) -> tuple[Any, str, list[int]]:
    """The extension's encode / ideal_bits target: x's words, dtype name and shape."""
    x_np, name = _target(x)
    shape = [int(d) for d in x_np.shape]
    return _arrays.words_of(x_np, name), name, shape


def _prediction_arg(mu: Any, sigma: Any, sigma_codes: Any, joint: Joint | None) -> tuple[Any, ...] | None:
    """The extension's ``prediction`` argument: ``_prediction``'s four arrays and shapes and
    the joint model's arguments, one tuple; None without a prediction."""
    parts = _prediction(mu, sigma, sigma_codes)
    if parts[0] is None:
        if joint is not None:
            raise _speckv.SpeckvError("joint: the joint model needs mu and sigma")
        return None
    return (*parts, None if joint is None else joint.args())


def _options(
    *,
    threads: int | None,
    chunk_scalars: int,
    model: Any,
    joint: Joint | None,
    torch_hint: bool = False,
    fast_lane: bool = False,
    context_period: int | None = None,
) -> _Options:
    """The extension's ``options`` argument, every key."""
    return {
        "threads": resolve_threads(threads),
        "chunk_scalars": int(chunk_scalars),
        "model": _check_model(model),
        "weights": None,
        "token_scale": token_scale_args(joint),
        "torch_hint": torch_hint,
        "fast_lane": fast_lane,
        "context_period": context_period,
    }


def kernel_report() -> dict[str, str]:
    """The kernel each part of the core runs in this process (they differ by CPU and by
    ``SPECKV_SIMD``; every kernel of a part computes the same bits): the exact model's coder,
    the bins model's decoder, the fast lane's decoder, the joint sums (float32 and integer
    forms) and the maps' sums. Benchmarks print it beside their figures.

    >>> import speckv
    >>> sorted(speckv.kernel_report())
    ['bins', 'exact', 'fast_lane', 'joint', 'joint_integer', 'maps']
    """
    return dict(_speckv.kernel_report())


def restore_model(dtype: str, forward_pass: bool = False) -> Model:
    """The model for a stream that is restored often (a prefix store's blocks, an LMCache
    chunk), by the rule the codec's own stores use: ``"bins"`` for 16-bit formats, ``"exact"``
    for the others. Measured on the demo model's caches (``speckv eval --text legal --coder
    exact|bins``, format version 4): the bins model costs +0.30% bits with the default
    predictor, +0.23% with ``map``, +0.09% with statistics, and decodes 2-3x faster; on fp8's
    coarse grid it costs +1.1-3.2% and decodes no faster. ``dtype``: a numpy/ml_dtypes name
    (``"bfloat16"``) or a codec mode (``"bf16"``). ``forward_pass`` (whether the predictor
    runs the model at restore) no longer changes the pick: version 3's bins model lost 1-2%
    where the model's own layers predict, version 4's does not; it is kept for callers that
    pass it.

    >>> restore_model("bfloat16"), restore_model("fp8"), restore_model("bf16", forward_pass=True)
    ('bins', 'exact', 'bins')
    """
    del forward_pass  # the pick no longer depends on it (docstring)
    return "bins" if dtype in ("bfloat16", "float16", "bf16", "fp16") else "exact"


def encode(
    x: Any,
    mu: Any = None,
    sigma: Any = None,
    *,
    sigma_codes: Any = None,
    threads: int | None = None,
    chunk_size: int | None = None,
    model: Model = "exact",
    joint: Joint | None = None,
    lane: Lane | None = None,
    channels: int | None = None,
) -> bytes:
    """Compress `x` losslessly, against the prediction `mu` with typical error `sigma` if given.

    `x` is a numpy array (ml_dtypes bfloat16 / float8, float16, float32) or a torch tensor.
    `mu` has x's shape and any float dtype (it is rounded to float32 once); `sigma` holds
    positive floats broadcastable to x's shape (a per-channel vector is the usual case), or
    give ``sigma_codes=`` (int16, from `sigma_codes`) instead. Give the same `mu` and `sigma`
    to `decode`.

    Without them the stream is predictor-free, coded by one of two lanes (`lane`; `decode`
    needs no hint): ``"fast"`` (the default for 8- and 16-bit formats whose chunks hold at
    least 4,096 scalars; format version 3)
    fixes per chunk a few static tables of the patterns' sign and exponent bits, each shared
    by the channels whose distributions are alike, and decodes by table lookups (hundreds of
    millions of scalars per second per core); ``"adaptive"`` (float32, smaller tensors, and
    older streams) adapts its counts scalar by scalar, slower. Scalar ``i`` is channel ``i % channels``
    (default: the last dimension; for a layout ``[..., tokens, heads, head_dim]`` give
    ``heads * head_dim``). A 1-D `x` (a flattened cache) has no channels to read from its
    shape: without ``channels=`` its period is found from its words (``speckv._channels``:
    the period of KV layouts under which its sign and exponent bytes are best predicted; 1
    where none helps), never one channel per scalar.

    `model` picks how predicted scalars are coded (the stream records it; `decode` needs no
    hint): ``"exact"`` integrates the Gaussian mixture over each value's rounding interval
    around the float32 `mu` (smallest output; the default), ``"fast"`` counts the residual in
    ulps of `mu` rounded to x's dtype and codes it from precomputed tables (faster to decode,
    a few percent larger where sigma spans binades), ``"bins"`` (8/16-bit formats) codes the
    same mixture at a quarter to an eighth of sigma's resolution from static tables with
    interleaved rANS (format version 4; version 3 streams still decode): several times faster to
    decode than ``"exact"`` for a few thousandths of a bit per scalar plus its rANS states (~0.016
    bits per scalar of a 24,576-scalar chunk), what ``restore_model`` picks for 16-bit caches.
    float32 always uses ``"fast"``.
    `chunk_size` sets the scalars per independently coded chunk (default 2^17; 2^16 in the
    fast lane, whose tables are per chunk).

    >>> import numpy as np, ml_dtypes, speckv
    >>> x = np.linspace(-1, 1, 4096, dtype=np.float32).astype(ml_dtypes.bfloat16)
    >>> data = speckv.encode(x)
    >>> bool((speckv.decode(data).view(np.uint16) == x.view(np.uint16)).all())
    True
    """
    words, name, shape = _coding_args(x)
    prediction = _prediction_arg(mu, sigma, sigma_codes, joint)
    scalars = int(np.prod(shape, dtype=np.int64))
    predicted = prediction is not None
    fast = _fast_lane(lane, name, predicted=predicted, scalars=scalars, chunk=chunk_size)
    default_chunk = _speckv.FAST_LANE_CHUNK_SCALARS if fast else _speckv.DEFAULT_CHUNK_SCALARS
    if channels is not None and (
        isinstance(channels, bool) or not isinstance(channels, (int, np.integer)) or channels < 1
    ):
        raise ValueError(f"channels: expected a positive int, got {channels!r}")
    if channels is None and len(shape) <= 1 and not predicted:
        channels = detect_period(words)
    options = _options(
        threads=threads,
        chunk_scalars=default_chunk if chunk_size is None else int(chunk_size),
        model=model,
        joint=joint,
        torch_hint=_arrays.is_torch(x),
        fast_lane=fast,
        context_period=None if channels is None else int(channels),
    )
    return _speckv.encode(words, name, shape, options, prediction)


# Chunks below this many scalars take the adaptive lane unless told otherwise: a fast-lane
# chunk carries its tables and 128 bytes of coder state, ~300 bytes in all, which the smaller
# tables pay for from about here on (measured on the demo model's caches).
FAST_LANE_MIN_SCALARS = 4096


def _fast_lane(lane: Lane | None, dtype_name: str, *, predicted: bool, scalars: int, chunk: int | None) -> bool:
    """Whether a stream goes through the fast lane. ``lane=None``: predictor-free 8/16-bit
    streams whose chunks hold at least ``FAST_LANE_MIN_SCALARS`` scalars; ``"fast"``: those
    of any size (elsewhere an error); ``"adaptive"``: never."""
    if lane not in (None, "fast", "adaptive"):
        raise ValueError(f"lane: expected 'fast', 'adaptive' or None, got {lane!r}")
    codable = not predicted and dtype_name != "float32"
    if lane == "fast" and not codable:
        why = "coded against mu/sigma" if predicted else "float32"
        raise ValueError(f"lane='fast': the fast lane codes predictor-free 8- and 16-bit streams, not {why} ones")
    if lane is None:
        per_chunk = min(scalars, _speckv.FAST_LANE_CHUNK_SCALARS if chunk is None else int(chunk))
        return codable and per_chunk >= FAST_LANE_MIN_SCALARS
    return lane == "fast"


def _stream_array(data: Any) -> np.ndarray:
    if isinstance(data, np.ndarray):
        if data.dtype != np.uint8 or data.ndim != 1:
            raise TypeError("data: expected bytes or a 1-D uint8 array")
        return np.ascontiguousarray(data)
    try:
        return np.frombuffer(data, dtype=np.uint8)
    except TypeError:
        raise TypeError(f"data: expected bytes-like, got {type(data).__name__}") from None


def info(data: Any) -> dict[str, Any]:
    """Facts about a stream (validated header): version, dtype, shape, model, chunks, sizes,
    bits per scalar. For a cache container (``SpeculativeCodec.compress``'s bytes; read
    without torch or the model): ``"container": True``, its layout, layers, tokens, token
    blocks, metadata and each stream's facts (see ``speckv.container.describe``).

    >>> import numpy as np, speckv
    >>> speckv.info(speckv.encode(np.zeros(64, dtype=np.float16)))["shape"] == [64]
    True
    """
    arr = _stream_array(data)
    if bytes(arr[:4]) == b"SPKC":
        return container.describe(arr)
    return _speckv.info(arr)


def decode(
    data: Any,
    mu: Any = None,
    sigma: Any = None,
    *,
    sigma_codes: Any = None,
    threads: int | None = None,
    chunks: tuple[int, int] | range | None = None,
    joint: Joint | None = None,
) -> Any:
    """Decompress a stream from `encode`, bit for bit, with the same `mu` and `sigma` (or
    ``sigma_codes``).

    With ``chunks=(start, stop)`` only those chunks are read and checked, and the result is
    the 1-D run of their scalars (chunk ``i`` holds scalars ``i * chunk_size`` onwards);
    `mu` and `sigma` still describe the whole tensor.

    Returns a numpy array of the original dtype and shape, or a CPU torch tensor if `encode`
    was given a torch tensor (and torch is importable) or `mu` is a torch tensor. Raises
    `PredictionMismatchError` if `mu`/`sigma` are not the encoder's, `CorruptStreamError`
    (or its subclass `ChecksumError`) if the bytes were damaged.
    """
    arr = _stream_array(data)
    span = None
    if chunks is not None:
        span = (chunks.start, chunks.stop) if isinstance(chunks, range) else (int(chunks[0]), int(chunks[1]))
        if min(span) < 0:
            raise ValueError(f"chunks: {span} is not a range of chunk indices")
    words, meta = _speckv.decode(
        arr, _prediction_arg(mu, sigma, sigma_codes, joint), threads=resolve_threads(threads), chunks=span
    )
    out = words.view(_arrays.numpy_dtype(meta["dtype"]))
    if span is None:
        out = out.reshape(meta["shape"])
    if meta["torch_hint"] or _arrays.is_torch(mu):
        try:
            return _arrays.to_torch(out)
        except ImportError:
            return out
    return out


def decode_many(items: list[tuple[Any, Any, Any, Joint | None]], threads: int | None = None) -> list[Any]:
    """`decode` of several predicted streams in one call: ``items`` are ``(data, mu,
    sigma_codes, joint)``, each stream decoded against its own prediction, the streams spread
    over ``threads`` threads (one a thread at a time; the same words as `decode` of each).
    Returns each as `decode` would, shaped like its ``mu`` (a torch tensor where ``mu`` is
    one). Raises the first failing stream's error (`PredictionMismatchError`,
    `CorruptStreamError`, ...)."""
    args = []
    for data, mu, codes, joint in items:
        prediction = _prediction_arg(mu, None, codes, joint)
        if prediction is None:
            raise ValueError("decode_many: every stream needs its mu and sigma codes")
        args.append((_stream_array(data), prediction))
    out = []
    for (words, dtype), (_, mu, _, _) in zip(_speckv.decode_many(args, threads=resolve_threads(threads)), items):
        got = words.view(_arrays.numpy_dtype(dtype)).reshape(tuple(mu.shape))
        out.append(_arrays.to_torch(got) if _arrays.is_torch(mu) else got)
    return out


def join_streams(streams: list[bytes]) -> bytes:
    """The stream `encode` writes for a tensor, from the streams of its consecutive slabs
    along the first dimension (at least two dimensions), coded alike (dtype, prediction or
    not, model, chunk size); every slab but the last must hold whole chunks. Only headers are
    rewritten: a codec can code a tensor slab by slab as its prediction comes.

    >>> import numpy as np, ml_dtypes, speckv
    >>> x = np.linspace(-1, 1, 4096, dtype=np.float32).astype(ml_dtypes.bfloat16).reshape(8, 512)
    >>> parts = [speckv.encode(x[:4], chunk_size=1024), speckv.encode(x[4:], chunk_size=1024)]
    >>> speckv.join_streams(parts) == speckv.encode(x, chunk_size=1024)
    True
    """
    if isinstance(streams, (bytes, bytearray, memoryview)) or not all(
        isinstance(s, (bytes, bytearray, memoryview)) for s in streams
    ):
        raise TypeError("streams: expected a list of bytes-like streams")
    return _speckv.stream_join([bytes(s) for s in streams])


def cut_stream(data: Any, chunks: tuple[int, int] | range) -> bytes:
    """Chunks ``chunks=(start, stop)`` of a stream (of a tensor of at least two dimensions)
    as a stream of their own: the rows of the first dimension they hold, which `decode` reads
    with a prediction of just those rows. The chunks must start and end on row boundaries."""
    span = (chunks.start, chunks.stop) if isinstance(chunks, range) else (int(chunks[0]), int(chunks[1]))
    if min(span) < 0:
        raise ValueError(f"chunks: {span} is not a range of chunk indices")
    return _speckv.stream_cut(_stream_array(data), span[0], span[1])


def ideal_bits(
    x: Any,
    mu: Any = None,
    sigma: Any = None,
    *,
    sigma_codes: Any = None,
    model: Model = "exact",
    joint: Joint | None = None,
    chunk_size: int | None = None,
) -> float:
    """Bits a perfect coder would spend on `x` under exactly the model `encode` uses (payload
    only; headers and coder overhead excluded), so `8 * len(encode(...)) / ideal_bits(...)`
    is the real coder's overhead. Without `mu` it measures the adaptive lane
    (``lane="adaptive"``): the fast lane chooses its tables as it encodes, so its size is
    ``len(encode(x))``."""
    chunk_scalars = _speckv.DEFAULT_CHUNK_SCALARS if chunk_size is None else int(chunk_size)
    options = _options(threads=None, chunk_scalars=chunk_scalars, model=model, joint=joint)
    return _speckv.ideal_bits(*_coding_args(x), options, _prediction_arg(mu, sigma, sigma_codes, joint))
