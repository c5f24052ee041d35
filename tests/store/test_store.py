"""Storage backends: entry framing, memory (eviction without holes), directory (atomic writes,
killed writers, readers in other processes), and a real Redis server on a loopback port."""

from __future__ import annotations

import hashlib
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

import speckv
from services import free_port, redis_cluster_url, redis_server, redis_url, start_redis  # noqa: F401  (loopback Redis)
from speckv.store import (
    DirectoryBackend,
    MemoryBackend,
    RedisBackend,
    StoreError,
    check_key,
    pack_entry,
    unpack_entry,
)


def key(i: int) -> str:
    return hashlib.blake2b(str(i).encode(), digest_size=16).hexdigest()


def test_entries_round_trip_and_damage_is_typed():
    payload = os.urandom(1000)
    data = pack_entry(payload, key(0))
    assert unpack_entry(data, key(0)) == payload
    assert unpack_entry(pack_entry(b"", key(1)), key(1)) == b""
    flipped = bytearray(data)
    flipped[500] ^= 4
    with pytest.raises(speckv.ChecksumError):
        unpack_entry(bytes(flipped), key(0))
    for bad in (data[:-1], data + b"x", data[:10], b"XXXX" + data[4:], b""):
        with pytest.raises(speckv.CorruptStreamError):
            unpack_entry(bad, key(0))


def test_an_entry_read_under_another_key_is_refused():
    """A whole, undamaged entry copied or renamed under another key must not pass as that
    key's (it holds another block's cache)."""
    data = pack_entry(b"block zero's cache", key(0))
    with pytest.raises(speckv.ChecksumError):
        unpack_entry(data, key(1))


def test_version_1_entries_are_refused():
    """Entries framed before the checksum was keyed: refused (recomputed), never served."""
    import struct

    payload = b"old"
    old = b"SPKB" + struct.pack("<HHQ", 1, 0, len(payload)) + hashlib.blake2b(payload, digest_size=8).digest() + payload
    with pytest.raises(speckv.CorruptStreamError):
        unpack_entry(old, key(0))


def test_entries_are_version_3_with_a_pinned_checksum():
    """The entry layout and its XXH3 checksum keyed by the key (golden bytes: a change reads
    every stored entry as damaged); the checksum is the one the xxhash package computes."""
    import struct

    import xxhash

    k = "00112233445566778899aabbccddeeff"
    data = pack_entry(b"payload", k)
    want = xxhash.xxh3_64_intdigest(b"payload", seed=xxhash.xxh3_64_intdigest(k.encode()))
    assert data == b"SPKB" + struct.pack("<HHQQ", 3, 0, 7, want) + b"payload"
    assert want == 0x9E2B5EF8C8E2A9B2  # rust/speckv/src/hash.rs pins the same word


def test_version_2_entries_are_still_read():
    """Entries checksummed with BLAKE2b-64 keyed by the key (before version 3): read as they
    are, and refused when damaged or under another key."""
    import struct

    payload = os.urandom(300)

    def v2(k: str, body: bytes) -> bytes:
        digest = hashlib.blake2b(body, digest_size=8, key=k.encode()).digest()
        return b"SPKB" + struct.pack("<HHQ", 2, 0, len(body)) + digest + body

    assert unpack_entry(v2(key(0), payload), key(0)) == payload
    with pytest.raises(speckv.ChecksumError):
        unpack_entry(v2(key(0), payload), key(1))
    damaged = bytearray(v2(key(0), payload))
    damaged[100] ^= 1
    with pytest.raises(speckv.ChecksumError):
        unpack_entry(bytes(damaged), key(0))


def test_keys_are_hex_digests_only():
    assert check_key(key(1)) == key(1)
    for bad in ("../../etc/passwd", key(1).upper(), "abc", key(1) + "0" * 40, 5):
        with pytest.raises(StoreError):
            check_key(bad)


def chain(n: int, size: int = 100) -> list[tuple[str, bytes, str | None]]:
    return [(key(i), bytes([i % 256]) * size, key(i - 1) if i else None) for i in range(n)]


def test_memory_backend_basics():
    b = MemoryBackend()
    items = chain(4)
    for k, v, parent in items:
        assert b.put(k, v, parent)
    assert not b.put(items[0][0], b"other")  # already there
    assert b.get(items[2][0]) == items[2][1] and b.get(key(99)) is None
    assert b.has(items[2][0]) and not b.has(key(99))
    assert not b.put(key(50), b"x", parent=key(77))  # a block whose prefix is gone
    assert b.nbytes() == 400 and len(b.keys()) == 4
    b.delete(items[1][0])  # and everything that extends it
    assert b.keys() == [items[0][0]]


@given(
    st.lists(st.tuples(st.integers(0, 3), st.integers(1, 6), st.integers(10, 120)), min_size=1, max_size=40),
    st.integers(0, 600),
)
def test_memory_eviction_never_leaves_a_hole(ops, limit):
    """Random chains put block by block under a byte limit: every stored block's prefix is
    stored, the limit holds, and an accepted put is readable right after."""
    b = MemoryBackend(limit)
    for chain_id, length, size in ops:
        parent = None
        for depth in range(length):
            k = key(chain_id * 1000 + depth)
            value = bytes([depth]) * size
            ok = b.put(k, value, parent)
            if ok:
                assert b.get(k) == value
            if b.get(k) is None:
                break
            parent = k
        assert b.nbytes() <= limit
        stored = set(b.keys())
        for k in stored:
            _, parent_of = b._entries[k]
            assert parent_of is None or parent_of in stored


