"""Where compressed cache blocks live: one small interface, three backends.

A backend maps keys to entries. Keys are lowercase hex digests (16 to 64 digits): the prefix
store names a token block by a hash chain over the blocks up to it, so a key also names its
whole prefix, and ``parent`` (the previous block's key) is given with each ``put``. Entries are
opaque bytes to a backend; ``pack_entry`` / ``unpack_entry`` frame them with a length and a
checksum keyed by the entry's own key, so that a damaged entry, or a whole entry copied or
renamed under another key, reads as ``CorruptStreamError`` instead of a wrong cache.

Entry layout (little-endian)::

    offset  size  field
    0       4     magic b"SPKB"
    4       2     entry version (3)
    6       2     reserved, 0
    8       8     payload length N
    16      8     checksum of the payload keyed with the entry's key (its ASCII hex): XXH3-64
                  seeded with the key's XXH3-64 (``speckv::hash::keyed_checksum``)
    24      N     payload

Version 2 entries (the same, the checksum a BLAKE2b-64 keyed with the key) are still read:
BLAKE2b cost more than decoding a fast-lane block, so version 3 checksums with XXH3 (a
checksum against damage and misplaced entries, not a MAC: whoever can write the store can
write any entry). Version 1 entries, checksummed without their key, are refused: they are
recomputed.

Every backend call raises ``StoreError`` for what goes wrong underneath (I/O, permissions,
a lost or stalled connection: ``RedisBackend`` sets its own timeouts), never an ``OSError`` or
a client library's exception.

Backends (``Backend`` is the whole interface):

- ``MemoryBackend(max_bytes)``: in this process; least-recently-used eviction that only ever
  removes a block no stored block extends, so a stored prefix never has a hole.
- ``DirectoryBackend(path, max_bytes)``: a file per entry, written to a temporary name,
  flushed to disk and renamed (atomic on POSIX): readers in other processes see a whole entry
  or none, and a writer killed midway leaves only a temporary file that is never read
  (``cleanup`` removes old ones). Survives restarts. With ``max_bytes``, the same
  tail-first least-recently-used eviction as the memory backend, across every process that
  shares the folder (see "Budgets" below). A folder on a RAM file system (``/dev/shm``) is
  the host-RAM tier that processes share (``memory_tier``).
- ``RedisBackend(url)``: a Redis server (the ``redis`` client package; ``SET NX``: the first
  writer of a key wins, and every writer of a key writes the same bytes). Its budget is the
  server's: ``maxmemory`` with ``maxmemory-policy allkeys-lru``. Redis evicts by its own
  sampled clock and knows nothing of chains, so it may remove a block in the middle of a
  stored prefix: the prefix then ends there (a miss, never a wrong cache; prefix stores count
  it as a ``hole``).

Budgets (``max_bytes``: the bytes of the entries themselves, headers included): a put that
does not fit evicts least recently used entries first, and only entries that no stored entry
extends, so that a prefix loses its last blocks first and never one in its middle; a put
whose ``parent`` is no longer stored is declined (it could never be reached). "Used" is what
prefix stores tell a backend through the optional ``touch_chain(keys)``: a chain of keys
just matched, read or stored, root first. The directory backend keeps the order as stamps
of a logical clock, stored as the files' modification times: a touched chain is stamped
newer than every other entry, root newest, and a new entry just older than its parent, so
that every entry is older than the entry it extends (the invariant that makes the oldest
entry a leaf). Its byte count and clock live in a small file (``.budget``); all of it changes
under an exclusive lock on the folder (``fcntl.flock``), so that any number of processes
can share one budget.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import struct
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from ._speckv import ChecksumError, CorruptStreamError, SpeckvError, entry_checksum

ENTRY_MAGIC = b"SPKB"
ENTRY_VERSION = 3
# the version before XXH3 checksums (BLAKE2b-64): still read
_ENTRY_VERSION_BLAKE2 = 2
ENTRY_HEADER = 24
_KEY = re.compile(r"[0-9a-f]{16,64}")


class StoreError(SpeckvError):
    """A backend could not do what was asked (I/O error, lost connection, bad key)."""


def check_key(key: str) -> str:
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        raise StoreError(f"key: expected 16 to 64 lowercase hex digits, got {key!r}")
    return key


def _entry_digest(payload: bytes, key: str, version: int = ENTRY_VERSION) -> bytes:
    if version == _ENTRY_VERSION_BLAKE2:
        return hashlib.blake2b(payload, digest_size=8, key=check_key(key).encode()).digest()
    return struct.pack("<Q", entry_checksum(check_key(key).encode(), payload))


def pack_entry(payload: bytes, key: str) -> bytes:
    """``payload`` framed with its length and a checksum keyed by ``key``, the key it is
    stored under (see the module docs)."""
    digest = _entry_digest(payload, key)
    return ENTRY_MAGIC + struct.pack("<HHQ", ENTRY_VERSION, 0, len(payload)) + digest + payload


def unpack_entry(data: bytes, key: str) -> bytes:
    """The payload of an entry read from under ``key``; ``CorruptStreamError``
    (``ChecksumError``) if it is damaged or was framed for another key."""
    view = memoryview(data)
    if len(view) < ENTRY_HEADER or bytes(view[:4]) != ENTRY_MAGIC:
        raise CorruptStreamError("store entry: bad magic or truncated header")
    version, reserved, length = struct.unpack_from("<HHQ", view, 4)
    if version not in (ENTRY_VERSION, _ENTRY_VERSION_BLAKE2) or reserved != 0:
        raise CorruptStreamError(f"store entry: version {version} is not supported")
    if length != len(view) - ENTRY_HEADER:
        raise CorruptStreamError("store entry: length does not match (truncated or extended)")
    payload = bytes(view[ENTRY_HEADER:])
    if _entry_digest(payload, key, version) != bytes(view[16:24]):
        raise ChecksumError("store entry: checksum does not match (damaged, or stored under another key)")
    return payload


@runtime_checkable
class Backend(Protocol):
    """The storage interface of ``PrefixStore``: whole entries under hex keys."""

    def get(self, key: str) -> bytes | None:
        """The entry, or None if absent."""
        ...

    def has(self, key: str) -> bool:
        """Whether ``key`` holds an entry (nothing read)."""
        ...

    def put(self, key: str, value: bytes, parent: str | None = None) -> bool:
        """Stores ``value`` under ``key`` (``parent``: the key it extends). False if the key was
        already there or the backend declined (full, or ``parent`` is gone); once it returns
        True a ``get`` in any process sees the whole entry."""
        ...

    def delete(self, key: str) -> None: ...

    def keys(self) -> list[str]: ...

    def nbytes(self) -> int:
        """Bytes held by entries."""
        ...


def touch_chain(backend: Backend, keys: list[str]) -> None:
    """Tells ``backend`` that the chain ``keys`` (root first) was just used, where it keeps a
    least-recently-used order (the optional ``touch_chain`` method; others ignore it)."""
    touch = getattr(backend, "touch_chain", None)
    if touch is not None and keys:
        touch(keys)


class MemoryBackend:
    """Entries in this process's memory, at most ``max_bytes`` of them (None: no limit).

    Eviction takes the least recently used entry that no other entry extends: a prefix loses
    its last blocks first and never a block in its middle. A ``put`` whose parent is absent is
    declined for the same reason. Thread-safe."""

    def __init__(self, max_bytes: int | None = None) -> None:
        if max_bytes is not None and max_bytes < 0:
            raise StoreError(f"max_bytes: must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._entries: OrderedDict[str, tuple[bytes, str | None]] = OrderedDict()
        self._children: dict[str, int] = {}
        self._bytes = 0
        self._lock = threading.Lock()
        self.evictions = 0

    def get(self, key: str) -> bytes | None:
        check_key(key)
        with self._lock:
            item = self._entries.get(key)
            if item is None:
                return None
            self._entries.move_to_end(key)
            return item[0]

    def has(self, key: str) -> bool:
        check_key(key)
        with self._lock:
            return key in self._entries

    def put(self, key: str, value: bytes, parent: str | None = None) -> bool:
        check_key(key)
        if parent is not None:
            check_key(parent)
        value = bytes(value)
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return False
            if parent is not None and parent not in self._entries:
                return False
            if self.max_bytes is not None and len(value) > self.max_bytes:
                return False
            # room first: evict leaves (never the parent being extended)
            while self.max_bytes is not None and self._bytes + len(value) > self.max_bytes:
                victim = next((k for k in self._entries if not self._children.get(k) and k != parent), None)
                if victim is None:
                    return False
                self._remove(victim)
                self.evictions += 1
            self._entries[key] = (value, parent)
            self._bytes += len(value)
            if parent is not None:
                self._children[parent] = self._children.get(parent, 0) + 1
                self._entries.move_to_end(parent, last=True)
                self._entries.move_to_end(key, last=True)
            return True

    def touch_chain(self, keys: list[str]) -> None:
        """Marks a chain (root first) as just used."""
        with self._lock:
            for k in keys:
                if k in self._entries:
                    self._entries.move_to_end(k)

    def _remove(self, key: str) -> None:
        value, parent = self._entries.pop(key)
        self._bytes -= len(value)
        self._children.pop(key, None)
        if parent is not None and parent in self._children:
            self._children[parent] -= 1
            if not self._children[parent]:
                del self._children[parent]

    def delete(self, key: str) -> None:
        """Removes ``key`` and every entry that extends it (no holes)."""
        check_key(key)
        with self._lock:
            doomed = {key} if key in self._entries else set()
            changed = True
            while changed:
                changed = False
                for k, (_, parent) in self._entries.items():
                    if parent in doomed and k not in doomed:
                        doomed.add(k)
                        changed = True
            # leaves first, so that child counts stay right
            for k in sorted(doomed, key=lambda k: self._depth(k), reverse=True):
                self._remove(k)

    def _depth(self, key: str) -> int:
        depth = 0
        parent = self._entries[key][1]
        while parent is not None and parent in self._entries:
            depth += 1
            parent = self._entries[parent][1]
        return depth

    def keys(self) -> list[str]:
        with self._lock:
            return list(self._entries)

    def nbytes(self) -> int:
        return self._bytes


class DirectoryBackend:
    """A file per entry under ``path`` (``ab/abcdef....spkb``). Writes go to a temporary file
    in the same folder, are flushed to disk and renamed over the final name, and the folder is
    synced: an entry is either whole or absent, whoever reads and whenever a writer dies.
    Several processes may read and write the same folder.

    ``max_bytes`` (None: no limit) bounds the bytes of its entries, evicting the least
    recently used entries that nothing extends (see the module docs, "Budgets"); every process
    writing the folder must give the same budget. ``durable=False`` skips the flushes to disk
    (a RAM file system has no disk; entries are still renamed into place whole)."""

    SUFFIX = ".spkb"
    TMP_PREFIX = ".tmp-"
    LOCK = ".lock"
    # a budgeted folder's state, 16 bytes little-endian: the bytes its entries hold, then the
    # stamp clock (rebuilt from the files when missing or damaged)
    STATE = ".budget"
    # entries' stamps (kept as their modification times, in ns) are the clock's ticks times
    # this: an entry put under a parent is stamped one less than its parent, so chains of up
    # to this many new blocks stay apart from the next tick
    TICK = 1 << 20

    def __init__(self, path: str | os.PathLike[str], max_bytes: int | None = None, *, durable: bool = True) -> None:
        if max_bytes is not None and max_bytes < 0:
            raise StoreError(f"max_bytes: must be >= 0, got {max_bytes}")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.durable = durable
        self.evictions = 0
        self._thread_lock = threading.Lock()
        self._lock_fd: tuple[int, int] | None = None  # (pid, fd): an fd inherited across fork is not ours
        try:
            if not self.path.is_dir():
                self.path.mkdir(parents=True, exist_ok=True)
                if durable:
                    _sync_dir(self.path.parent)  # the store's own name, as for its folders (put)
        except OSError as e:
            raise StoreError(f"{self.path}: {e}") from None

    def __repr__(self) -> str:
        budget = "" if self.max_bytes is None else f", max_bytes={self.max_bytes}"
        return f"DirectoryBackend({str(self.path)!r}{budget})"

    def _file(self, key: str) -> Path:
        check_key(key)
        return self.path / key[:2] / (key + self.SUFFIX)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """This folder's budget lock: threads of this process, then processes (flock)."""
        with self._thread_lock:
            pid = os.getpid()
            if self._lock_fd is None or self._lock_fd[0] != pid:
                self._lock_fd = (pid, os.open(self.path / self.LOCK, os.O_RDWR | os.O_CREAT, 0o644))
            fd = self._lock_fd[1]
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def get(self, key: str) -> bytes | None:
        try:
            return self._file(key).read_bytes()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StoreError(f"{self._file(key)}: {e}") from None

    def has(self, key: str) -> bool:
        path = self._file(key)
        try:
            return path.is_file()
        except OSError as e:  # is_file lets some through (a folder it may not search)
            raise StoreError(f"{path}: {e}") from None

    def put(self, key: str, value: bytes, parent: str | None = None) -> bool:
        final = self._file(key)
        try:
            if self.max_bytes is None:
                if final.exists():
                    return False
                self._write(final, value)
                return True
            if parent is not None:
                check_key(parent)
            with self._locked():
                return self._put_budgeted(final, value, parent)
        except OSError as e:
            raise StoreError(f"{final}: {e}") from None

    def _write(self, final: Path, value: bytes) -> None:
        if not final.parent.is_dir():
            final.parent.mkdir(exist_ok=True)
            # the new folder's own name must be on disk too, or a crash could lose it and
            # every entry acknowledged in it
            if self.durable:
                _sync_dir(self.path)
        write_whole(final, value, prefix=self.TMP_PREFIX + final.stem + "-", durable=self.durable)

    def _put_budgeted(self, final: Path, value: bytes, parent: str | None) -> bool:
        """``put`` under the lock: room made, the entry written and stamped just older than
        its parent (a root: the newest tick), the byte count kept."""
        assert self.max_bytes is not None
        if final.exists() or len(value) > self.max_bytes:
            return False
        used, clock = self._state()
        if parent is None:
            clock += 1
            stamp = clock * self.TICK
        else:
            try:
                stamp = self._file(parent).stat().st_mtime_ns - 1
            except FileNotFoundError:
                return False  # its prefix is gone: it could never be reached
        if used + len(value) > self.max_bytes:
            keep = None if parent is None else self._file(parent)
            used = self._evict(self.max_bytes - len(value), keep)
            if used + len(value) > self.max_bytes:
                self._set_state(used, clock)
                return False
        self._write(final, value)
        os.utime(final, ns=(stamp, stamp))
        self._set_state(used + len(value), clock)
        return True

    def _entries_by_age(self) -> tuple[list[tuple[int, int, Path]], int]:
        """Every entry as (stamp, size, path), oldest first, and their bytes."""
        found = []
        for sub in self._subfolders():
            with os.scandir(sub) as it:
                for e in it:
                    if e.name.endswith(self.SUFFIX) and not e.name.startswith(self.TMP_PREFIX):
                        with _ignore_missing():
                            st = e.stat()
                            found.append((st.st_mtime_ns, st.st_size, Path(e.path)))
        found.sort(key=lambda t: (t[0], t[2].name))
        return found, sum(size for _, size, _ in found)

    def _evict(self, target: int, keep: Path | None) -> int:
        """Removes the oldest entries until at most ``target`` bytes are held, stopping at
        ``keep`` (the parent of the entry being put: what is newer than it is its own prefix,
        just touched, or newer still); returns the bytes held. The oldest entry is always one
        that nothing extends (module docs)."""
        found, used = self._entries_by_age()
        for _, size, path in found:
            if used <= target or path == keep:
                break
            with _ignore_missing():
                path.unlink()
                used -= size
                self.evictions += 1
        return used

    def _state(self) -> tuple[int, int]:
        """(bytes held, stamp clock), from the state file or, missing or damaged, the files."""
        try:
            data = (self.path / self.STATE).read_bytes()
        except FileNotFoundError:
            data = b""
        if len(data) != 16:
            found, used = self._entries_by_age()
            clock = max((stamp // self.TICK for stamp, _, _ in found), default=0) + 1
            self._set_state(used, clock)
            return used, clock
        return int.from_bytes(data[:8], "little"), int.from_bytes(data[8:], "little")

    def _set_state(self, used: int, clock: int) -> None:
        (self.path / self.STATE).write_bytes(max(used, 0).to_bytes(8, "little") + clock.to_bytes(8, "little"))

    def touch_chain(self, keys: list[str]) -> None:
        """Stamps a chain just used (root first) newer than every other entry, the root the
        newest: every entry stays older than the entry it extends (module docs, "Budgets").
        Only a budgeted folder keeps an order (nothing else evicts)."""
        if self.max_bytes is None or not keys:
            return
        paths = [self._file(k) for k in keys]
        try:
            with self._locked():
                used, clock = self._state()
                for i, path in enumerate(paths):
                    stamp = (clock + len(paths) - i) * self.TICK
                    with _ignore_missing():
                        os.utime(path, ns=(stamp, stamp))
                self._set_state(used, clock + len(paths))
        except OSError as e:
            raise StoreError(f"{self.path}: {e}") from None

    def delete(self, key: str) -> None:
        path = self._file(key)
        try:
            if self.max_bytes is None:
                with _ignore_missing():
                    path.unlink()
                return
            with self._locked():
                with _ignore_missing():
                    size = path.stat().st_size
                    path.unlink()
                    used, clock = self._state()
                    self._set_state(used - size, clock)
        except OSError as e:  # IsADirectoryError, PermissionError, ...
            raise StoreError(f"{path}: {e}") from None

    def keys(self) -> list[str]:
        try:
            return [p.name[: -len(self.SUFFIX)] for p in self._files()]
        except OSError as e:
            raise StoreError(f"{self.path}: {e}") from None

    def _subfolders(self) -> Iterator[Path]:
        for sub in self.path.iterdir() if self.path.exists() else ():
            if len(sub.name) == 2 and sub.is_dir():
                yield sub

    def _files(self) -> Iterator[Path]:
        for sub in self._subfolders():
            for p in sub.iterdir():
                if p.name.endswith(self.SUFFIX) and not p.name.startswith(self.TMP_PREFIX):
                    yield p

    def nbytes(self) -> int:
        try:
            if self.max_bytes is not None:
                with self._locked():
                    return self._state()[0]
            return self._entries_by_age()[1]
        except OSError as e:
            raise StoreError(f"{self.path}: {e}") from None

    def cleanup(self, older_than_s: float = 3600.0) -> int:
        """Removes temporary files older than ``older_than_s`` seconds (left by writers that
        died); returns how many. Younger ones may belong to a writer still at work."""
        removed = 0
        now = time.time()
        try:
            for sub in self.path.iterdir():
                if not sub.is_dir():
                    continue
                for p in sub.glob(self.TMP_PREFIX + "*"):
                    with _ignore_missing():
                        if now - p.stat().st_mtime > older_than_s:
                            p.unlink()
                            removed += 1
        except OSError as e:
            raise StoreError(f"{self.path}: {e}") from None
        return removed


class RedisBackend:
    """Entries in a Redis server, under ``prefix`` + key. ``url`` as the ``redis`` package
    reads it (``redis://host:port/db``), or an existing ``client`` (its own settings).

    ``timeout_s`` bounds connecting and every reply (the client's defaults differ by version
    and may wait for minutes): a stalled server costs at most that per call, then
    ``StoreError``; the URL's own ``socket_timeout`` / ``socket_connect_timeout`` win."""

    DEFAULT_TIMEOUT_S = 1.0

    def __init__(
        self,
        url: str | None = None,
        *,
        client: Any = None,
        prefix: str = "speckv:",
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> None:
        if client is None:
            try:
                import redis
            except ImportError:
                raise StoreError("RedisBackend needs the redis package: pip install 'speckv-rs[store]'") from None
            if not timeout_s > 0:
                raise StoreError(f"timeout_s: must be positive, got {timeout_s}")
            url = url or "redis://127.0.0.1:6379/0"
            options = {"socket_timeout": timeout_s, "socket_connect_timeout": timeout_s}
            for name in list(options):
                if name + "=" in url:  # the URL's query says otherwise
                    del options[name]
            try:
                client = redis.Redis.from_url(url, **options)
            except Exception as e:  # a malformed URL
                raise StoreError(f"redis: {e}") from None
        self.client = client
        self.prefix = prefix

    def __repr__(self) -> str:
        kw = getattr(getattr(self.client, "connection_pool", None), "connection_kwargs", {})
        where = f"{kw.get('host', '?')}:{kw.get('port', '?')}/{kw.get('db', 0)}" if "host" in kw else "a client"
        return f"RedisBackend({where}, prefix={self.prefix!r})"

    def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # redis.exceptions.RedisError and socket errors
            raise StoreError(f"redis: {e}") from None

    def get(self, key: str) -> bytes | None:
        return self._call(self.client.get, self.prefix + check_key(key))

    def has(self, key: str) -> bool:
        return bool(self._call(self.client.exists, self.prefix + check_key(key)))

    def put(self, key: str, value: bytes, parent: str | None = None) -> bool:
        return bool(self._call(self.client.set, self.prefix + check_key(key), bytes(value), nx=True))

    def delete(self, key: str) -> None:
        self._call(self.client.delete, self.prefix + check_key(key))

    def keys(self) -> list[str]:
        # the prefix is literal, SCAN's MATCH a glob: its special characters are escaped
        pattern = "".join("\\" + c if c in "*?[]\\^" else c for c in self.prefix) + "*"
        names = self._call(lambda: list(self.client.scan_iter(match=pattern)))
        return [n.decode()[len(self.prefix) :] if isinstance(n, bytes) else n[len(self.prefix) :] for n in names]

    def nbytes(self) -> int:
        return sum(int(self._call(self.client.strlen, self.prefix + k)) for k in self.keys())


class _ignore_missing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, value: Any, tb: Any) -> bool:
        return kind is not None and issubclass(kind, FileNotFoundError)


def write_whole(final: Path, value: bytes, prefix: str = ".tmp-", *, durable: bool = True) -> None:
    """Writes ``final`` whole or not at all, whoever reads and whenever the writer dies: to a
    temporary file in the same folder (named ``prefix...``), flushed to disk (``durable``),
    renamed over ``final``, and the folder synced so that the rename is on disk too."""
    fd, tmp = tempfile.mkstemp(prefix=prefix, dir=final.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(value)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, final)
    except BaseException:
        with _ignore_missing():
            os.unlink(tmp)
        raise
    if durable:
        _sync_dir(final.parent)


def _sync_dir(path: Path) -> None:
    """fsync a folder so that a rename in it is on disk (no-op where folders cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


__all__ = [
    "Backend",
    "DirectoryBackend",
    "MemoryBackend",
    "RedisBackend",
    "StoreError",
    "check_key",
    "pack_entry",
    "unpack_entry",
]
