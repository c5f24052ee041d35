"""A store entry: the payload framed with its length and a checksum keyed by its key (the
layout is in ``speckv.store``'s docs); keys checked; ``StoreError``, what every backend raises."""

from __future__ import annotations

import hashlib
import re
import struct

from .._speckv import ChecksumError, CorruptStreamError, SpeckvError, entry_checksum

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
