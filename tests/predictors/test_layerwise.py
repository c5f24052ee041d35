"""Layer-wise prediction: ModelPrefixPredictor (the model's own first layers, then ridge maps
from the decoded layers) on tiny random models, and its calibration pieces."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import numpy as np  # noqa: E402

import speckv  # noqa: E402
from helpers import record_calls  # noqa: E402
from speckv.hf import Calibration, ModelPrefixPredictor, SpeculativeCodec, extract_kv  # noqa: E402
from speckv.models.cache import other_kernels, prefill  # noqa: E402
from speckv.predictors.calibration import CalibrationMismatchError, _RelativeFit  # noqa: E402
from speckv.predictors.linear_map import ridge_fit  # noqa: E402
from speckv.predictors.rope import Rope  # noqa: E402
from tiny_models import WORDS, assert_same, ids, tiny_model  # noqa: E402


@pytest.fixture(scope="module", params=[("llama", 1), ("llama", 2), ("qwen3", 2), ("llama", 3)])
def prefix_codec(request):
    kind, layers = request.param
    model = tiny_model(kind)
    codec = SpeculativeCodec(model, predictor=ModelPrefixPredictor(model, layers=layers))
    codec.calibrate([ids(48, s) for s in range(6)])
    return model, codec


@pytest.mark.parametrize("mode", list(WORDS))
@pytest.mark.parametrize("producer", [prefill, other_kernels])
def test_round_trip_is_exact_and_paths_agree(prefix_codec, mode, producer):
    model, codec = prefix_codec
    prompt = ids(40, 99)
    cache = producer(model, prompt)
    data = codec.compress(cache, prompt, mode)
    sequential = extract_kv(codec.decompress(data, prompt, dequantize=False, pipeline=False))
    pipelined = extract_kv(codec.decompress(data, prompt, dequantize=False, pipeline=True, threads=1))
    assert_same(codec, mode, cache, sequential)
    assert_same(codec, mode, cache, pipelined)
    # one layer: the walk stops there
    for layer in range(len(cache)):
        k, v = codec.decompress_layer(data, prompt, layer)
        assert torch.equal(k.view(WORDS[mode]), sequential[layer][0].view(WORDS[mode]))
    # the bytes do not depend on the coder's threads
    assert codec.compress(cache, prompt, mode, threads=1) == data


@pytest.mark.parametrize("joint", [False, True])
def test_a_restore_split_into_token_walks_is_the_one_walk_bit_for_bit(prefix_codec, monkeypatch, joint):
    """``decode_walk.split_walk``: past the model's prefix, the maps' layers walked as
    groups of token blocks side by side (one a thread) give the one walk's words, for any
    number of threads and blocks, jointly coded values too; with one thread it does not
    split."""
    from speckv.codec import decode_walk

    model, codec = prefix_codec
    coder = SpeculativeCodec(model, codec.calibration, codec.predictor, joint=joint)
    prompt = ids(40, 5)
    cache = other_kernels(model, prompt)
    data = coder.compress(cache, prompt, "bf16", block_size=16)  # blocks of 16, 16 and 8
    splits = record_calls(
        monkeypatch,
        decode_walk,
        "split_walk",
        lambda _p, _r, pieces, _l, n, got: (len(pieces), n, got is not None),
    )
    walks = {t: extract_kv(coder.decompress(data, prompt, dequantize=False, threads=t)) for t in (1, 2, 3)}
    maps = codec.predictor.layers < model.config.num_hidden_layers  # else the prefix is all
    assert splits == ([(3, 1, False), (3, 2, True), (3, 3, True)] if maps else [])
    monkeypatch.setattr(decode_walk, "split_walk", lambda *args: None)
    one = extract_kv(coder.decompress(data, prompt, dequantize=False, threads=2))
    assert_same(coder, "bf16", cache, one)
    for got in walks.values():
        assert_same(coder, "bf16", cache, got)


def test_prefix_layers_are_the_models_own(prefix_codec):
    """Under the model's own kernels, the layers the predictor runs are the cache, bit for bit,
    and cost next to nothing."""
    model, codec = prefix_codec
    prompt = ids(40, 7)
    cache = prefill(model, prompt)
    pred = codec.prediction(cache, prompt, "bf16")
    for layer in range(codec.predictor.layers):
        for which in (0, 1):
            assert torch.equal(pred[layer][which], cache[layer][which].float())


def test_predictions_do_not_depend_on_torch_threads(prefix_codec):
    model, codec = prefix_codec
    prompt = ids(40, 8)
    cache = other_kernels(model, prompt)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        a = codec.prediction(cache, prompt, "bf16")
        data = codec.compress(cache, prompt, "bf16")
        torch.set_num_threads(3)
        b = codec.prediction(cache, prompt, "bf16")
        again = codec.compress(cache, prompt, "bf16")
    finally:
        torch.set_num_threads(before)
    assert torch.get_num_threads() == before
    for (k, v), (k2, v2) in zip(a, b):
        assert torch.equal(k.view(torch.int32), k2.view(torch.int32))
        assert torch.equal(v.view(torch.int32), v2.view(torch.int32))
    assert data == again


def test_the_prefix_pass_runs_where_the_walk_first_needs_it(prefix_codec, monkeypatch):
    """A walk that waits for the forward pass first runs it on its own thread (torch reuses
    that thread's workers); one that asks for a prefix layer first runs it on a background
    thread, to code while it runs. The same predictions either way; a walk closed before it
    asked for anything still runs the pass once (a prompt's next block continues its state)."""
    import threading

    from speckv.predictors.prefix_pass import PrefixState

    model, codec = prefix_codec
    predictor = codec.predictor
    prompt = ids(40, 9)
    where = []
    real = predictor.prefix

    def prefix(*args, **kwargs):
        where.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(predictor, "prefix", prefix)
    layers = [(layer, which) for layer in range(predictor.layers) for which in (0, 1)]
    waited = predictor.start(prompt)
    waited.wait()
    first = [waited.predict(layer, which) for layer, which in layers]
    waited.close()
    streamed = predictor.start(prompt)
    second = [streamed.predict(layer, which) for layer, which in layers]
    streamed.close()
    assert where[0] == threading.get_ident() and where[1] != threading.get_ident()
    for a, b in zip(first, second):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))
    state = PrefixState()
    predictor.start(prompt, state).close()
    assert len(where) == 3 and state.tokens == prompt.shape[1]


