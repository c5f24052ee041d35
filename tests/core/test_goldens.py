"""Format goldens: multi-chunk streams of every dtype and model, and a cache container per
layout, written from fixed seeds and committed as files (``tests/goldens/``).

The rule, enforced here: while ``speckv.FORMAT_VERSION``, ``speckv.FAST_LANE_VERSION`` and
``speckv.BINS_VERSION`` are the ones recorded in ``goldens/manifest.json``, the encoder writes
every golden byte for byte;
a change that alters a golden is a format change, so it bumps a version, and then the files
written under the old one must still decode (they always must). Regenerating the files is a
deliberate act: ``python tests/core/test_goldens.py --write`` (and only with a version bump).
"""

from __future__ import annotations

import json
import pathlib
import sys

import ml_dtypes
import numpy as np
import pytest

import speckv
from speckv import container

HERE = pathlib.Path(__file__).resolve().parents[1] / "goldens"
DTYPES = {
    "bf16": ml_dtypes.bfloat16,
    "fp16": np.float16,
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "f32": np.float32,
}
# [layers, channels, tokens]: 9,600 scalars, chunks of 2,000 (five, the last short)
SHAPE, CHUNK = (2, 16, 300), 2_000


def _case(dtype: str, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x, mu (float32) and per-channel sigma ``[channels, 1]`` of a cache-like tensor: channel
    scales over decades, a few outliers."""
    rng = np.random.default_rng(seed)
    sigma = np.exp(rng.normal(-2.0, 1.5, (SHAPE[1], 1))).astype(np.float32)
    mu = (rng.standard_normal(SHAPE) * 3 * sigma).astype(np.float32)
    noise = rng.standard_normal(SHAPE).astype(np.float32) * sigma
    noise[rng.random(SHAPE) < 0.002] *= 50
    return (mu + noise).astype(DTYPES[dtype]), mu, sigma


def _joint(seed: int, scaled: bool, sigma: np.ndarray | None = None) -> speckv.Joint:
    """The joint model of a golden; with ``sigma`` (the case's, per channel) in its integer
    form too (``speckv.joint_integer``)."""
    rng = np.random.default_rng(seed)
    layers, channels, tokens = SHAPE
    coef = (0.2 * rng.standard_normal((layers, channels, channels))).astype(np.float32)
    offset = (0.01 * rng.standard_normal((layers, channels))).astype(np.float32)
    integer = None
    if sigma is not None:
        integer = speckv.joint_integer(channels, coef, np.tile(sigma.reshape(1, -1), (layers, 1)))
    return speckv.Joint(channels, tokens, coef, offset, None, speckv.TokenScale() if scaled else None, integer)


def cases() -> dict[str, tuple[bytes, dict]]:
    """Every golden: name -> (bytes, how to decode them)."""
    out: dict[str, tuple[bytes, dict]] = {}
    for i, dtype in enumerate(DTYPES):
        x, mu, sigma = _case(dtype, 100 + i)
        models = ["exact", "fast", "bins"] if dtype != "f32" else ["fast"]
        for model in models:
            data = speckv.encode(x, mu, sigma, model=model, chunk_size=CHUNK, threads=2)
            out[f"{dtype}-{model}"] = (data, {"dtype": dtype, "seed": 100 + i, "predicted": True})
        for lane in ("fast", "adaptive") if dtype != "f32" else ("adaptive",):  # predictor-free
            data = speckv.encode(x, lane=lane, chunk_size=CHUNK, threads=2)
            out[f"{dtype}-free-{lane}"] = (data, {"dtype": dtype, "seed": 100 + i, "predicted": False})
        if dtype in ("bf16", "e4m3"):  # the joint model, with and without the token scale
            for scaled in (False, True):
                joint = _joint(200 + i, scaled)
                data = speckv.encode(x, mu, sigma, chunk_size=SHAPE[1] * SHAPE[2], joint=joint)
                name = f"{dtype}-joint{'-scaled' if scaled else ''}"
                out[name] = (data, {"dtype": dtype, "seed": 100 + i, "predicted": True, "joint": 200 + i})
        if dtype == "bf16":  # the joint model's integer form (FLAG_JOINT_INT), as the bins model codes it
            for scaled in (False, True):
                joint = _joint(200 + i, scaled, sigma)
                data = speckv.encode(x, mu, sigma, model="bins", chunk_size=SHAPE[1] * SHAPE[2], joint=joint)
                how = {"dtype": dtype, "seed": 100 + i, "predicted": True, "joint": 200 + i, "integer": True}
                out[f"{dtype}-joint-int{'-scaled' if scaled else ''}"] = (data, how)
    # a cache container per layout: 2 layers, K and V, 300 tokens in blocks of 128
    x, mu, sigma = _case("bf16", 300)
    stacked, per_layer = [], []
    for start in range(0, 300, 128):
        part = _block(x, start)
        k = speckv.encode(part, chunk_size=part[0].size)
        stacked.append([k, k])
        per_layer.append([speckv.encode(part[layer]) for layer in range(2) for _ in (0, 1)])
    meta = {"mode": "bf16", "golden": True}
    out["container-stacked"] = (container.pack(meta, "stacked", 2, 128, 300, stacked), {"container": True})
    out["container-per-layer"] = (container.pack(meta, "per-layer", 2, 128, 300, per_layer), {"container": True})
    return out


def _block(x: np.ndarray, start: int) -> np.ndarray:
    """Tokens ``start..start+128`` of ``[layers, channels, tokens]`` as a stacked block
    ``[layers, batch 1, heads 1, tokens, channels]``."""
    return np.ascontiguousarray(x[:, :, start : start + 128].transpose(0, 2, 1))[:, None, None]


def _manifest() -> dict:
    return json.loads((HERE / "manifest.json").read_text())


def test_the_encoder_writes_every_golden_while_the_versions_stand():
    manifest = _manifest()
    if (manifest["format_version"], manifest["fast_lane_version"], manifest["bins_version"]) != (
        speckv.FORMAT_VERSION,
        speckv.FAST_LANE_VERSION,
        speckv.BINS_VERSION,
    ):
        pytest.skip("the format version moved on: the files below are read, no longer written")
    made = cases()
    assert sorted(made) == sorted(manifest["files"]), "a golden was added or removed: regenerate with --write"
    changed = [name for name, (data, _) in made.items() if data != (HERE / f"{name}.spkv").read_bytes()]
    assert not changed, (
        f"{changed}: the encoder no longer writes these goldens. That is a format change: bump "
        "FORMAT_VERSION (or FAST_LANE_VERSION, BINS_VERSION), keep decoding the old streams, then regenerate "
        "(python tests/core/test_goldens.py --write)"
    )


@pytest.mark.parametrize("name", sorted(_manifest()["files"]) if (HERE / "manifest.json").exists() else [])
def test_every_golden_file_decodes(name):
    """The committed bytes decode to the tensors their seeds make, whatever the version now."""
    data = (HERE / f"{name}.spkv").read_bytes()
    how = _manifest()["files"][name]
    if how.get("container"):
        c = container.parse(data)
        x, _, _ = _case("bf16", 300)
        for b, start in enumerate(range(0, 300, 128)):
            part = _block(x, start)
            if c.layout == "stacked":
                got = speckv.decode(c.stream(b, 0, 0).data)
                assert np.array_equal(got.view(np.uint16), part.view(np.uint16))
            else:
                for layer in range(2):
                    got = speckv.decode(c.stream(b, layer, 1).data)
                    assert np.array_equal(got.view(np.uint16), part[layer].view(np.uint16))
        return
    x, mu, sigma = _case(how["dtype"], how["seed"])
    kw = {}
    if "joint" in how:
        # the decoder reads the token scale and the form from the stream
        kw["joint"] = _joint(how["joint"], False, sigma if how.get("integer") else None)
    y = speckv.decode(data, mu, sigma, **kw) if how["predicted"] else speckv.decode(data)
    word = {1: np.uint8, 2: np.uint16, 4: np.uint32}[x.dtype.itemsize]
    assert np.array_equal(np.asarray(y).view(word), x.view(word))
    assert speckv.info(data)["chunks"] >= (1 if "joint" in how else 5)
    if "joint" in how:
        assert speckv.info(data)["joint_integer"] == bool(how.get("integer"))


# Version-1 streams written by the version-1 code itself (5aa81ab, the commit before format 2),
# from this file's cases: name -> (dtype, seed, predicted)
V1 = {
    f"v1-{dtype}-{model}": (dtype, 100 + i, model != "free")
    for i, dtype in enumerate(DTYPES)
    for model in (("exact", "fast", "free") if dtype != "f32" else ("fast", "free"))
}


@pytest.mark.parametrize("name", sorted(V1))
def test_version_1_streams_from_the_version_1_code_decode(name):
    data = (HERE / "v1" / f"{name}.spkv").read_bytes()
    dtype, seed, predicted = V1[name]
    assert speckv.info(data)["version"] == 1 and speckv.info(data)["chunks"] == 5
    x, mu, sigma = _case(dtype, seed)
    y = speckv.decode(data, mu, sigma) if predicted else speckv.decode(data)
    word = {1: np.uint8, 2: np.uint16, 4: np.uint32}[x.dtype.itemsize]
    assert np.array_equal(np.asarray(y).view(word), x.view(word))


# Bins-model streams of version 3 (the first revision, written by this file's cases before
# version 4; moved here from the goldens above when version 4 replaced them): name -> dtype, seed
V3_BINS = {f"v3-{dtype}-bins": (dtype, 100 + i) for i, dtype in enumerate(DTYPES) if dtype != "f32"}


@pytest.mark.parametrize("name", sorted(V3_BINS))
def test_version_3_bins_streams_decode(name):
    data = (HERE / "v3" / f"{name}.spkv").read_bytes()
    dtype, seed = V3_BINS[name]
    assert speckv.info(data)["version"] == 3 and speckv.info(data)["model"] == "bins"
    x, mu, sigma = _case(dtype, seed)
    word = {1: np.uint8, 2: np.uint16}[x.dtype.itemsize]
    assert np.array_equal(np.asarray(speckv.decode(data, mu, sigma)).view(word), x.view(word))


def write() -> None:
    HERE.mkdir(exist_ok=True)
    for old in HERE.glob("*.spkv"):
        old.unlink()
    made = cases()
    for name, (data, _) in made.items():
        (HERE / f"{name}.spkv").write_bytes(data)
    manifest = {
        "format_version": speckv.FORMAT_VERSION,
        "fast_lane_version": speckv.FAST_LANE_VERSION,
        "bins_version": speckv.BINS_VERSION,
        "files": {name: how for name, (_, how) in sorted(made.items())},
    }
    (HERE / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(made)} goldens to {HERE}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/core/test_goldens.py --write   (only with a format version bump)")
    write()
