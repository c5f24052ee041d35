"""Byte budgets of the stores' tiers: the directory backend's least-recently-used, tail-first
eviction (alone, under random chains, and shared by processes), the host-RAM tier, a Redis
server's own ``maxmemory`` (a middle block evicted: a shorter prefix, never a wrong one), and
the raw coding a tier's baseline stores."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from speckv.store import DirectoryBackend, MemoryBackend, RedisBackend, StoreError, pack_entry, unpack_entry

VALUE = 100
ENTRY = VALUE + 24  # pack_entry's header


def key(i: int) -> str:
    return hashlib.blake2b(str(i).encode(), digest_size=16).hexdigest()


def put_chain(b, chain_id: int, length: int, parents: dict[str, str | None]) -> list[str]:
    """Puts ``length`` blocks of chain ``chain_id`` in order; returns the keys stored."""
    keys: list[str] = []
    parent = None
    for depth in range(length):
        k = key(chain_id * 1000 + depth)
        if not b.put(k, pack_entry(bytes([depth % 256]) * VALUE, k), parent) and not b.has(k):
            break
        parents[k] = parent
        keys.append(k)
        parent = k
    return keys


def held(b: DirectoryBackend) -> int:
    return sum(p.stat().st_size for p in b.path.glob("??/*.spkb"))


def test_the_least_recently_used_chain_loses_its_tail_first(tmp_path):
    b = DirectoryBackend(tmp_path / "s", max_bytes=6 * ENTRY)
    parents: dict[str, str | None] = {}
    a = put_chain(b, 1, 3, parents)
    c = put_chain(b, 2, 3, parents)
    assert len(a) == len(c) == 3 and b.nbytes() == 6 * ENTRY and b.evictions == 0
    b.touch_chain(a)  # chain 1 used last: chain 2 is the least recently used
    new = put_chain(b, 3, 1, parents)
    assert new and not b.has(c[2]) and b.has(c[1]) and all(b.has(k) for k in a)
    put_chain(b, 3, 3, parents)  # chain 3's next two blocks take chain 2's two others, tail first
    assert not any(b.has(k) for k in c) and all(b.has(k) for k in a)
    assert b.evictions == 3 and b.nbytes() == held(b) == 6 * ENTRY
    # a restart (another object, or another process) reads the same budget
    again = DirectoryBackend(tmp_path / "s", max_bytes=6 * ENTRY)
    assert again.nbytes() == 6 * ENTRY
    # a block whose prefix is gone is declined: it could never be reached
    assert not again.put(key(9999), pack_entry(b"x", key(9999)), c[0])
    # a block larger than the budget is declined, and evicts nothing
    assert not again.put(key(8888), pack_entry(b"y" * 6 * ENTRY, key(8888)))
    assert again.nbytes() == 6 * ENTRY


def test_a_growing_chain_keeps_its_own_prefix(tmp_path):
    """A chain longer than the budget stops where it no longer fits: its own prefix is never
    evicted for its tail (that would leave a hole), other chains are."""
    b = DirectoryBackend(tmp_path / "s", max_bytes=4 * ENTRY)
    parents: dict[str, str | None] = {}
    other = put_chain(b, 1, 2, parents)
    stored = put_chain(b, 2, 10, parents)
    assert len(stored) == 4 and not any(b.has(k) for k in other)
    assert b.nbytes() == held(b) == 4 * ENTRY


def test_the_budget_state_is_rebuilt_when_lost(tmp_path):
    b = DirectoryBackend(tmp_path / "s", max_bytes=5 * ENTRY)
    put_chain(b, 1, 3, {})
    (tmp_path / "s" / DirectoryBackend.STATE).write_bytes(b"torn")
    assert b.nbytes() == 3 * ENTRY
    (tmp_path / "s" / DirectoryBackend.STATE).unlink()
    put_chain(b, 2, 3, {})  # the state rebuilt from the files: one eviction makes room
    assert b.nbytes() == held(b) == 5 * ENTRY and b.evictions == 1


@settings(max_examples=int(os.environ.get("SPECKV_HYPOTHESIS_EXAMPLES", "150")) // 3, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("put"), st.integers(0, 4), st.integers(1, 6)),
            st.tuples(st.just("touch"), st.integers(0, 4), st.integers(1, 6)),
            st.tuples(st.just("delete"), st.integers(0, 4), st.integers(1, 5)),
        ),
        min_size=1,
        max_size=30,
    ),
    st.integers(0, 12),
)
def test_random_chains_under_a_budget_never_leave_a_hole(tmp_path_factory, ops, entries):
    """Chains put, touched and damaged (deleted) at random under a budget: the budget holds,
    the byte count is the files', and every stored block's prefix is stored."""
    limit = entries * ENTRY
    b = DirectoryBackend(tmp_path_factory.mktemp("s"), max_bytes=limit)
    parents: dict[str, str | None] = {}
    for op, chain_id, n in ops:
        keys = [key(chain_id * 1000 + d) for d in range(n)]
        if op == "put":
            put_chain(b, chain_id, n, parents)
        elif op == "touch":
            present = []
            for k in keys:
                if not b.has(k):
                    break
                present.append(k)
            b.touch_chain(present)
        elif b.has(keys[-1]):
            # a damaged entry is deleted with what extends it (as PrefixStore re-stores it)
            doomed = {keys[-1]}
            changed = True
            while changed:
                changed = False
                for k, p in parents.items():
                    if p in doomed and k not in doomed and b.has(k):
                        doomed.add(k)
                        changed = True
            for k in doomed:
                b.delete(k)
        assert b.nbytes() == held(b) <= limit
        stored = set(b.keys())
        for k in stored:
            assert parents.get(k) is None or parents[k] in stored, "a stored block's prefix was evicted"


WRITER = """
import hashlib, sys
from speckv.store import DirectoryBackend, pack_entry
path, limit, me = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
b = DirectoryBackend(path, max_bytes=limit)
def key(i):
    return hashlib.blake2b(str(i).encode(), digest_size=16).hexdigest()
