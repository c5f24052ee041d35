"""Streams cut and joined along the first dimension (``speckv.join_streams``,
``speckv.cut_stream``): the slabs' streams joined are the whole tensor's stream byte for byte,
a cut decodes with a prediction of its rows alone, and misfits are typed errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import speckv
from helpers import DTYPES, as_dtype, bit_arrays, same_bits


@st.composite
def slabbed(draw):
    """(x, mu or None, sigma, chunk size, cut rows): a tensor of 2-3 dimensions and the rows
    at which whole chunks end."""
    name = draw(st.sampled_from(sorted(DTYPES)))
    inner = draw(st.lists(st.integers(1, 6), min_size=1, max_size=2))
    row = int(np.prod(inner))
    rows_per_chunk = draw(st.integers(1, 3))
    rows = draw(st.integers(0, 9))
    x = as_dtype(draw(bit_arrays(DTYPES[name][1], (rows, *inner))), name)
    predicted = draw(st.booleans())
    mu = np.random.default_rng(rows).standard_normal(x.shape).astype(np.float32) if predicted else None
    cuts = sorted(set(draw(st.lists(st.integers(0, rows // rows_per_chunk), max_size=3))))
    return x, mu, rows_per_chunk * row, [c * rows_per_chunk for c in cuts]


def _encode(x, mu, chunk):
    sigma = None if mu is None else np.full(x.shape[-1], 0.3, dtype=np.float32)
    return speckv.encode(x, mu, sigma, chunk_size=chunk), sigma


@settings(max_examples=150, deadline=None)
@given(slabbed())
def test_joined_slabs_are_the_whole_stream_and_cuts_decode_alone(case):
    x, mu, chunk, cuts = case
    whole, sigma = _encode(x, mu, chunk)
    bounds = [0, *[c for c in cuts if 0 < c < x.shape[0]], x.shape[0]]
    parts = []
    for lo, hi in zip(bounds, bounds[1:]):
        part, _ = _encode(x[lo:hi], None if mu is None else mu[lo:hi], chunk)
        parts.append(part)
    assert speckv.join_streams(parts or [whole]) == whole
    rows_per_chunk = chunk // int(np.prod(x.shape[1:]))
    for lo, hi, part in zip(bounds, bounds[1:], parts):
        cut = speckv.cut_stream(whole, (lo // rows_per_chunk, -(-hi // rows_per_chunk)))
        assert cut == part
        got = speckv.decode(cut, None if mu is None else mu[lo:hi], sigma)
        assert same_bits(got, x[lo:hi])


def test_misfits_are_typed_errors():
    x = np.arange(48, dtype=np.float32).reshape(6, 8).astype(np.float16)
    a = speckv.encode(x[:3], chunk_size=16)  # 24 scalars: ends inside its second chunk
    b = speckv.encode(x[3:], chunk_size=16)
    with pytest.raises(speckv.SpeckvError, match="inside a chunk"):
        speckv.join_streams([a, b])
    with pytest.raises(speckv.SpeckvError, match="not coded like"):
        speckv.join_streams([speckv.encode(x[:2], chunk_size=16), speckv.encode(x[2:], chunk_size=8)])
    with pytest.raises(speckv.SpeckvError, match="rows"):
        speckv.cut_stream(speckv.encode(x, chunk_size=12), (0, 1))  # 1.5 rows
    with pytest.raises(speckv.SpeckvError, match="within"):
        speckv.cut_stream(speckv.encode(x, chunk_size=16), (1, 9))
    with pytest.raises(speckv.SpeckvError, match="two dimensions"):
        speckv.cut_stream(speckv.encode(x.reshape(-1), chunk_size=16), (0, 1))
    with pytest.raises(speckv.CorruptStreamError):
        speckv.join_streams([a[:-1]])
    with pytest.raises(speckv.SpeckvError, match="no streams"):
        speckv.join_streams([])
    with pytest.raises(TypeError):
        speckv.join_streams(a)  # type: ignore[arg-type]