def test_another_prediction_is_refused(prefix_codec):
    model, codec = prefix_codec
    prompt = ids(32, 11)
    cache = other_kernels(model, prompt)
    data = codec.compress(cache, prompt, "bf16")
    predictor = codec.predictor
    original = predictor.map_predict if predictor.layers < predictor.n_layers else None

    # the same settings but other predictions (as another torch build might make): refused by
    # the fingerprint of the coding parameters, before any wrong value comes out
    def shifted_prefix(input_ids, sink, state=None, hidden=None):
        shifted = lambda layer, k, v: sink(layer, k + 1e-2, v)  # noqa: E731
        return ModelPrefixPredictor.prefix(predictor, input_ids, shifted, state, hidden)

    predictor.prefix = shifted_prefix
    try:
        with pytest.raises(speckv.PredictionMismatchError):
            codec.decompress(data, prompt)
    finally:
        del predictor.prefix
    if original is not None:
        predictor.map_predict = lambda *a: original(*a) * 1.001
        try:
            with pytest.raises(speckv.PredictionMismatchError):
                codec.decompress(data, prompt, pipeline=False)
        finally:
            del predictor.map_predict
    assert_same(codec, "bf16", cache, extract_kv(codec.decompress(data, prompt)))  # its own predictions: every bit
    # other settings: refused by name before the predictor runs
    other = ModelPrefixPredictor(model, layers=predictor.layers, threads=predictor.threads + 1)
    with pytest.raises(CalibrationMismatchError, match="predictor"):
        SpeculativeCodec(model, codec.calibration, other)


