"""Where compressed cache blocks live: one small interface, three backends, and tiers of them
(``TieredBackend``: RAM over a disk folder or Redis, each with its own budget).

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

from .backend import Backend, touch_chain
from .directory import DirectoryBackend, write_whole
from .entry import ENTRY_HEADER, ENTRY_MAGIC, ENTRY_VERSION, StoreError, check_key, pack_entry, unpack_entry
from .memory import MemoryBackend
from .redis_backend import RedisBackend
from .tiered import TieredBackend

__all__ = [
    "ENTRY_HEADER",
    "ENTRY_MAGIC",
    "ENTRY_VERSION",
    "Backend",
    "DirectoryBackend",
    "MemoryBackend",
    "RedisBackend",
    "StoreError",
    "TieredBackend",
    "check_key",
    "pack_entry",
    "touch_chain",
    "unpack_entry",
    "write_whole",
]
