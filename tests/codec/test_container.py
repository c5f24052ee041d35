"""The cache container: token blocks, layers and K/V addressable, both layouts, version 1
still read, described without torch, and hostile bytes refused with typed errors."""

from __future__ import annotations

import contextlib
import hashlib
import json
import pathlib
import struct
import subprocess
import sys
import weakref

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import speckv  # noqa: E402
from speckv import container  # noqa: E402
from speckv.codec import encode_walk  # noqa: E402
from speckv.hf import ModelPrefixPredictor, SpeculativeCodec, extract_kv  # noqa: E402
from speckv.models.cache import other_kernels, prefill  # noqa: E402
from tiny_models import WORDS, assert_same, calibrated, ids, tiny_model  # noqa: E402,F401  # noqa: E402


@pytest.fixture(scope="module")
def layerwise():
    model = tiny_model("llama")
    codec = SpeculativeCodec(model, predictor=ModelPrefixPredictor(model, layers=2))
    codec.calibrate([ids(48, s) for s in range(6)])
    return model, codec


@pytest.fixture(params=["whole-prompt", "layer-wise"])
def any_codec(request, calibrated, layerwise):  # noqa: F811
    return calibrated if request.param == "whole-prompt" else layerwise


@pytest.mark.parametrize("mode", ["bf16", "fp16", "fp8"])
@pytest.mark.parametrize("block_size", [7, 16, 40, 1000])
def test_blocks_round_trip_and_address_layers(any_codec, mode, block_size):
    model, codec = any_codec
    prompt = ids(40, 3)
    cache = other_kernels(model, prompt)
    data = codec.compress(cache, prompt, mode, block_size=block_size)
    facts = speckv.info(data)
    blocks = -(-40 // min(block_size, 40))
    assert facts["container"] and facts["version"] == 2 and facts["layout"] == "stacked"
    assert (facts["tokens"], facts["blocks"], len(facts["streams"])) == (40, blocks, 2 * blocks)
    assert facts["metadata"]["mode"] == mode and facts["metadata"]["model"] == codec.fingerprint
    back = extract_kv(codec.decompress(data, prompt, dequantize=False))
    assert_same(codec, mode, cache, back)
    k, v = codec.decompress_layer(data, prompt, 2)
    assert torch.equal(v.view(WORDS[mode]), back[2][1].view(WORDS[mode]))
    # the decoded cache does not depend on the block size
    one = codec.compress(cache, prompt, mode, block_size=40)
    assert (
        extract_kv(codec.decompress(one, prompt, dequantize=False))[1][0]
        .view(WORDS[mode])
        .equal(back[1][0].view(WORDS[mode]))
    )


def test_per_layer_layout_round_trips(any_codec, monkeypatch):
    model, codec = any_codec
    monkeypatch.setattr(encode_walk, "choose_layout", lambda tensors: "per-layer")
    prompt = ids(24, 4)
    cache = prefill(model, prompt)
    data = codec.compress(cache, prompt, "bf16", block_size=10)
    facts = speckv.info(data)
    layers = len(cache)
    assert facts["layout"] == "per-layer" and len(facts["streams"]) == 3 * 2 * layers
    assert_same(codec, "bf16", cache, extract_kv(codec.decompress(data, prompt, dequantize=False)))
    k, _ = codec.decompress_layer(data, prompt, layers - 1)
    assert torch.equal(k.view(torch.int16), cache[layers - 1][0].view(torch.int16))


def to_version_1(data: bytes) -> bytes:
    """The version-1 form of a one-block container (what the codec wrote before 2026-12)."""
    c = container.parse(data)
    assert len(c.blocks) == 1
    header = dict(c.metadata, layout=c.layout, layers=c.layers, streams=[])
    per = c.blocks[0][0]
    header.update(layers_per_chunk=per.layers_per_chunk, chunks_per_layer=per.chunks_per_layer)
    offset = 0
    for s in c.blocks[0]:
        header["streams"].append([offset, len(s.data)])
        offset += len(s.data)
    blob = json.dumps(header, sort_keys=True).encode()
    head = b"SPKC" + struct.pack("<HHI", 1, 0, len(blob)) + hashlib.blake2b(blob, digest_size=8).digest() + blob
    return head + b"".join(bytes(s.data) for s in c.blocks[0])


@pytest.mark.parametrize("mode", ["bf16", "fp8"])
def test_version_1_containers_still_decode(any_codec, mode):
    model, codec = any_codec
    prompt = ids(32, 5)
    cache = prefill(model, prompt)
    joint, codec.joint = codec.joint, False  # version 1 had no joint model
    try:
        old = to_version_1(codec.compress(cache, prompt, mode, block_size=64))
    finally:
        codec.joint = joint
    facts = speckv.info(old)
    assert facts["version"] == 1 and facts["blocks"] == 1 and facts["tokens"] == 32
    assert_same(codec, mode, cache, extract_kv(codec.decompress(old, prompt, dequantize=False)))
    damaged = bytearray(old)
    damaged[25] ^= 1
    with pytest.raises(speckv.ChecksumError):
        codec.decompress(bytes(damaged), prompt)


def test_info_reads_a_container_without_torch(calibrated, tmp_path):  # noqa: F811
    model, codec = calibrated
    prompt = ids(20, 6)
    path = tmp_path / "cache.spkc"
    path.write_bytes(codec.compress(prefill(model, prompt), prompt, "fp8", block_size=8))
    script = (
        "import sys, json; sys.modules['torch'] = None\n"
        "import speckv\n"
        f"facts = speckv.info(open({str(path)!r}, 'rb').read())\n"
        "print(json.dumps([facts['blocks'], facts['tokens'], facts['metadata']['mode'], 'speckv.hf' in sys.modules]))"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [3, 20, "fp8", False]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_damaged_bytes_get_typed_errors(calibrated, data):  # noqa: F811
    model, codec = calibrated
    good = _sample(model, codec)
    cut = data.draw(st.integers(0, len(good) - 1))
    flips = data.draw(st.lists(st.tuples(st.integers(0, len(good) - 1), st.integers(1, 255)), max_size=3))
    bad = bytearray(good[:cut] if data.draw(st.booleans()) else good)
    for i, x in flips:
        if i < len(bad):
            bad[i] ^= x
    prompt = ids(24, 7)
    try:
        back = extract_kv(codec.decompress(bytes(bad), prompt, dequantize=False))
    except speckv.SpeckvError:
        return
    # a change that decodes must be one that changed nothing the cache is made of
    want = extract_kv(codec.decompress(good, prompt, dequantize=False))
    for (k, v), (k2, v2) in zip(want, back):
        assert torch.equal(k.view(torch.int16), k2.view(torch.int16))
        assert torch.equal(v.view(torch.int16), v2.view(torch.int16))


def test_forged_metadata_gets_typed_errors(any_codec):
    """Checksums are no signature: a container rebuilt with any metadata (a field dropped, or
    of another JSON type) is refused with a typed error by every reader, never a TypeError
    or KeyError from inside, or decodes to the very cache (a field no decoder reads)."""
    model, codec = any_codec
    good = _sample(model, codec)
    c = container.parse(good)
    blocks = [[bytes(s.data) for s in block] for block in c.blocks]
    forged = []
    for key in c.metadata:
        forged.append({k: v for k, v in c.metadata.items() if k != key})
        forged += [{**c.metadata, key: bad} for bad in (5, None, [], {}, "x", True, 1e300)]
    forged += [{**c.metadata, "joint": "yes"}, {**c.metadata, "mode": "fp8"}, {}]
    prompt = ids(24, 7)
    want = extract_kv(codec.decompress(good, prompt, dequantize=False))
    for meta in forged:
        data = container.pack(meta, c.layout, c.layers, c.block_tokens, c.tokens, blocks)
        try:
            facts = speckv.info(data)
        except speckv.SpeckvError:
            facts = None
        if facts is not None:  # what info reports is what was packed: that metadata, those blocks
            assert facts["metadata"] == meta
            assert (facts["tokens"], facts["blocks"], facts["layout"]) == (c.tokens, len(c.blocks), c.layout)
        with contextlib.suppress(speckv.SpeckvError):
            k, v = codec.decompress_layer(data, prompt, layer=1)
            assert k.dtype == want[1][0].dtype and torch.equal(k.view(torch.int16), want[1][0].view(torch.int16))
        try:
            back = extract_kv(codec.decompress(data, prompt, dequantize=False))
        except speckv.SpeckvError:
            continue
        # what decodes is the cache itself (a field the decoder does not read was changed)
        for (k, v), (k2, v2) in zip(want, back):
            assert k2.dtype == k.dtype and torch.equal(k.view(torch.int16), k2.view(torch.int16)), meta
            assert v2.dtype == v.dtype and torch.equal(v.view(torch.int16), v2.view(torch.int16)), meta


# per codec object (weakly held: a torn-down fixture's codec takes its sample along, and a new
# codec at a reused address cannot find it, as it could under an id() key)
_SAMPLES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _sample(model, codec) -> bytes:
    if codec not in _SAMPLES:
        prompt = ids(24, 7)
        _SAMPLES[codec] = codec.compress(prefill(model, prompt), prompt, "bf16", block_size=8)
    return _SAMPLES[codec]


def test_bad_block_sizes_are_refused(calibrated):  # noqa: F811
    model, codec = calibrated
    prompt = ids(8, 1)
    cache = prefill(model, prompt)
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="block_size"):
            codec.compress(cache, prompt, "bf16", block_size=bad)


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_V1_FIELDS = ("streams", "layers", "layout", "layers_per_chunk", "chunks_per_layer", "mode")


@settings(max_examples=400, deadline=None)
@given(
    fields=st.dictionaries(st.sampled_from(_V1_FIELDS), _JSON),
    streams=st.lists(st.tuples(st.integers(-3, 40), st.integers(-3, 40)), max_size=4),
    use_streams=st.booleans(),
    payload=st.binary(max_size=64),
)
def test_forged_version_1_headers_get_typed_errors(fields, streams, use_streams, payload):
    """A version-1 header's checksum is no signature either: any JSON in it, with a valid
    checksum, is parsed (and described) or refused with a typed error."""
    header = dict(fields)
    if use_streams:
        header["streams"] = [list(s) for s in streams]
    blob = json.dumps(header).encode()
    head = b"SPKC" + struct.pack("<HHI", 1, 0, len(blob)) + hashlib.blake2b(blob, digest_size=8).digest()
    with contextlib.suppress(speckv.SpeckvError):
        speckv.info(head + blob + payload)


@pytest.mark.parametrize("field", ["layers", "layers_per_chunk", "chunks_per_layer", "offset", "length"])
@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan"), 1e300, -(2**70), "7", [1]])
def test_version_1_numbers_of_any_json_kind_are_refused(field, bad):
    """Each number a version-1 header holds, as any JSON value (``Infinity`` included,
    which Python's json reads) with everything else valid: a typed error."""
    header = {"layers": 1, "layout": "stacked", "layers_per_chunk": 1, "chunks_per_layer": 1}
    offset, length = (bad, 0) if field == "offset" else (0, bad) if field == "length" else (0, 0)
    header["streams"] = [[offset, length], [0, 0]]
    if field in header:
        header[field] = bad
    blob = json.dumps(header).encode()
    head = b"SPKC" + struct.pack("<HHI", 1, 0, len(blob)) + hashlib.blake2b(blob, digest_size=8).digest()
    with pytest.raises(speckv.SpeckvError):
        speckv.info(head + blob)


@pytest.mark.parametrize("mode", ["bf16", "fp16", "fp8"])
def test_prompts_of_several_default_blocks(any_codec, mode):
    """A prompt longer than two default blocks (256 tokens): every block's streams, joined
    back in order, bit for bit, and one layer alone."""
    model, codec = any_codec
    prompt = ids(600, 31)
    cache = other_kernels(model, prompt)
    data = codec.compress(cache, prompt, mode)
    facts = speckv.info(data)
    assert (facts["tokens"], facts["blocks"]) == (600, 3)
    assert_same(codec, mode, cache, extract_kv(codec.decompress(data, prompt, dequantize=False)))
    k, v = codec.decompress_layer(data, prompt, 1)
    want = extract_kv(codec.decompress(data, prompt, dequantize=False))[1]
    assert torch.equal(k.view(WORDS[mode]), want[0].view(WORDS[mode]))
    assert torch.equal(v.view(WORDS[mode]), want[1].view(WORDS[mode]))


V1_DIR = pathlib.Path(__file__).resolve().parents[1] / "goldens" / "v1" / "containers"
V1_CONTAINERS = json.loads((V1_DIR / "manifest.json").read_text())


@pytest.fixture(scope="module")
def version_1_files():
    """The model, calibration and prompt the version-1 code made its containers with
    (``goldens/v1/make_containers.py``)."""
    model = transformers.LlamaForCausalLM.from_pretrained(V1_DIR / "model", dtype=torch.bfloat16).eval()
    prompt = torch.tensor([json.loads((V1_DIR / "prompt.json").read_text())])
    return model, str(V1_DIR / "calibration.safetensors"), prompt


def _layer_digests(kv, mode: str) -> list[list[str]]:
    def digest(t: torch.Tensor) -> str:
        return hashlib.sha256(t.contiguous().view(WORDS[mode]).numpy().tobytes()).hexdigest()

    return [[digest(t) for t in pair] for pair in kv]


@pytest.mark.parametrize("name", sorted(V1_CONTAINERS))
def test_version_1_containers_from_the_version_1_code_decode(version_1_files, name):
    """Containers, a calibration file and a model written by the version-1 code itself (both
    layouts, bf16/fp16/fp8, exact and fast streams): the current codec loads that calibration
    as it is, rebuilds its statistics predictor, and decodes every layer to the words the
    version-1 code recorded before encoding; one layer alone too."""
    model, calibration, prompt = version_1_files
    want = V1_CONTAINERS[name]
    data = (V1_DIR / f"{name}.spkc").read_bytes()
    facts = speckv.info(data)
    assert (facts["version"], facts["layout"], facts["tokens"]) == (1, want["layout"], prompt.shape[1])
    codec = SpeculativeCodec.load(calibration, model)
    back = extract_kv(codec.decompress(data, prompt, dequantize=False))
    assert _layer_digests(back, want["mode"]) == want["layers"]
    k, v = codec.decompress_layer(data, prompt, 1)
    assert _layer_digests([(k, v)], want["mode"]) == want["layers"][1:2]
    if want["mode"] == "fp8":  # dequantized with the version-1 calibration's scales
        scales = codec.calibration.fp8_scales
        restored = extract_kv(codec.decompress(data, prompt))
        assert torch.equal(restored[2][1], (back[2][1].float() * float(scales[2, 1])).to(torch.bfloat16))