def test_calibration_keeps_the_maps(prefix_codec, tmp_path):
    model, codec = prefix_codec
    path = tmp_path / "cal.safetensors"
    codec.save(str(path))
    loaded = Calibration.load(str(path), model, codec.predictor)
    assert loaded.digest() == codec.calibration.digest()
    assert set(loaded.predictor_state) == set(codec.calibration.predictor_state)
    assert (loaded.sigma_rel is None) == (codec.calibration.sigma_rel is None)
    fresh = ModelPrefixPredictor(model, layers=codec.predictor.layers)
    again = SpeculativeCodec(model, loaded, fresh)
    rebuilt = SpeculativeCodec.load(str(path), model)  # the predictor from the recorded settings
    assert rebuilt.predictor.describe() == codec.predictor.describe()
    prompt = ids(32, 12)
    cache = other_kernels(model, prompt)
    data = codec.compress(cache, prompt, "fp8")
    assert_same(again, "fp8", cache, extract_kv(again.decompress(data, prompt, dequantize=False)))
    if codec.calibration.predictor_state:
        name = sorted(codec.calibration.predictor_state)[0]
        changed = Calibration.load(str(path))
        changed.predictor_state[name] = changed.predictor_state[name] + 1
        assert changed.digest() != codec.calibration.digest()


def test_unfitted_maps_and_bad_settings_are_refused():
    model = tiny_model("llama")
    with pytest.raises(ValueError, match="calibrate"):
        ModelPrefixPredictor(model, layers=1).start(ids(8, 1))
    ModelPrefixPredictor(model, layers=3).start(ids(8, 1)).close()  # the whole model: no maps
    for layers in (0, 4):
        with pytest.raises(ValueError, match="layers"):
            ModelPrefixPredictor(model, layers=layers)
    with pytest.raises(ValueError, match="missing"):
        ModelPrefixPredictor(model, layers=1).load_state_dict({})


def test_rope_inverts():
    model = tiny_model("llama")
    rope = Rope(model, 20, 16)
    k = torch.randn(1, 2, 20, 16)
    assert torch.allclose(rope.rope(rope.unrope(k)), k, atol=1e-5)
    # and is the model's: position 0 is unrotated, later positions are not
    assert torch.allclose(rope.unrope(k)[:, :, 0], k[:, :, 0])
    assert not torch.allclose(rope.unrope(k)[:, :, 5], k[:, :, 5])


def test_maps_on_their_sources_are_the_maps_on_torch_built_features():
    """``map_sources.apply_to_sources`` (the core gathers the features, undoing each K's
    RoPE itself) gives ``apply_map`` of the torch-built features bit for bit: keys and values,
    sources holding fewer or more tokens than the rows, two batch entries, infinities, the
    hidden-state source; and the RoPE tables of a range of positions are the whole range's."""
    from speckv.predictors.linear_map import apply_map, integer_map
    from speckv.predictors.map_sources import HIDDEN, _features, apply_to_sources
    from speckv.predictors.rope import Ropes

    model = tiny_model("llama")
    g = torch.Generator().manual_seed(3)
    ropes = Ropes(model, 24, 16)
    observed = {
        (0, 0): torch.randn(2, 2, 24, 16, generator=g) * 30,
        (0, 1): torch.randn(2, 2, 20, 16, generator=g),
        (1, 0): torch.randn(2, 2, 24, 16, generator=g),
        HIDDEN: torch.randn(2, 1, 24, 64, generator=g),
    }
    observed[0, 0][0, 1, 3, 2] = float("inf")
    observed[1, 0][1, 0, 7, 9] = float("nan")
    sources = [(0, 0), (0, 1), HIDDEN, (1, 0)]
    features = 2 * 16 * 3 + 64
    shift = torch.full((features,), 6, dtype=torch.int32)
    m = integer_map(torch.randn(features, 40, generator=g) * 0.02, torch.randn(40, generator=g), shift)
    for rows in (24, 22):
        want = apply_map(m, _features(observed, sources, ropes, rows), 1)
        for threads in (1, 2):
            got = apply_to_sources(m, observed, sources, ropes, rows, threads)
            assert torch.equal(got.view(torch.int32), want.view(torch.int32)), (rows, threads)
    # a token walk's tables are the whole walk's rows
    part = ropes.tokens(8, 20).of(0)
    assert torch.equal(part.cos, ropes.of(0).cos[:, :, 8:20]) and torch.equal(part.sin, ropes.of(0).sin[:, :, 8:20])
    k = observed[1, 0][:, :, 8:20]
    assert torch.equal(part.unrope(k), ropes.of(0).unrope(observed[1, 0])[:, :, 8:20])


