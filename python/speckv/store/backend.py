"""``Backend``, the storage interface every store speaks, and ``touch_chain``."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


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
