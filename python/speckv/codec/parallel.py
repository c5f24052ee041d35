"""Coding jobs (one stream each) spread over threads: the core releases the GIL, and each
stream is coded on one thread, so the bytes never depend on how many there are."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from .. import _api


def parallel(fn: Callable[[Any], Any], jobs: list[Any], threads: int | None) -> list[Any]:
    """``[fn(job) for job in jobs]`` on up to ``threads`` threads (speckv releases the GIL), in
    order; each stream is coded on one thread, so the bytes never depend on ``threads``."""
    n = _api.resolve_threads(threads)
    if n == 1 or len(jobs) <= 1:
        return [fn(job) for job in jobs]
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="speckv") as pool:
        return list(pool.map(fn, jobs))