def test_map_outputs_become_heads_with_the_bits_of_torchs_rope():
    """``map_sources.heads_of`` (the core reorders a map's outputs by head and applies a key's
    RoPE, invariant R2) gives ``Rope.rope`` of the torch-reordered columns bit for bit: two
    batch entries, a token range's tables, values without a rotation, a column view,
    infinities and NaN, signed zeros; and refuses a layout its outputs do not hold."""
    from speckv.predictors.map_sources import heads_of
    from speckv.predictors.rope import Ropes

    model = tiny_model("llama")
    g = torch.Generator().manual_seed(5)
    ropes = Ropes(model, 24, 16)
    for rope in (ropes.of(0), ropes.tokens(4, 24).of(0), None):
        rows = 24 if rope is None or rope.cos is None else rope.cos.shape[2]
        shape = (2, 3, rows, 16)
        y = torch.randn(2 * rows, 3 * 16 + 8, generator=g) * 50
        y[1, 5], y[7, 20], y[9, 0], y[11, 40] = float("inf"), float("nan"), -0.0, float("-inf")
        torch_made = y[:, :48].reshape(2, rows, 3, 16).permute(0, 2, 1, 3).contiguous()
        if rope is not None:
            torch_made = rope.rope(torch_made)
        got = heads_of(y, shape, rope)
        assert got.shape == shape
        assert torch.equal(got.view(torch.int32), torch_made.view(torch.int32))
        assert torch.equal(heads_of(y[:, :48], shape, rope).view(torch.int32), got.view(torch.int32))
    with pytest.raises(speckv.SpeckvError, match="map heads"):
        heads_of(torch.zeros(10, 48), (2, 3, 4, 16))
    # the core's checks, before it sizes anything from the shape
    from speckv import _speckv

    y = np.zeros(48, np.float32)
    with pytest.raises(speckv.SpeckvError, match="map heads"):
        _speckv.map_heads(y, 16, 0, (2**62, 2**62, 2, 2))
    with pytest.raises(speckv.SpeckvError, match="rotary tables"):
        _speckv.map_heads(y, 16, 0, (1, 1, 3, 16), (np.ones(47, np.float32), np.ones(48, np.float32)))
    with pytest.raises(speckv.SpeckvError, match="rotary tables"):
        _speckv.map_heads(np.zeros(45, np.float32), 15, 0, (1, 1, 3, 15), (np.ones(45, np.float32),) * 2)
    with pytest.raises(speckv.SpeckvError, match="rotary tables"):
        _speckv.map_heads(np.zeros(0, np.float32), 16, 0, (0, 1, 2**62, 16), (np.ones(4, np.float32),) * 2)
    with pytest.raises(ValueError, match="contiguous"):
        _speckv.map_heads(np.zeros(96, np.float32)[::2], 16, 0, (1, 1, 3, 16))


def test_ridge_recovers_a_linear_map():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(6, 3, generator=g)
    xs = [torch.randn(50, 6, generator=g) for _ in range(4)]
    ys = [x @ w + 0.5 for x in xs]
    fit_w, fit_b, folds = ridge_fit(xs, ys, [[0], [1], [2], [3]])
    assert torch.allclose(fit_w, w, atol=1e-2) and torch.allclose(fit_b, torch.full((3,), 0.5), atol=1e-2)
    assert len(folds) == 4


def test_relative_sigma_fit_recovers_both_parts():
    g = torch.Generator().manual_seed(1)
    fit = _RelativeFit(1, 1, 2)
    p = torch.randn(1, 1, 200000, 2, generator=g, dtype=torch.float64) * 3
    a, b = torch.tensor([0.1, 0.1]), torch.tensor([0.05, 0.0])
    e = torch.randn(p.shape, generator=g, dtype=torch.float64) * (a**2 + (b * p) ** 2).sqrt()
    fit.add(0, 0, e, p)
    fit.add(0, 1, e, p)
    got_a, got_b = fit.solve()
    assert torch.allclose(got_a[0, 0, 0], a.float(), rtol=0.1, atol=2e-3)
    assert torch.allclose(got_b[0, 0, 0], b.float(), rtol=0.1, atol=5e-3)


