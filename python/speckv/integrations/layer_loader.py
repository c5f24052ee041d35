"""``LayerLoader``: a step's restore done layer by layer on a thread of its own, so that an
engine's forward pass starts on layer 0 while later layers are still being decoded.

The engine hands over one job per step (``start``: a function that restores one layer, and
the number of layers); the loader runs it for layer 0, 1, ... in order, and the engine waits
(``wait``) only when its forward pass reaches a layer not restored yet. ``join`` waits for the
whole job (the engine calls it before it reports which blocks failed). The loader never
raises into the engine: an exception from the job ends it, every layer is released, and
``join`` returns the exception for the caller to turn into recomputed blocks.

The job's work must stay out of torch's thread pool (numpy and the Rust core, which release
the GIL): the pool is the engine's, and a second thread entering it contends for its cores.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable


class _Job:
    def __init__(self, layers: int, work: Callable[[int], None]) -> None:
        self.layers = layers
        self.work = work
        self.ready = [threading.Event() for _ in range(layers)]
        self.done = threading.Event()
        self.error: BaseException | None = None


class LayerLoader:
    """One thread that restores a job's layers in order (see the module docs). Counters:
    ``busy_s`` (the thread working), ``waited_s`` (the engine waiting in ``wait``/``join``)."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._job: _Job | None = None
        self.busy_s = 0.0
        self.waited_s = 0.0
        self._thread = threading.Thread(target=self._run, name="speckv-layer-loader", daemon=True)
        self._thread.start()

    def start(self, layers: int, work: Callable[[int], None]) -> None:
        """Starts restoring ``layers`` layers with ``work(layer)``; the previous job must be
        joined first."""
        if self._job is not None:
            raise RuntimeError("LayerLoader.start: the previous job was not joined")
        self._job = _Job(layers, work)
        self._jobs.put(self._job)

    def wait(self, layer: int) -> None:
        """Returns once ``layer`` of the current job is restored (or the job ended); at once
        without a job or for a layer it does not have."""
        job = self._job
        if job is None or not 0 <= layer < job.layers or job.ready[layer].is_set():
            return
        start = time.perf_counter()
        job.ready[layer].wait()
        self.waited_s += time.perf_counter() - start

    def join(self) -> BaseException | None:
        """Waits for the current job to end; returns the exception that ended it, if any."""
        job, self._job = self._job, None
        if job is None:
            return None
        if not job.done.is_set():
            start = time.perf_counter()
            job.done.wait()
            self.waited_s += time.perf_counter() - start
        return job.error

    def close(self) -> None:
        """Ends the thread after the current job."""
        self.join()
        self._jobs.put(None)
        self._thread.join(timeout=60)

    def _run(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            start = time.perf_counter()
            try:
                for layer in range(job.layers):
                    job.work(layer)
                    job.ready[layer].set()
            except BaseException as e:  # the engine's thread turns it into recomputed blocks
                job.error = e
            finally:
                for event in job.ready:
                    event.set()
                self.busy_s += time.perf_counter() - start
                job.done.set()


__all__ = ["LayerLoader"]
