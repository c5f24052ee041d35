"""Sizes in bytes as users write them in configuration: ``8589934592``, ``8e9``, ``"8GB"``,
``"512MiB"``, ``"1.5 GiB"``. Decimal units are powers of 1000 (kB, MB, GB, TB), binary ones
powers of 1024 (KiB, MiB, GiB, TiB), as the SI and IEC write them."""

from __future__ import annotations

import re
from typing import Any

UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
_SIZE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?(?:e[0-9]+)?)\s*([a-z]*)\s*")


def parse_size(value: Any, what: str = "size") -> int:
    """``value`` as a positive whole number of bytes; ``ValueError`` naming ``what`` and the
    forms accepted otherwise.

    >>> parse_size("8GB"), parse_size("512MiB"), parse_size(8e9), parse_size(4096)
    (8000000000, 536870912, 8000000000, 4096)
    """
    if isinstance(value, bool):
        raise ValueError(f"{what}: expected a size in bytes, got {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"{what}: {value!r} is not a whole number of bytes")
        n = int(value)
    elif isinstance(value, str):
        m = _SIZE.fullmatch(value.lower())
        if m is None or m.group(2) not in UNITS:
            raise ValueError(
                f"{what}: {value!r} is not a size: write bytes (8589934592, 8e9) or a number "
                f"and a unit ({', '.join(u for u in ('kB', 'MB', 'GB', 'TB', 'KiB', 'MiB', 'GiB', 'TiB'))})"
            )
        exact = float(m.group(1)) * UNITS[m.group(2)]
        if not exact.is_integer():
            raise ValueError(f"{what}: {value!r} is not a whole number of bytes")
        n = int(exact)
    else:
        raise ValueError(f"{what}: expected a size in bytes, got {type(value).__name__} {value!r}")
    if n <= 0:
        raise ValueError(f"{what}: must be positive, got {value!r}")
    return n


__all__ = ["UNITS", "parse_size"]
