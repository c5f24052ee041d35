"""``LayerLoader``: layers restored in order on a thread of its own, ``wait`` returning once its
layer is done (not before), an exception ending the job without a hang, jobs one at a time."""

from __future__ import annotations

import threading
import time

import pytest

from speckv.integrations.layer_loader import LayerLoader


def test_layers_run_in_order_and_wait_waits_for_its_layer():
    loader = LayerLoader()
    done: list[int] = []
    gate = threading.Event()

    def work(layer: int) -> None:
        if layer == 2:
            gate.wait(5)
        done.append(layer)

    loader.start(5, work)
    loader.wait(1)
    assert done[:2] == [0, 1]
    assert 2 not in done  # held at the gate: layer 2 is not done, and wait(1) did not wait for it
    threading.Timer(0.1, gate.set).start()
    start = time.perf_counter()
    loader.wait(2)
    assert 2 in done and time.perf_counter() - start >= 0.05
    assert loader.join() is None
    assert done == [0, 1, 2, 3, 4]
    assert loader.waited_s > 0 and loader.busy_s > 0
    loader.close()


def test_an_exception_ends_the_job_and_releases_every_layer():
    loader = LayerLoader()
    done: list[int] = []

    def work(layer: int) -> None:
        if layer == 1:
            raise OSError("disk gone")
        done.append(layer)

    loader.start(4, work)
    loader.wait(3)  # released, not hung
    error = loader.join()
    assert isinstance(error, OSError) and done == [0]
    # the next job runs as usual
    loader.start(2, done.append)
    assert loader.join() is None and done == [0, 0, 1]
    loader.close()


def test_one_job_at_a_time_and_waits_without_a_job_return():
    loader = LayerLoader()
    loader.wait(0)  # no job: at once
    assert loader.join() is None
    loader.start(1, lambda layer: None)
    with pytest.raises(RuntimeError):
        loader.start(1, lambda layer: None)
    loader.wait(7)  # a layer the job does not have
    assert loader.join() is None
    loader.close()
