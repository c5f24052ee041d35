"""``DirectoryBackend``: a file per entry, written whole, under a budget that processes share;
``write_whole``, the atomic write it (and ``speckv store``) uses."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .entry import StoreError, check_key


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
