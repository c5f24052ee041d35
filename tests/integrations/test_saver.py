"""``BackgroundSaver``: saves off the engine's step behind a bounded queue (a full queue drops,
never blocks; a failing save is counted, never raised; shutdown drains)."""

from __future__ import annotations

import threading
import time

import pytest

from speckv.integrations.saver import BackgroundSaver


def test_saves_run_in_order_on_their_own_thread():
    done: list[tuple[int, str]] = []
    caller = threading.get_ident()

    def save(i: int) -> int:
        assert threading.get_ident() != caller
        done.append((i, threading.current_thread().name))
        return 16

    saver = BackgroundSaver(save, depth=100)
    assert all(saver.submit(i) for i in range(50))
    assert saver.drain(10)
    assert [i for i, _ in done] == list(range(50)) and {n for _, n in done} == {"speckv-saver"}
    counters = saver.counters()
    assert counters.pop("busy_s") >= 0
    assert counters == {
        "submitted": 50,
        "dropped": 0,
        "saved": 50,
        "tokens_saved": 800,
        "failed": 0,
        "backlog_bytes": 0,
    }
    assert saver.close(10)


def test_a_full_queue_drops_and_never_blocks():
    gate = threading.Event()
    saver = BackgroundSaver(lambda i: gate.wait(10) and 1, depth=2)
    start = time.perf_counter()
    results = [saver.submit(i) for i in range(10)]
    assert time.perf_counter() - start < 1.0  # submit never waits for the saves
    # one save running, two queued; the seven others dropped
    assert results.count(True) in (2, 3) and results[:2] == [True, True]
    counters = saver.counters()
    assert counters["dropped"] == results.count(False) and counters["submitted"] == 10
    gate.set()
    assert saver.close(10)
    assert saver.counters()["saved"] == results.count(True)
    assert not saver.submit(99) and saver.counters()["dropped"] == results.count(False) + 1  # closed


def test_the_backlog_is_bounded_in_bytes_and_one_save_is_always_taken():
    gate = threading.Event()
    saver = BackgroundSaver(lambda i: gate.wait(10) and 1, depth=100, max_bytes=1000)
    # a save larger than the bound is taken alone; nothing more while it is held
    assert saver.submit(0, nbytes=5000)
    assert not saver.submit(1, nbytes=1)
    assert saver.counters()["backlog_bytes"] == 5000
    gate.set()
    assert saver.drain(10) and saver.counters()["backlog_bytes"] == 0
    gate.clear()
    # then saves up to the bound, the next one past it dropped, never a wait
    results = [saver.submit(i, nbytes=300) for i in range(5)]
    assert results == [True, True, True, False, False]
    assert saver.counters()["backlog_bytes"] == 900 and saver.counters()["dropped"] == 3
    gate.set()
    assert saver.close(10)
    assert saver.counters()["saved"] == 4 and saver.counters()["backlog_bytes"] == 0


def test_a_failing_save_is_counted_and_logged_once(caplog):
    def save(i: int) -> int:
        if i % 2:
            raise OSError("disk full")
        return 1

    saver = BackgroundSaver(save, depth=20)
    with caplog.at_level("WARNING", logger="speckv.engine"):
        for i in range(6):
            saver.submit(i)
        assert saver.drain(10)
    counters = saver.counters()
    assert counters["failed"] == 3 and counters["saved"] == 3
    assert sum("background save failed" in r.message for r in caplog.records) == 1
    assert saver.close(10)


def test_close_reports_saves_it_could_not_finish():
    gate = threading.Event()
    saver = BackgroundSaver(lambda: gate.wait(10) and 1, depth=4)
    saver.submit()
    saver.submit()
    assert not saver.close(0.2)  # still running at the deadline
    assert saver.pending() == 2  # the running save and the queued one; not the stop close queued
    gate.set()
    assert saver.drain(10)
    assert saver.pending() == 0


def test_max_bytes_must_be_positive():
    with pytest.raises(ValueError, match="max_bytes"):
        BackgroundSaver(lambda: 0, max_bytes=0)


def test_depth_must_be_positive():
    with pytest.raises(ValueError, match="depth"):
        BackgroundSaver(lambda: 0, depth=0)


def test_the_saver_thread_runs_at_a_low_priority():
    import os

    if not hasattr(os, "getpriority"):
        pytest.skip("no per-thread priorities here")
    seen: list[int] = []
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    saver = BackgroundSaver(lambda: seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id())) or 0)
    saver.submit()
    assert saver.close(10)
    assert seen == [19]
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine  # the caller's is its own
