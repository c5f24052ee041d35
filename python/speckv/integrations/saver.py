"""``BackgroundSaver``: an engine's saves compressed and stored on a thread of their own, off
the engine's step.

The engine hands over copies of the blocks to store (``submit``) and goes on at once; one
thread codes and stores them in order. The backlog between the two is bounded twice: at most
``depth`` saves, and at most ``max_bytes`` of their blocks' copies (a save alone is always
taken): past either, ``submit`` drops the save and counts it, so a slow store or codec costs
later misses, never a stalled step nor unbounded host memory. A codec slower than the engine's
saves for a while (statistics' encode on two cores) keeps up through a backlog of the bytes a
host can spare, where a short queue of saves dropped them. ``drain`` waits for
what is queued (an engine shutting down), ``close`` then stops the thread.

The thread runs at a low priority (``nice``, default 19; Linux keeps a nice value per
thread, and threads it starts inherit it): an engine's step runs its matrix work on every core
in a team of threads that waits for its slowest member, so a saver that takes a core from one
of them stalls them all; at nice 19 it gets the cores the engine leaves idle, and a little
more when the queue stays full.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("speckv.engine")

_STOP = object()


class BackgroundSaver:
    """Runs ``save(*args)`` for each submitted save on one daemon thread, behind a queue of
    at most ``depth`` saves (module docs). ``save`` returns the tokens it stored; an exception
    it raises is counted (``failed``) and logged once, never raised to the submitter."""

    def __init__(
        self,
        save: Callable[..., int],
        *,
        depth: int = 8,
        max_bytes: int | None = None,
        name: str = "speckv-saver",
        nice: int | None = 19,
    ) -> None:
        if depth < 1:
            raise ValueError(f"depth: must be at least 1, got {depth}")
        if max_bytes is not None and max_bytes < 1:
            raise ValueError(f"max_bytes: must be at least 1 (or None), got {max_bytes}")
        self._max_bytes = max_bytes
        # bytes of the saves queued or running
        self._held = 0
        self._save = save
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._lock = threading.Lock()
        self._counters = {"submitted": 0, "dropped": 0, "saved": 0, "tokens_saved": 0, "failed": 0}
        self._busy_s = 0.0
        self._unsaved = 0  # saves queued or running
        self._logged = False
        self._nice = nice
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, *args: Any, nbytes: int = 0) -> bool:
        """Queues one save holding ``nbytes`` of copies; False (counted as ``dropped``) if the
        backlog is full (``depth`` saves, or ``max_bytes`` with this one unless it would be
        alone) or the saver is closed."""
        with self._lock:
            self._counters["submitted"] += 1
            over = self._max_bytes is not None and self._held > 0 and self._held + nbytes > self._max_bytes
            if not over and self._thread.is_alive():
                try:
                    self._queue.put_nowait((args, nbytes))
                    self._held += nbytes
                    self._unsaved += 1
                    return True
                except queue.Full:
                    pass
        with self._lock:
            self._counters["dropped"] += 1
        return False

    def _run(self) -> None:
        if self._nice is not None and hasattr(os, "setpriority"):
            try:  # this thread only (Linux: a thread id names the thread)
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), self._nice)
            except OSError:
                pass
        while True:
            item = self._queue.get()
            start = time.perf_counter()
            nbytes = 0
            try:
                if item is _STOP:
                    return
                args, nbytes = item
                tokens = self._save(*args)
                with self._lock:
                    self._counters["saved"] += 1
                    self._counters["tokens_saved"] += int(tokens)
            except Exception as e:  # the engine never sees a save's error
                with self._lock:
                    self._counters["failed"] += 1
                if not self._logged:
                    self._logged = True
                    log.warning("speckv: a background save failed (logged once): %s", e)
            finally:
                with self._lock:
                    self._busy_s += time.perf_counter() - start
                    self._held -= nbytes
                    self._unsaved -= item is not _STOP
                self._queue.task_done()

    def pending(self) -> int:
        """Saves queued or running (not the stop ``close`` queues)."""
        with self._lock:
            return self._unsaved

    def drain(self, timeout_s: float | None = None) -> bool:
        """Waits until every queued save is done (at most ``timeout_s``); whether they are."""
        done = threading.Event()

        def wait() -> None:
            self._queue.join()
            done.set()

        threading.Thread(target=wait, daemon=True).start()
        return done.wait(timeout_s)

    def close(self, timeout_s: float | None = None) -> bool:
        """Drains (at most ``timeout_s``), then stops the thread; whether everything queued was
        saved. Later submits are dropped."""
        drained = self.drain(timeout_s)
        if self._thread.is_alive():
            try:
                self._queue.put(_STOP, timeout=0 if not drained else None)
            except queue.Full:
                pass
            self._thread.join(timeout_s if drained else 0)
        return drained

    def counters(self) -> dict[str, Any]:
        """``submitted``, ``dropped`` (backlog full), ``saved``, ``tokens_saved``, ``failed``,
        ``busy_s`` (seconds spent saving) and ``backlog_bytes`` (the copies queued or running)."""
        with self._lock:
            return {**self._counters, "busy_s": round(self._busy_s, 4), "backlog_bytes": self._held}


__all__ = ["BackgroundSaver"]
