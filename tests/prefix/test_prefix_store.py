"""PrefixStore on tiny random models: block-wise exactness, dedup, damaged entries, and every
backend."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from helpers import record_calls  # noqa: E402
from services import redis_url  # noqa: E402,F401  (a redis-server on a loopback port)
from speckv import PredictionMismatchError  # noqa: E402
from speckv.hf import ModelPrefixPredictor, PrefixStore, SpeculativeCodec, extract_kv  # noqa: E402
from speckv.models.cache import other_kernels, prefill  # noqa: E402
from speckv.predictors.calibration import fp8_quantize  # noqa: E402
from speckv.store import DirectoryBackend, MemoryBackend  # noqa: E402
from tiny_models import ids, tiny_model  # noqa: E402

BLOCK = 16


@pytest.fixture(scope="module")
def codec():
    model = tiny_model("llama")
    codec = SpeculativeCodec(model, predictor=ModelPrefixPredictor(model, layers=2))
    codec.calibrate([ids(48, s) for s in range(6)])
    return codec


def stored(codec, dtype, layer, which, t):
    if dtype == "fp8":
        return fp8_quantize(t, float(codec.calibration.fp8_scales[layer, which])).view(torch.uint8)
    return t.to({"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]).view(torch.int16)


def shared_prompts():
    a = ids(64, 1)
    b = torch.cat([a[:, :32], ids(40, 2)], dim=1)  # shares a's first two blocks
    return a, b


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp8"])
def test_prefixes_restore_exactly_and_share_blocks(codec, dtype, tmp_path):
    model = codec.model
    store = PrefixStore(codec, DirectoryBackend(tmp_path / "s"), block_size=BLOCK, dtype=dtype)
    a, b = shared_prompts()
    cache_a, cache_b = other_kernels(model, a), prefill(model, b)
    assert store.match(a) == 0 and store.get(a) == (None, 0)
    assert store.put(a, cache_a) == 64
    assert store.put(a, cache_a) == 0  # all there
    assert store.put(b, cache_b) == 32  # blocks 2 and 3 of b; its last 8 tokens are no block
    assert store.match(b) == 64 and store.match(b[:, :40]) == 32
    stats = store.stats()
    assert stats["blocks"] == 6 and stats["tokens_deduplicated"] == 64 + 32
    raw = sum(t.numel() * 2 for pair in cache_a for t in pair)
    assert stats["bytes"] < raw  # six blocks stored in less than a's four raw
    # what comes back is the stored caches' tokens: a's for the shared blocks, then b's
    for prompt, n, sources in ((a, 64, [(cache_a, 0, 64)]), (b, 64, [(cache_a, 0, 32), (cache_b, 32, 64)])):
        cache, got = store.get(prompt, dequantize=False)
        assert got == n
        back = extract_kv(cache)
        for layer in range(len(back)):
            for w in (0, 1):
                want = torch.cat([src[layer][w][:, :, s:e] for src, s, e in sources], dim=2)
                ref = stored(codec, dtype, layer, w, want)
                assert torch.equal(back[layer][w].view(ref.dtype), ref)
    # a shorter prompt reads the prefix only
    cache, got = store.get(a[:, :20])
    assert got == 16 and extract_kv(cache)[0][0].shape[2] == 16
    # on the device asked for (default: the prompt's)
    cache, got = store.get(a[:, :20], device="meta")
    assert got == 16 and all(t.device.type == "meta" and t.shape[2] == 16 for pair in extract_kv(cache) for t in pair)


def test_a_damaged_entry_ends_the_prefix_and_the_rest_is_served(codec, tmp_path):
    backend = DirectoryBackend(tmp_path / "s")
    store = PrefixStore(codec, backend, block_size=BLOCK)
    a, _ = shared_prompts()
    store.put(a, prefill(codec.model, a))
    third = store.keys(a)[2]
    path = backend._file(third)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x40
    path.write_bytes(bytes(data))
    cache, n = store.get(a)
    assert n == 32 and store.stats()["corrupt_entries"] == 1
    assert extract_kv(cache)[1][1].shape[2] == 32
    # putting the prompt again replaces the damaged block
    assert store.put(a, prefill(codec.model, a)) == 16
    assert store.get(a)[1] == 64


def test_memory_backend_and_other_codecs_are_other_stores(codec):
    store = PrefixStore(codec, MemoryBackend(), block_size=BLOCK)
    a, _ = shared_prompts()
    store.put(a, prefill(codec.model, a))
    assert store.match(a) == 64
    # the same backend seen with another storage dtype or block size holds nothing for it
    assert PrefixStore(codec, store.backend, block_size=BLOCK, dtype="fp8").match(a) == 0
    assert PrefixStore(codec, store.backend, block_size=32).match(a) == 0
    with pytest.raises(TypeError, match="block by block"):
        from speckv.hf import Fp8Predictor

        PrefixStore(SpeculativeCodec(codec.model, None, Fp8Predictor(codec.model)), MemoryBackend())


def test_generate_from_a_restored_prefix_equals_generate_from_the_cache(codec):
    model = codec.model
    store = PrefixStore(codec, MemoryBackend(), block_size=BLOCK)
    a, _ = shared_prompts()
    cache = prefill(model, a)
    store.put(a[:, :48], [(k[:, :, :48], v[:, :, :48]) for k, v in cache])
    prompt = a[:, :56]  # three stored blocks, then 8 tokens for the model
    from speckv.hf import build_cache
    from speckv.models.cache import cache_argument

    cut = build_cache([(k[:, :, :48].clone(), v[:, :, :48].clone()) for k, v in cache])
    reference = model.generate(prompt, do_sample=False, max_new_tokens=10, **{cache_argument(model): cut})
    got = store.generate(prompt, do_sample=False, max_new_tokens=10)
    assert torch.equal(got, reference)
    assert store.stats()["hits"] == 3
    # 56 + 10 tokens, the cache holds 65: the fourth block was stored on the way
    assert store.match(got) == 48 + BLOCK


def test_bad_arguments_are_refused(codec):
    store = PrefixStore(codec, MemoryBackend(), block_size=BLOCK)
    a, _ = shared_prompts()
    cache = prefill(codec.model, a)
    with pytest.raises(ValueError, match="layers"):
        store.put(a, cache[:2])
    with pytest.raises(ValueError, match="tokens"):
        store.put(a, [(k[:, :, :20], v[:, :, :20]) for k, v in cache])
    with pytest.raises(ValueError, match="input_ids"):
        store.get(a[0])
    for bad in ({"block_size": 0}, {"dtype": "int8"}):
        with pytest.raises(ValueError):
            PrefixStore(codec, MemoryBackend(), **bad)
    assert store.get(a[:, : BLOCK - 1]) == (None, 0)  # no whole block


def test_block_keys_are_pinned():
    """The hash chain names stored blocks: an accidental change would orphan every store.
    Golden values from its definition (BLAKE2b-128 over the previous key and the block's ids
    as little-endian int64), computed independently with struct and hashlib."""
    from speckv.prefix.prefix_store import chain_keys

    ids = torch.arange(10)[None, :] * 1000
    golden = ["e93909e562f19ebc1b55747e10d65494", "f7427bd8dc3adad9eb015626e2dcfe6f"]
    assert chain_keys(b"speckv-test", ids, 4) == golden
    assert chain_keys(b"speckv-test", ids[:, :3], 4) == []


class FlakyBackend(MemoryBackend):
    """A memory backend whose reads of some keys fail as an unreachable store's do."""

    def __init__(self) -> None:
        super().__init__()
        self.broken: set[str] = set()

    def get(self, key: str):
        from speckv.store import StoreError

        if key in self.broken:
            raise StoreError(f"{key}: unreachable")
        return super().get(key)