for round in range(15):
    chain = me * 100 + round % 5
    parent = None
    keys = []
    for depth in range(4):
        k = key(chain * 1000 + depth)
        if not b.put(k, pack_entry(bytes([depth]) * 100, k), parent) and not b.has(k):
            break
        keys.append(k)
        parent = k
    b.touch_chain(keys)
print(b.evictions)
"""


def test_processes_sharing_a_folder_share_its_budget(tmp_path):
    """Three processes store chains into one budgeted folder at once: the budget holds across
    them, the byte count is the files', and no chain has a hole."""
    path = tmp_path / "s"
    limit = 10 * ENTRY
    DirectoryBackend(path, max_bytes=limit)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), str(limit), str(i)], stdout=subprocess.PIPE, text=True
        )
        for i in range(3)
    ]
    evictions = 0
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0
        evictions += int(out)
    b = DirectoryBackend(path, max_bytes=limit)
    assert b.nbytes() == held(b) <= limit and evictions > 0
    stored = set(b.keys())
    for me in range(3):
        for c in range(5):
            chain = [key((me * 100 + c) * 1000 + d) for d in range(4)]
            present = [k in stored for k in chain]
            assert present == sorted(present, reverse=True), "a chain with a hole"
            for k in (k for k in chain if k in stored):
                assert unpack_entry(b.get(k), k)


def test_the_memory_tier_is_a_shared_ram_folder(tmp_path):
    pytest.importorskip("torch")  # speckv.integrations.engine hosts a model's store
    from speckv.integrations.engine import memory_tier_path, open_backend

    name = f"test-{os.getpid()}"
    b = open_backend("memory", max_bytes=3 * ENTRY, name=name)
    try:
        assert isinstance(b, DirectoryBackend) and b.path == memory_tier_path(name) and not b.durable
        if os.path.isdir("/dev/shm"):
            assert str(b.path).startswith("/dev/shm/")
        put_chain(b, 1, 5, {})
        assert b.nbytes() == 3 * ENTRY
        # another process's view (vLLM's scheduler) of the same tier
        other = open_backend("memory", max_bytes=3 * ENTRY, name=name)
        assert sorted(other.keys()) == sorted(b.keys())
    finally:
        shutil.rmtree(b.path, ignore_errors=True)
    with pytest.raises(ValueError, match="maxmemory"):
        open_backend("redis://127.0.0.1:6379/0", max_bytes=100)
    for bad in (0, -5, 1.5, True):
        with pytest.raises(ValueError, match="max_bytes"):
            open_backend(str(tmp_path / "d"), max_bytes=bad)
    with pytest.raises(StoreError):
        DirectoryBackend(tmp_path / "d2", max_bytes=-1)