def test_directory_backend_persists_and_lists(tmp_path):
    b = DirectoryBackend(tmp_path / "store")
    for k, v, parent in chain(3):
        assert b.put(k, pack_entry(v, k), parent)
    assert not b.put(key(0), b"again")
    again = DirectoryBackend(tmp_path / "store")  # a restart
    assert sorted(again.keys()) == sorted(key(i) for i in range(3))
    assert unpack_entry(again.get(key(1)), key(1)) == bytes([1]) * 100
    assert again.get(key(9)) is None
    assert again.has(key(1)) and not again.has(key(9))
    assert again.nbytes() == 3 * (100 + 24)
    again.delete(key(1))
    again.delete(key(1))  # absent: fine
    assert again.get(key(1)) is None


def test_directory_backend_syncs_what_an_entry_needs(tmp_path, monkeypatch):
    """An acknowledged entry survives a crash only if its file, its name and its folders' names
    are on disk: put syncs the file, its folder, and the store's folder when it made a folder;
    a new store syncs the folder it was made in."""
    import speckv.store.directory as store_module

    synced: list[str] = []
    real_sync = store_module._sync_dir
    monkeypatch.setattr(store_module, "_sync_dir", lambda p: (synced.append(str(p)), real_sync(p)))
    b = DirectoryBackend(tmp_path / "store")
    assert synced == [str(tmp_path)]
    synced.clear()
    k = key(0)
    assert b.put(k, pack_entry(b"v", k))
    assert synced == [str(tmp_path / "store"), str(tmp_path / "store" / k[:2])]
    synced.clear()
    other = next(key(i) for i in range(1, 1000) if key(i)[:2] == k[:2])  # same folder
    assert b.put(other, pack_entry(b"w", other))
    assert synced == [str(tmp_path / "store" / k[:2])]


KILLED_WRITER = """
import os, signal, stat, sys
from speckv.store import DirectoryBackend
real_fsync = os.fsync
def fsync(fd):
    if stat.S_ISREG(os.fstat(fd).st_mode):  # the entry's file is written: die before the rename
        os.kill(os.getpid(), signal.SIGKILL)
    real_fsync(fd)
os.fsync = fsync
DirectoryBackend(sys.argv[1]).put(sys.argv[2], b"x" * 100000)
"""


def test_a_killed_writer_leaves_no_entry(tmp_path):
    path = tmp_path / "store"
    out = subprocess.run([sys.executable, "-c", KILLED_WRITER, str(path), key(5)], capture_output=True)
    assert out.returncode != 0
    b = DirectoryBackend(path)
    assert b.get(key(5)) is None and b.keys() == []
    assert b.cleanup(older_than_s=3600) == 0  # might be a writer still at work
    assert b.cleanup(older_than_s=0) == 1
    assert b.put(key(5), b"whole")
    assert b.get(key(5)) == b"whole"


READER = """
import sys, time
from speckv.store import DirectoryBackend, unpack_entry
b = DirectoryBackend(sys.argv[1])
keys = sys.argv[2:]
seen = 0
deadline = time.time() + 60
while seen < len(keys) and time.time() < deadline:
    seen = 0
    for k in keys:
        data = b.get(k)
        if data is not None:
            assert unpack_entry(data, k) == bytes([int(k[:2], 16)]) * 200000, k
            seen += 1
print(seen)
"""