def test_an_unreadable_entry_ends_the_prefix_in_get_put_and_match(codec):
    """A backend error on one block's read serves the blocks before it (get), stores nothing
    past it (put), and match never claims more than get serves."""
    backend = FlakyBackend()
    store = PrefixStore(codec, backend, block_size=BLOCK)
    a, _ = shared_prompts()
    cache = prefill(codec.model, a)
    assert store.put(a, cache) == 64
    backend.broken.add(store.keys(a)[2])
    assert store.match(a) == 32
    restored, n = store.get(a)
    assert n == 32 and extract_kv(restored)[0][0].shape[2] == 32
    assert store.stats()["store_errors"] == 2  # match's read and get's
    assert store.put(a, cache) == 0  # the unreadable block: storing ends there, no raise
    assert store.stats()["store_errors"] == 3


def test_match_checks_each_entry_and_agrees_with_get(codec, tmp_path):
    """An entry that is there but damaged (has() would say True) ends match's prefix too."""
    backend = DirectoryBackend(tmp_path / "s")
    store = PrefixStore(codec, backend, block_size=BLOCK)
    a, _ = shared_prompts()
    store.put(a, prefill(codec.model, a))
    path = backend._file(store.keys(a)[1])
    data = bytearray(path.read_bytes())
    data[-5] ^= 1
    path.write_bytes(bytes(data))
    assert backend.has(store.keys(a)[1])
    assert store.match(a) == 16 == store.get(a)[1]