def test_layers_for_budget_chooses_within_the_model():
    from speckv.predictors.budget import layers_for_budget

    model = tiny_model("llama")
    prompt = ids(64, 3)
    m, costs = layers_for_budget(model, prompt, 1.0, repeat=1)
    assert 1 <= m <= 3 and len(costs) == 3 and all(c > 0 for c in costs)
    assert layers_for_budget(model, prompt, 0.0, repeat=1)[0] == 1
    assert layers_for_budget(model, prompt, 1e9, repeat=1)[0] == 3


def test_relative_sigma_codes_equal_the_torch_form():
    """The decoder's one-pass codes of sqrt(s^2 + (r mu)^2) are the codes of the encoder's
    torch tensor, scalar for scalar, across magnitudes (tiny, huge, zero, subnormal mu)."""
    from speckv import _speckv

    g = torch.Generator().manual_seed(5)
    heads, tokens, dim = 3, 50, 8
    mu = torch.randn(2, heads, tokens, dim, generator=g) * torch.logspace(-30, 15, dim)
    mu[0, 0, 0] = 0.0
    mu[0, 0, 1] = 1e-40
    s = torch.rand(heads, dim, generator=g) * torch.logspace(-6, 1, dim) + 1e-6
    r = torch.rand(heads, dim, generator=g) * 0.1
    r[0, 0] = 0.0
    sigma = torch.sqrt(s[None, :, None, :] * s[None, :, None, :] + (r[None, :, None, :] * mu) ** 2)
    finite = torch.isfinite(sigma).all() and bool((sigma > 0).all())
    assert finite
    want = speckv.sigma_codes(sigma.numpy())
    flat_mu, flat_s, flat_r = (a.numpy().reshape(-1) for a in (mu, s, r))
    got = _speckv.relative_sigma_codes(flat_mu, flat_s, flat_r, heads, tokens, dim)
    assert (got.reshape(want.shape) == want).all()
    with pytest.raises(speckv.SpeckvError):
        _speckv.relative_sigma_codes(flat_mu, flat_s[:5], flat_r, heads, tokens, dim)


# Decodes a map-predicted stream in a fresh process (its own SIMD kernels, torch threads) and
# prints the restored cache's digest.
_DECODE_ELSEWHERE = """
import hashlib, sys, torch, transformers
from speckv.hf import SpeculativeCodec, extract_kv
from speckv import _speckv
folder, cal, data, threads = sys.argv[1:5]
torch.set_num_threads(int(threads))
model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
codec = SpeculativeCodec.load(cal, model)
prompt = torch.load(data + ".ids")
back = extract_kv(codec.decompress(open(data, "rb").read(), prompt, dequantize=False))
h = hashlib.sha256()
for k, v in back:
    h.update(k.contiguous().view(torch.int16).numpy().tobytes())
    h.update(v.contiguous().view(torch.int16).numpy().tobytes())
print(_speckv.map_kernel(), h.hexdigest())
"""


def test_map_predictions_are_the_same_under_every_kernel_and_thread_count(tmp_path):
    """The bytes of a map-only stream (layer 0, its hidden state, integer maps) decode to the same cache in
    processes whose maps and coder run other SIMD kernels (SPECKV_SIMD, SPECKV_AMX) and torch other
    thread counts: the maps' sums are integers (``LinearMap``), RoPE's tables correctly
    rounded, so the prediction does not depend on them."""
    import hashlib
    import os
    import subprocess
    import sys

    model = tiny_model("llama", seed=3)
    folder = tmp_path / "model"
    model.save_pretrained(folder)
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()
    codec = SpeculativeCodec(model, predictor=ModelPrefixPredictor(model, layers=1, hidden=True))
    codec.calibrate([ids(48, s) for s in range(6)])
    codec.save(str(tmp_path / "cal.safetensors"))
    prompt = ids(40, 5)
    cache = other_kernels(model, prompt)
    (tmp_path / "data").write_bytes(codec.compress(cache, prompt, "bf16"))
    torch.save(prompt, tmp_path / "data.ids")
    h = hashlib.sha256()
    for k, v in cache:
        h.update(k.to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes())
        h.update(v.to(torch.bfloat16).contiguous().view(torch.int16).numpy().tobytes())
    want = h.hexdigest()
    kernels = set()
    for simd, amx, threads in (("", "", 1), ("", "0", 2), ("avx2", "", 3), ("0", "", 2)):
        env = {**os.environ, "SPECKV_SIMD": simd, "SPECKV_AMX": amx}
        args = [str(folder), str(tmp_path / "cal.safetensors"), str(tmp_path / "data"), str(threads)]
        out = subprocess.run(
            [sys.executable, "-c", _DECODE_ELSEWHERE, *args], env=env, capture_output=True, text=True, timeout=300
        )
        assert out.returncode == 0, out.stderr[-2000:]
        kernel, digest = out.stdout.split()
        assert digest == want, (simd, amx, threads, kernel)
        kernels.add(kernel)
    assert "portable" in kernels  # SPECKV_SIMD=0 took the portable sums