def test_the_memory_backend_keeps_the_same_order():
    b = MemoryBackend(6 * ENTRY)
    parents: dict[str, str | None] = {}
    a = put_chain(b, 1, 3, parents)
    c = put_chain(b, 2, 3, parents)
    b.touch_chain(a)
    put_chain(b, 3, 1, parents)
    assert not b.has(c[2]) and all(b.has(k) for k in a) and b.evictions == 1


@pytest.fixture
def small_redis(tmp_path):
    """A redis-server whose budget is its own: ``maxmemory`` 2 MB, ``allkeys-lru``."""
    from services import free_port, redis_server, start_redis

    server = redis_server()
    port = free_port()
    proc = start_redis(server, port, tmp_path, "--maxmemory", "2mb", "--maxmemory-policy", "allkeys-lru")
    yield f"redis://127.0.0.1:{port}/0"
    proc.kill()
    proc.wait(timeout=10)


def test_redis_maxmemory_is_the_budget_and_a_hole_ends_a_prefix(small_redis):
    """Chains of raw blocks (32 KB each, 3 MB in all) into a Redis server with 2 MB: the server evicts by
    its own clock, middle blocks included; every prefix served is exact, a hole ends it, and
    the holes are counted."""
    torch = pytest.importorskip("torch")
    from speckv.prefix.free_store import FreePrefixStore

    backend = RedisBackend(small_redis, prefix="budget:")
    store = FreePrefixStore("m", backend, block_size=16, dtype="bf16", coding="raw")
    g = torch.Generator().manual_seed(0)

    def cache():
        return [tuple(torch.randn(1, 4, 128, 64, generator=g).to(torch.bfloat16) for _ in range(2)) for _ in range(4)]

    # a middle block gone, as the server's eviction leaves a chain: the prefix ends before it
    ids = torch.randint(0, 1000, (1, 16 * 8), generator=g)
    store.put(ids, cache())
    backend.delete(store.keys(ids)[3])
    assert store.match(ids, read=False) == 48 and store.get_kv(ids)[1] == 48
    assert store.stats_counters()["holes"] == 1
    prompts, caches = [], []
    for _ in range(12):
        ids = torch.randint(0, 1000, (1, 16 * 8), generator=g)
        kv = cache()
        store.put(ids, kv)
        prompts.append(ids)
        caches.append(kv)
    assert backend.nbytes() <= 2 * 1024 * 1024
    # reads never make a Redis server evict: what is stored now stays for the checks below
    keys = [store.keys(ids) for ids in prompts]
    present = [[backend.has(k) for k in chain] for chain in keys]
    first_missing = [p.index(False) if False in p else len(p) for p in present]
    holes = sum(n < len(p) - 1 and p[n + 1] for n, p in zip(first_missing, present))
    assert sum(map(sum, present)) < 12 * 8  # the server evicted (roots, tails and middles alike)
    served = 0
    for ids, kv, n in zip(prompts, caches, first_missing):
        assert store.match(ids, read=False) == 16 * n
        back, got = store.get_kv(ids)
        assert got == 16 * n
        served += got
        for (k, v), (k2, v2) in zip(kv, back):
            assert torch.equal(k2.view(torch.int16), k[:, :, :got].view(torch.int16))
            assert torch.equal(v2.view(torch.int16), v[:, :, :got].view(torch.int16))
    counters = store.stats_counters()
    assert served < 12 * 128  # roots are evicted as readily as tails: often nothing is served
    assert counters["corrupt_entries"] == 0
    assert counters["holes"] == 1 + holes  # each prefix that ended at a hole, counted by match