def test_an_entry_copied_under_another_key_is_not_kept_or_served(codec, tmp_path):
    """A whole entry under the wrong key (a copied or renamed file) passes no check: put stores
    the right one in its place, get never serves it."""
    backend = DirectoryBackend(tmp_path / "s")
    store = PrefixStore(codec, backend, block_size=BLOCK)
    a, _ = shared_prompts()
    cache = prefill(codec.model, a)
    store.put(a, cache)
    keys = store.keys(a)
    backend._file(keys[1]).write_bytes(backend._file(keys[0]).read_bytes())
    assert store.match(a) == 16 and store.get(a)[1] == 16
    assert store.put(a, cache) == 16  # block 1 stored again in its place
    assert store.match(a) == 64 and store.get(a)[1] == 64


# A process that opens a store with the codec of `codec()` (the same seeded model, the
# calibration from a file) and puts its prompt. argv: where (a folder, or a redis:// URL), the
# Redis key prefix, calibration, prompt seed, prompt length, and a mode: "normal"; "crash" dies
# (os._exit) once the first block's entry is written; "crash-mid-put" dies inside the second
# block's entry: the directory backend's temporary file written but not yet renamed, the Redis
# backend's SET half sent.
_WRITER = """
import os, socket, sys
sys.path.insert(0, {tests!r})
from tiny_models import ids, tiny_model
from speckv.hf import Calibration, ModelPrefixPredictor, PrefixStore, SpeculativeCodec
from speckv.models.cache import other_kernels
from speckv.store import DirectoryBackend, RedisBackend
where, prefix, calibration = sys.argv[1:4]
seed, n, mode = int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
model = tiny_model("llama")
predictor = ModelPrefixPredictor(model, layers=2)
codec = SpeculativeCodec(model, Calibration.load(calibration, model, predictor), predictor)
backend = RedisBackend(where, prefix=prefix) if where.startswith("redis://") else DirectoryBackend(where)
put, puts = backend.put, []
def counted_put(key, value, parent=None):
    puts.append(key)
    stored = put(key, value, parent)
    if mode == "crash":
        os._exit(3)
    return stored
backend.put = counted_put
if mode == "crash-mid-put":
    real_sendall, real_fsync = socket.socket.sendall, os.fsync
    def sendall(self, data, *flags):
        if len(puts) == 2 and len(data) > 1000:
            self.send(memoryview(data)[: len(data) // 2])
            os._exit(3)
        return real_sendall(self, data, *flags)
    def fsync(fd):
        if len(puts) == 2:
            os._exit(3)
        return real_fsync(fd)
    socket.socket.sendall, os.fsync = sendall, fsync
prompt = ids(64, 1) if seed == 1 else __import__("torch").cat([ids(64, 1)[:, :32], ids(n - 32, seed)], dim=1)
print(PrefixStore(codec, backend, block_size={block}).put(prompt, other_kernels(model, prompt)))
"""


def _writer(where, calibration, seed, n, mode="normal", prefix="speckv:"):
    import pathlib
    import subprocess
    import sys

    code = _WRITER.format(tests=str(pathlib.Path(__file__).resolve().parents[1]), block=BLOCK)
    args = [sys.executable, "-c", code, str(where), prefix, str(calibration), str(seed), str(n), mode]
    return subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _assert_exact(codec, store, prompt, want_tokens):
    cache, got = store.get(prompt, dequantize=False)
    assert got == want_tokens
    _assert_prefix_of(codec, cache, extract_kv(other_kernels(codec.model, prompt)), got)


