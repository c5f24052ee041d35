"""Shared test helpers: arrays of any bit patterns in every dtype; a child with other kernels."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

DTYPES = {
    "bfloat16": (ml_dtypes.bfloat16, np.uint16),
    "float16": (np.float16, np.uint16),
    "float8_e4m3fn": (ml_dtypes.float8_e4m3fn, np.uint8),
    "float8_e5m2": (ml_dtypes.float8_e5m2, np.uint8),
    "float32": (np.float32, np.uint32),
}

# Patterns every format must get right: zeros, infinities/NaNs with payloads, subnormals,
# extremes of the magnitude.
SPECIALS = {
    np.uint16: [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0, 0x7F81, 0xFFFF, 0x0001, 0x8001, 0x7F7F, 0x7C00, 0xFC00, 0x7E01],
    np.uint8: [0x00, 0x80, 0x7F, 0xFF, 0x01, 0x81, 0x7E, 0x78, 0x7C, 0xFC, 0x7D],
    np.uint32: [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00001, 0xFFFFFFFF, 1, 0x80000001, 0x7F7FFFFF],
}

shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=9)
# Scalars per chunk: small ones cut the drawn arrays (at most 9^4 scalars) into many chunks, so
# that the thread counts drawn with them really spread chunks over threads (None: the default,
# one chunk for arrays this small).
chunk_sizes = st.one_of(st.none(), st.integers(1, 64), st.sampled_from([7, 100, 1000]))
thread_counts = st.sampled_from([1, 2, 3, 8])


@st.composite
def bit_arrays(draw, word, shape=None):
    """Arrays of `word` whose elements are arbitrary patterns, specials, or near each other."""
    if shape is None:
        shape = draw(shapes)
    info = np.iinfo(word)
    element = st.one_of(
        st.integers(int(info.min), int(info.max)),
        st.sampled_from(SPECIALS[word]),
    )
    return draw(hnp.arrays(word, shape, elements=element))


def as_dtype(words: np.ndarray, name: str) -> np.ndarray:
    return words.view(DTYPES[name][0])


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    word = DTYPES[a.dtype.name][1]
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.view(word), b.view(word))


def run_in_child(code: str, stdin: bytes, simd: str) -> str:
    """Runs Python ``code`` in a child process with ``SPECKV_SIMD=simd`` and ``stdin`` as its
    standard input; returns what it printed (stripped). The kernel cross-checks use it: a
    process picks its kernels once, at start."""
    env = {**os.environ, "SPECKV_SIMD": simd}
    out = subprocess.run([sys.executable, "-c", code], input=stdin, capture_output=True, env=env, check=True)
    return out.stdout.decode().strip()


def words_digest(x) -> str:
    """XXH3 of an array's bit patterns (16-bit words)."""
    import xxhash

    return xxhash.xxh3_64_hexdigest(np.ascontiguousarray(x).view(np.uint16).tobytes())


def decoded_in_child(stream: bytes, simd: str, module: str, case: str) -> str:
    """``words_digest`` of ``stream`` decoded in a child with ``SPECKV_SIMD=simd``, against the
    prediction of ``case`` (a call of a function of the test module ``module``, dotted from
    ``tests/`` as ``core.test_bins``, returning ``(x, mu, sigma)`` or ``(x, mu, sigma, joint)``,
    rebuilt in the child from its seeds)."""
    code = (
        "import sys, speckv\n"
        f"sys.path.insert(0, {str(Path(__file__).resolve().parent)!r})\n"
        f"from {module} import {case.split('(')[0]}\n"
        "from helpers import words_digest\n"
        f"case = {case}\n"
        "joint = case[3] if len(case) > 3 else None\n"
        "print(words_digest(speckv.decode(sys.stdin.buffer.read(), case[1], case[2], joint=joint)))\n"
    )
    return run_in_child(code, stream, simd)


def pytest_elsewhere(python: str, path: Path, env: dict[str, str] | None = None) -> str:
    """``python -m pytest path`` in another virtualenv (vLLM's, LMCache's), from the repository
    root: it must pass with nothing skipped. Returns its output."""
    run = subprocess.run(
        [python, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", str(path)],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parent.parent,
        timeout=1200,
        env=env,
    )
    tail = run.stdout[-4000:] + run.stderr[-2000:]
    assert run.returncode == 0, tail
    assert " passed" in run.stdout and "skipped" not in run.stdout, tail
    return run.stdout


def made_once(tmp_path_factory, name: str, make) -> Path:
    """``name`` in the test run's common temporary folder (the pytest-xdist workers share it),
    made by ``make(path)`` once per run: the first process to ask makes it under a lock, and
    a marker written after ``make`` returns tells the others it is whole."""
    from filelock import FileLock  # a requirement of torch: the callers need torch

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the workers' common folder
    path, done = root / name, root / f"{name}.done"
    with FileLock(str(root / f"{name}.lock")):
        if not done.exists():
            make(path)
            done.touch()
    return path


def record_calls(monkeypatch, owner, name, describe):
    """``owner.name`` replaced (for the test) with a wrapper that calls it and appends
    ``describe(*args, result)`` to the list returned: what a test asserts about the calls."""
    seen = []
    real = getattr(owner, name)

    def spy(*args):
        got = real(*args)
        seen.append(describe(*args, got))
        return got

    monkeypatch.setattr(owner, name, spy)
    return seen
