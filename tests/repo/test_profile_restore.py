"""``benches/profile_restore.py``'s record-and-replay of a restore's decode calls: the calls
recorded as the extension saw them, replayed on one thread, and written in the layout that
``rust/speckv/examples/decode_replay.rs`` reads (the bytes checked here against the calls)."""

from __future__ import annotations

import pathlib
import sys

import ml_dtypes
import numpy as np

import speckv

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benches"))
import profile_restore  # noqa: E402


def _stream() -> tuple[bytes, np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    mu = rng.normal(size=(4, 64, 32)).astype(np.float32)
    sigma = np.full((4, 1, 32), 0.1, np.float32)
    x = (mu + 0.1 * rng.normal(size=mu.shape)).astype(ml_dtypes.bfloat16)
    codes = speckv.sigma_codes(sigma)
    return speckv.encode(x, mu, sigma_codes=codes, model="bins"), x, mu, codes


def test_decode_calls_are_recorded_replayed_and_written(tmp_path: pathlib.Path) -> None:
    stream, x, mu, codes = _stream()
    calls: list = []
    with profile_restore.recorded_decodes(calls):
        back = speckv.decode(stream, mu, sigma_codes=codes)
    assert np.array_equal(back.view(np.uint16), x.view(np.uint16))
    assert len(calls) == 1
    # outside the context the extension is called as before, unrecorded
    speckv.decode(stream, mu, sigma_codes=codes)
    assert len(calls) == 1
    assert profile_restore.decode_per_core(calls, 2) > 0
    profile_restore.write_calls(calls, str(tmp_path / "calls"))
    folder = tmp_path / "calls"
    assert (folder / "index.txt").read_text() == "0\n"
    assert (folder / "0.stream").read_bytes() == stream
    assert np.array_equal(np.fromfile(folder / "0.mu", np.float32), mu.reshape(-1))
    # the codes broadcast to every scalar, in C order
    assert np.array_equal(np.fromfile(folder / "0.codes", np.int16), np.broadcast_to(codes, mu.shape).reshape(-1))