def _assert_prefix_of(codec, cache, truth, tokens):
    """``cache`` is the stored form of ``truth``'s first ``tokens`` tokens, bit for bit."""
    for layer, (k, v) in enumerate(extract_kv(cache)):
        for w, t in enumerate((k, v)):
            ref = stored(codec, "bf16", layer, w, truth[layer][w][:, :, :tokens])
            assert torch.equal(t.view(ref.dtype), ref), (layer, w)


@pytest.fixture(params=["directory", "redis"])
def shared_backend(request, tmp_path):
    """Where writer processes and this one meet: ``(where, prefix, backend)`` for a directory
    store or a Redis server on a loopback port (a key prefix of its own per test)."""
    if request.param == "directory":
        folder = tmp_path / "store"
        yield str(folder), "", DirectoryBackend(folder)
        return
    url = request.getfixturevalue("redis_url")
    from speckv.store import RedisBackend

    prefix = f"{request.node.name}:"
    yield url, prefix, RedisBackend(url, prefix=prefix)


def test_two_processes_put_overlapping_prefixes_at_once(codec, tmp_path, shared_backend):
    """Two writer processes share a store and put prompts that share two blocks, at the same
    time: each prefix then restores exactly, the shared blocks stored once."""
    where, prefix, backend = shared_backend
    calibration = tmp_path / "cal.safetensors"
    codec.save(str(calibration))
    writers = [_writer(where, calibration, seed, 72, prefix=prefix) for seed in (1, 2)]
    for w in writers:
        out, err = w.communicate(timeout=600)
        assert w.returncode == 0, err
    a = ids(64, 1)
    b = torch.cat([a[:, :32], ids(40, 2)], dim=1)
    store = PrefixStore(codec, backend, block_size=BLOCK)
    _assert_exact(codec, store, a, 64)
    _assert_exact(codec, store, b, 64)
    assert store.stats()["blocks"] == 6  # a's four, b's two of its own


@pytest.mark.parametrize("mode", ["crash", "crash-mid-put"])
def test_a_writer_that_dies_mid_put_leaves_a_readable_prefix(codec, tmp_path, shared_backend, mode):
    """A writer killed after its first block's entry, or inside its second (the directory's
    temporary file written but not renamed; half of the Redis SET sent): a reader polling all
    the while gets nothing or an exact prefix, never more than the first block, and after
    the crash exactly that block; the store then takes the rest from another writer."""
    where, prefix, backend = shared_backend
    calibration = tmp_path / "cal.safetensors"
    codec.save(str(calibration))
    store = PrefixStore(codec, backend, block_size=BLOCK)
    a = ids(64, 1)
    truth = extract_kv(other_kernels(codec.model, a))
    w = _writer(where, calibration, 1, 64, mode, prefix=prefix)
    answers = []
    while w.poll() is None:
        cache, got = store.get(a, dequantize=False)
        answers.append(got)
        if cache is not None:
            _assert_prefix_of(codec, cache, truth, got)
    _, err = w.communicate(timeout=600)
    assert w.returncode == 3, err
    assert set(answers) <= {0, 16}
    counters = store.stats_counters()
    assert (counters["store_errors"], counters["corrupt_entries"]) == (0, 0)  # no torn entry met
    _assert_exact(codec, store, a, 16)
    assert store.put(a, other_kernels(codec.model, a)) == 48
    _assert_exact(codec, store, a, 64)


def test_a_dead_backend_means_recompute_not_a_crash(codec):
    """A PrefixStore whose backend fails (a Redis server that is not there): put stores nothing,
    get and match find nothing, the failures are counted; no exception reaches the caller."""
    pytest.importorskip("redis", reason="the redis client package is not installed")
    import socket

    from speckv.store import RedisBackend, StoreError

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = PrefixStore(codec, RedisBackend(f"redis://127.0.0.1:{port}/0"), block_size=BLOCK)
    a = ids(64, 1)
    assert store.put(a, other_kernels(codec.model, a)) == 0
    assert store.get(a) == (None, 0)
    assert store.match(a) == 0
    assert store.stats_counters()["store_errors"] >= 2
    with pytest.raises(StoreError):  # asking the backend itself: a typed error
        store.stats()


