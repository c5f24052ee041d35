"""``TieredBackend``: RAM over disk (or Redis), written through, a lower tier's hit promoted,
counters per tier, and a failing tier passed over while another can answer."""

from __future__ import annotations

import hashlib

import pytest

from speckv.store import DirectoryBackend, MemoryBackend, StoreError, pack_entry, unpack_entry
from speckv.store.tiered import TieredBackend

ENTRY = 100 + 24


def key(i: int) -> str:
    return hashlib.blake2b(str(i).encode(), digest_size=16).hexdigest()


def chain(b, chain_id: int, n: int) -> list[str]:
    keys, parent = [], None
    for d in range(n):
        k = key(chain_id * 1000 + d)
        assert b.put(k, pack_entry(bytes([d]) * 100, k), parent)
        keys.append(k)
        parent = k
    return keys


class Dead(MemoryBackend):
    """A tier whose every call fails (a Redis server that went away)."""

    def __getattribute__(self, name):
        if name in ("get", "has", "put", "delete", "keys", "nbytes"):

            def fail(*args, **kwargs):
                raise StoreError("connection refused")

            return fail
        return super().__getattribute__(name)


def test_ram_over_disk_writes_through_and_promotes(tmp_path):
    ram = DirectoryBackend(tmp_path / "ram", max_bytes=3 * ENTRY, durable=False)
    disk = DirectoryBackend(tmp_path / "disk")
    tiers = TieredBackend([ram, disk])
    a = chain(tiers, 1, 3)
    b = chain(tiers, 2, 3)  # RAM keeps chain 2; the disk keeps both
    assert set(ram.keys()) == set(b) and set(disk.keys()) == set(a + b)
    assert tiers.evictions == 3 and tiers.nbytes() == 3 * ENTRY
    for k in a:  # chain 1 from the disk, promoted into RAM
        assert unpack_entry(tiers.get(k), k) == bytes([a.index(k)]) * 100
    tiers.touch_chain(a)
    assert set(ram.keys()) == set(a)
    assert tiers.has(b[0]) and tiers.get(key(99)) is None
    stats = tiers.tier_stats()
    assert stats[0]["misses"] == 4 and stats[1]["hits"] == 3 and stats[0]["promotions"] == 3
    assert stats[0]["bytes"] == 3 * ENTRY and stats[1]["bytes"] == 6 * ENTRY
    tiers.delete(a[2])
    assert not ram.has(a[2]) and not disk.has(a[2])
    assert sorted(tiers.keys()) == sorted(set(a[:2] + b))


def test_a_dead_lower_tier_costs_only_what_it_alone_held():
    ram = MemoryBackend(10 * ENTRY)
    tiers = TieredBackend([ram, Dead()])
    keys = chain(tiers, 1, 3)  # stored in RAM; the dead tier's failures counted
    assert all(unpack_entry(tiers.get(k), k) for k in keys)
    assert tiers.get(key(77)) is None  # RAM answers; the dead tier's error is not the caller's
    assert tiers.tier_stats()[1]["faults"] >= 4 and tiers.tier_stats()[1]["bytes"] is None
    both = TieredBackend([Dead(), Dead()])
    for call in (lambda: both.get(keys[0]), lambda: both.put(keys[0], b"x"), both.keys):
        with pytest.raises(StoreError):
            call()
    with pytest.raises(StoreError):
        TieredBackend([ram])


def test_a_prefix_store_over_tiers_serves_exact_prefixes(tmp_path):
    torch = pytest.importorskip("torch")
    from speckv.integrations.engine import open_backend
    from speckv.prefix.free_store import FreePrefixStore

    backend = open_backend([str(tmp_path / "ram"), str(tmp_path / "disk")], max_bytes=[60_000, None])
    assert isinstance(backend, TieredBackend)
    store = FreePrefixStore("m", backend, block_size=16)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 1000, (1, 64), generator=g) for _ in range(4)]
    caches = [[tuple(torch.randn(1, 2, 64, 64, generator=g).to(torch.bfloat16) for _ in range(2))] * 2 for _ in prompts]
    for ids, kv in zip(prompts, caches):
        store.put(ids, kv)
    assert backend.tiers[0].nbytes() <= 60_000 and backend.evictions > 0
    for ids, kv in zip(prompts, caches):  # every prompt whole again, from one tier or the other
        back, n = store.get_kv(ids)
        assert n == 64
        for (k, v), (k2, v2) in zip(kv, back):
            assert torch.equal(k2, k) and torch.equal(v2, v)
    assert backend.tier_stats()[1]["hits"] > 0
    with pytest.raises(ValueError, match="budgets"):
        open_backend(["memory", str(tmp_path / "d")], max_bytes=[1, 2, 3])


def test_the_old_path_imports_the_same_backend_with_a_warning():
    """``speckv.tiered`` moved into ``speckv.store`` (0.1 -> 0.2): the old path still imports
    the same class for one release, and says where it went."""
    import importlib
    import sys

    sys.modules.pop("speckv.tiered", None)
    with pytest.warns(DeprecationWarning, match="speckv.store.tiered"):
        old = importlib.import_module("speckv.tiered")
    assert old.TieredBackend is TieredBackend
    from speckv.store import TieredBackend as exported

    assert exported is TieredBackend