def test_readers_in_other_processes_see_whole_entries(tmp_path):
    path = tmp_path / "store"
    DirectoryBackend(path)
    keys = [key(i) for i in range(20)]
    readers = [
        subprocess.Popen([sys.executable, "-c", READER, str(path), *keys], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    writer = DirectoryBackend(path)
    for k in keys:
        writer.put(k, pack_entry(bytes([int(k[:2], 16)]) * 200000, k))
    for r in readers:
        out, _ = r.communicate(timeout=120)
        assert r.returncode == 0 and out.strip() == "20"


def test_a_redis_cluster_stores_every_key_on_its_slots_master(redis_cluster_url):
    """Entries spread over the cluster's masters; every call answers as a single server's:
    first writer wins, absent keys are None, a deleted key is gone, keys() sees every node."""
    store = RedisBackend(redis_cluster_url, prefix="t:")
    keys = [hashlib.sha256(bytes([i])).hexdigest()[:32] for i in range(64)]
    for k in keys:
        assert store.put(k, pack_entry(k.encode() * 100, k))
        assert not store.put(k, b"other")
    assert sorted(store.keys()) == sorted(keys)
    nodes = {store.client.get_node_from_key("t:" + k).name for k in keys}
    assert len(nodes) == 3  # on every master
    assert all(unpack_entry(store.get(k), k) == k.encode() * 100 for k in keys)
    store.delete(keys[0])
    assert store.get(keys[0]) is None and not store.has(keys[0]) and store.has(keys[1])
    assert store.nbytes() == sum(len(pack_entry(k.encode() * 100, k)) for k in keys[1:])
    assert "cluster" in repr(store)


def test_a_redis_server_killed_and_restarted_mid_chain(tmp_path):
    """The server dies after two of a chain's entries: every call then raises StoreError (never
    a wrong or partial answer); restarted empty (no persistence), the lost entries are absent,
    not wrong, and the chain is stored again."""
    server = redis_server()
    port = free_port()
    proc = start_redis(server, port, tmp_path)
    try:
        b = RedisBackend(f"redis://127.0.0.1:{port}/0", prefix="kill:")
        entries = chain(4)
        for k, v, parent in entries[:2]:
            assert b.put(k, pack_entry(v, k), parent)
        proc.kill()
        proc.wait(timeout=10)
        k, v, parent = entries[2]
        for call in (lambda: b.put(k, pack_entry(v, k), parent), lambda: b.get(entries[0][0]), b.keys):
            with pytest.raises(StoreError):
                call()
        proc = start_redis(server, port, tmp_path)
        assert b.get(entries[0][0]) is None and b.keys() == []
        for k, v, parent in entries:
            assert b.put(k, pack_entry(v, k), parent)
        assert [unpack_entry(b.get(k), k) for k, _, _ in entries] == [v for _, v, _ in entries]
    finally:
        proc.kill()
        proc.wait(timeout=10)


def test_redis_backend_against_a_real_server(redis_url):
    b = RedisBackend(redis_url, prefix="t1:")
    for k, v, parent in chain(3):
        assert b.put(k, pack_entry(v, k), parent)
    assert not b.put(key(0), b"again")  # the first writer wins
    assert unpack_entry(b.get(key(2)), key(2)) == bytes([2]) * 100
    assert b.get(key(7)) is None
    assert b.has(key(2)) and not b.has(key(7))
    assert sorted(b.keys()) == sorted(key(i) for i in range(3))
    assert b.nbytes() == 3 * 124
    b.delete(key(2))
    assert b.get(key(2)) is None
    # another prefix is another store
    assert RedisBackend(redis_url, prefix="t2:").keys() == []


def test_redis_prefixes_are_literal_not_globs(redis_url):
    """SCAN matches a glob: a prefix holding glob characters lists its own keys, and not the
    keys of the prefixes its glob would match."""
    odd, near = RedisBackend(redis_url, prefix="g[x]*?\\:"), RedisBackend(redis_url, prefix="gx:")
    assert odd.put(key(1), pack_entry(b"odd", key(1))) and near.put(key(2), pack_entry(b"near", key(2)))
    assert odd.keys() == [key(1)] and near.keys() == [key(2)]
    assert odd.nbytes() == len(pack_entry(b"odd", key(1)))


def test_redis_backend_reports_a_dead_server():
    pytest.importorskip("redis")
    b = RedisBackend(f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(StoreError, match="redis"):
        b.get(key(1))


def test_directory_backend_errors_are_typed(tmp_path, monkeypatch):
    """OSErrors from every call come out as StoreError: a folder the process may not search
    (simulated: root searches every folder), an entry path that is a folder, a store folder
    replaced by a file."""
    from pathlib import Path

    b = DirectoryBackend(tmp_path / "store")
    assert b.put(key(0), pack_entry(b"v", key(0)))
    real_is_file = Path.is_file

    def denied(self, *args, **kwargs):
        if self.name.endswith(DirectoryBackend.SUFFIX):
            raise PermissionError(13, "Permission denied", str(self))
        return real_is_file(self, *args, **kwargs)

    monkeypatch.setattr(Path, "is_file", denied)
    with pytest.raises(StoreError, match="Permission denied"):
        b.has(key(0))
    monkeypatch.undo()
    b._file(key(1)).parent.mkdir(exist_ok=True)
    b._file(key(1)).mkdir()
    with pytest.raises(StoreError):
        b.delete(key(1))
    shutil.rmtree(tmp_path / "store")
    (tmp_path / "store").write_bytes(b"not a folder")
    for call in (b.keys, b.nbytes, b.cleanup):
        with pytest.raises(StoreError):
            call()


def test_a_stalled_redis_server_costs_one_timeout_then_a_typed_error():
    """A server that accepts connections and never answers: each call fails with StoreError
    after the backend's own timeout (redis-py's defaults wait far longer, or forever)."""
    pytest.importorskip("redis", reason="the redis client package is not installed")
    import threading

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    held = []
    threading.Thread(target=lambda: [held.append(listener.accept()) for _ in range(8)], daemon=True).start()
    port = listener.getsockname()[1]
    b = RedisBackend(f"redis://127.0.0.1:{port}/0", timeout_s=0.2)
    for call in (lambda: b.get(key(0)), lambda: b.has(key(0)), lambda: b.put(key(0), b"v")):
        start = time.monotonic()
        with pytest.raises(StoreError):
            call()
        assert time.monotonic() - start < 5  # one timeout (0.2 s, a retry at most), not a hang
    listener.close()