def test_the_block_codec_codes_one_block_from_the_walk_before_it(codec):
    """``BlockCodec``, what the store codes with: block 2 of a prompt, its predictor state
    carried past blocks 0 and 1 (``skip``) on both sides, comes back bit for bit; a state that
    walked another length, a block of another length, or another prompt, is refused."""
    from speckv.hf import BlockCodec, PrefixState

    blocks = BlockCodec(codec, "bf16")
    a, _ = shared_prompts()
    kv = extract_kv(prefill(codec.model, a))
    start, end = 2 * BLOCK, 3 * BLOCK
    block = [(k[:, :, start:end], v[:, :, start:end]) for k, v in kv]

    def walked(n: int) -> PrefixState:
        state = PrefixState()
        for b in range(n):
            blocks.skip(a[:, b * BLOCK : (b + 1) * BLOCK], state)
        return state

    data = blocks.encode(block, a[:, :end], start, walked(2))
    back = blocks.decode(data, a[:, :end], start, walked(2))
    assert len(back) == len(kv)
    for (k, v), (bk, bv) in zip(block, back):
        assert torch.equal(bk.view(torch.int16), k.to(torch.bfloat16).view(torch.int16))
        assert torch.equal(bv.view(torch.int16), v.to(torch.bfloat16).view(torch.int16))
    with pytest.raises(ValueError, match="walked 16 tokens"):
        blocks.decode(data, a[:, :end], start, walked(1))
    with pytest.raises(ValueError, match="tokens"):
        blocks.encode(block, a[:, : end - 1], start, walked(2))
    other = a.clone()
    other[0, 5] += 1
    with pytest.raises(PredictionMismatchError):
        blocks.decode(data, other[:, :end], start, walked(2))


@pytest.mark.parametrize("joint", [False, True])
def test_a_prompts_blocks_decode_in_one_walk_bit_for_bit(codec, monkeypatch, joint):
    """``BlockCodec.decode_blocks``: a prompt's blocks decoded in one walk (each block's own
    forward pass in turn, each layer's maps once over every block's tokens) are each block's
    own decode, bit for bit, for blocks coded one by one, with the joint model too (each
    block's values read its own keys' residuals); the store restores through it."""
    from speckv.codec import decode_walk
    from speckv.hf import BlockCodec, PrefixState

    coder = SpeculativeCodec(codec.model, codec.calibration, codec.predictor, joint=joint)
    assert bool(coder.params.plan("bf16", joint=joint, threads=1).joint_layers) == joint
    blocks = BlockCodec(coder, "bf16", threads=2)
    a, _ = shared_prompts()
    kv = extract_kv(prefill(codec.model, a))
    datas, state = [], PrefixState()
    for b in range(4):
        lo, hi = b * BLOCK, (b + 1) * BLOCK
        datas.append(blocks.encode([(k[:, :, lo:hi], v[:, :, lo:hi]) for k, v in kv], a[:, :hi], lo, state))
    walks = []
    start = codec.predictor.start

    def walk(block_ids, state=None, block=None):
        walks.append((int(block_ids.shape[1]), block))
        return start(block_ids, state, block)

    monkeypatch.setattr(codec.predictor, "start", walk)
    splits = record_calls(
        monkeypatch,
        decode_walk,
        "split_walk",
        lambda _p, _r, pieces, _l, n, got: (len(pieces), n, got is not None),
    )
    together = blocks.decode_blocks(datas, a, 0, PrefixState())
    assert walks == [(4 * BLOCK, BLOCK)]  # one walk over the four blocks
    # past the model's prefix, the maps' layers walked as two token walks side by side
    assert splits == [(4, 2, True)]
    monkeypatch.undo()
    one_state = PrefixState()
    for b, data in enumerate(datas):
        alone = blocks.decode(data, a[:, : (b + 1) * BLOCK], b * BLOCK, one_state)
        for (k, v), (k2, v2) in zip(together[b], alone):
            assert torch.equal(k.view(torch.int16), k2.view(torch.int16))
            assert torch.equal(v.view(torch.int16), v2.view(torch.int16))
        for layer, pair in enumerate(alone):
            for which in (0, 1):
                want = kv[layer][which][:, :, b * BLOCK : (b + 1) * BLOCK].to(torch.bfloat16)
                assert torch.equal(pair[which].view(torch.int16), want.view(torch.int16))
    # a block that does not belong there is refused before any predictor runs
    with pytest.raises(PredictionMismatchError):
        blocks.decode_blocks([datas[0], datas[2]], a[:, : 2 * BLOCK], 0, PrefixState())