def test_integer_maps_compute_the_float_map():
    from speckv.predictors.linear_map import apply_map, feature_shifts, integer_map

    g = torch.Generator().manual_seed(4)
    x = torch.randn(300, 40, generator=g) * torch.logspace(-3, 2, 40)  # features of any scale
    w = torch.randn(40, 24, generator=g) / 40
    b = torch.randn(24, generator=g)
    shifts = feature_shifts([x[:150], x[150:]])
    assert shifts.dtype == torch.int32 and bool((x.abs().amax(0) * 2.0 ** shifts.double() <= 4096).all())
    m = integer_map(w, b, shifts)
    y = apply_map(m, x)
    ref = x.double() @ w.double() + b.double()
    assert float((y.double() - ref).abs().max()) < 1e-3 * float(ref.abs().max())
    # a constant-zero feature, and a row far outside the calibration's range (clamped, finite)
    x[:, 3] = 0
    assert int(feature_shifts([x])[3]) == 0
    assert bool(torch.isfinite(apply_map(m, x * 1e6)).all())


def test_rope_tables_are_computed_exactly_where_the_rope_is_plain():
    model = tiny_model("llama")
    rope = Rope(model, 64, 16, start=8)
    assert rope.exact
    cos, sin = model.model.rotary_emb(torch.zeros(1), torch.arange(8, 72)[None])
    assert torch.allclose(rope.cos[0, 0], cos[0].float(), atol=1e-5)
    assert torch.allclose(rope.sin[0, 0], sin[0].float(), atol=1e-5)
    # the same positions from a table grown by another call: the same bits
    again = Rope(model, 200, 16).cos[0, 0, 8:72]
    assert torch.equal(again, rope.cos[0, 0])


def test_cheap_maps_read_the_hidden_state_and_round_trip_in_steps():
    """With ``hidden`` the maps also read the hidden state the last run layer hands on (its
    own columns in every map), recorded in the description and restored from it; with a
    prefill in steps (prompt longer than ``prefill_chunk``) the steps' hidden states are
    joined, and the round trip is exact."""
    from speckv.cli.predictor_spec import make_predictor
    from speckv.codec.from_description import predictor_from_description

    model = tiny_model("llama", seed=2)
    plain = ModelPrefixPredictor(model, layers=1)
    cheap = ModelPrefixPredictor(model, layers=1, prefill_chunk=16, hidden=True)
    assert cheap.hidden and not plain.hidden
    assert "hidden" in cheap.describe() and "hidden" not in plain.describe()
    assert predictor_from_description(model, cheap.describe()).describe() == cheap.describe()
    assert make_predictor("map+hidden", model).hidden and make_predictor("prefix:2+hidden", model).hidden
    assert not make_predictor("map", model).hidden
    assert not ModelPrefixPredictor(model, layers=3, hidden=True).hidden  # no maps: nothing reads it
    codec = SpeculativeCodec(model, predictor=cheap)
    codec.calibrate([ids(48, s) for s in range(6)])
    width = 2 * 16  # kv heads x head dim of the tiny model
    assert cheap.maps["maps.1.k.weight"].shape[0] == 2 * width + 64  # layer 0's K, V and the hidden state
    h = cheap.hidden_state(ids(40, 1))
    assert h.shape == (1, 1, 40, 64) and h.dtype == torch.float32
    prompt = ids(40, 12)  # three steps of 16 tokens
    cache = other_kernels(model, prompt)
    for mode in ("bf16", "fp8"):
        data = codec.compress(cache, prompt, mode)
        assert_same(codec, mode, cache, extract_kv(codec.decompress(data, prompt, dequantize=False)))