@pytest.mark.parametrize("joint", [True, False])
def test_a_prompts_blocks_of_statistics_decode_in_one_call_a_layer_bit_for_bit(codec, monkeypatch, joint):
    """``BlockCodec.decode_blocks`` with a whole-prompt predictor (per-channel statistics):
    every block's K streams in one decode call, then its V streams (a jointly coded V reads
    its own block's K residuals), each block bit for bit its own ``decode`` and its cache;
    on two threads, two walks side by side, two blocks each: the same words."""
    from speckv import _api
    from speckv.codec import decode_walk
    from speckv.hf import BlockCodec, ChannelStatsPredictor

    stats = SpeculativeCodec(codec.model, predictor=ChannelStatsPredictor(), joint=joint)
    stats.calibrate([ids(64, s) for s in range(4)])
    blocks = BlockCodec(stats, "bf16", threads=1)
    a, _ = shared_prompts()
    kv = extract_kv(prefill(codec.model, a))
    datas = [
        blocks.encode([(k[:, :, lo : lo + BLOCK], v[:, :, lo : lo + BLOCK]) for k, v in kv], a[:, : lo + BLOCK], lo)
        for lo in range(0, 4 * BLOCK, BLOCK)
    ]
    calls = []
    many = _api.decode_many

    def counted(items, threads=None):
        calls.append(len(items))
        return many(items, threads)

    monkeypatch.setattr(_api, "decode_many", counted)
    together = blocks.decode_blocks(datas, a, 0)
    assert calls == [4, 4]  # the four blocks' K, then their V
    calls.clear()
    apart = BlockCodec(stats, "bf16", threads=2).decode_blocks(datas, a, 0)
    assert calls == [2, 2, 2, 2]  # two walks of two blocks (K, then V) side by side
    # a long prompt's blocks a group at a time (its targets bounded): the same words
    monkeypatch.setattr(decode_walk, "WHOLE_BLOCKS_TOKENS", 2 * BLOCK)
    calls.clear()
    grouped = blocks.decode_blocks(datas, a, 0)
    assert calls == [2, 2, 2, 2]
    for b in range(4):
        for other in (apart, grouped):
            for (k, v), (k2, v2) in zip(together[b], other[b]):
                assert torch.equal(k.view(torch.int16), k2.view(torch.int16))
                assert torch.equal(v.view(torch.int16), v2.view(torch.int16))
    monkeypatch.undo()
    for b, data in enumerate(datas):
        alone = blocks.decode(data, a[:, : (b + 1) * BLOCK], b * BLOCK)
        for layer, ((k, v), (k2, v2)) in enumerate(zip(together[b], alone)):
            assert torch.equal(k.view(torch.int16), k2.view(torch.int16))
            assert torch.equal(v.view(torch.int16), v2.view(torch.int16))
            want = kv[layer][0][:, :, b * BLOCK : (b + 1) * BLOCK].to(torch.bfloat16)
            assert torch.equal(k.view(torch.int16), want.view(torch.int16))
    with pytest.raises(PredictionMismatchError):
        blocks.decode_blocks([datas[0], datas[2]], a[:, : 2 * BLOCK], 0)


def test_a_block_that_fails_to_decode_ends_the_prefix_there(codec, monkeypatch):
    """A block whose header passes and whose payload does not decode against the prediction
    (here: the maps made to predict otherwise from block 2 on) ends the restored prefix there:
    the store falls back to decoding block by block, serves the blocks before it and counts
    the entry corrupt, not a hit."""
    store = PrefixStore(codec, MemoryBackend(), block_size=BLOCK)
    a, _ = shared_prompts()
    store.put(a, prefill(codec.model, a))
    predictor = codec.predictor
    real = predictor.map_predict

    def off_from_block_2(layer, which, observed, ropes, shape, *args, **kwargs):
        out = real(layer, which, observed, ropes, shape, *args, **kwargs)
        if ropes.start + shape[2] > 2 * BLOCK:  # a walk whose tokens reach block 2
            out = out.clone()
            out[:, :, -1] += 1.0
        return out

    monkeypatch.setattr(predictor, "map_predict", off_from_block_2)
    before = store.stats()
    kv, n = store.get_kv(a)
    after = store.stats()
    assert n == 2 * BLOCK and kv[0][0].shape[2] == 2 * BLOCK
    assert after["hits"] - before["hits"] == 2 and after["corrupt_entries"] - before["corrupt_entries"] == 1
