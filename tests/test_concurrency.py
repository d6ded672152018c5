"""Prefetcher: order, errors, prompt shutdown, no leaked threads."""

import dataclasses
import gc
import threading
import time
import traceback

import numpy as np
import pytest

from recjax.concurrency import Prefetcher


def prefetch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("recjax-prefetch")]


@pytest.fixture(autouse=True)
def no_leaked_threads():
    yield
    deadline = time.monotonic() + 2.0
    while prefetch_threads() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert prefetch_threads() == []


@pytest.mark.parametrize("depth", [0, 1, 3])
def test_order_preserved(depth):
    with Prefetcher(iter(range(1000)), depth=depth) as it:
        assert list(it) == list(range(1000))


def test_transform_runs_in_producer_thread():
    names = []

    def transform(x):
        names.append(threading.current_thread().name)
        return x * 2

    assert list(Prefetcher(range(5), depth=2, transform=transform)) == [0, 2, 4, 6, 8]
    assert set(names) == {"recjax-prefetch"}
    assert list(Prefetcher(range(3), depth=0, transform=transform)) == [0, 2, 4]


def failing_producer():
    yield 1
    yield 2
    raise KeyError("boom in the producer")


def test_exception_propagates_with_traceback():
    it = Prefetcher(failing_producer(), depth=4)
    assert next(it) == 1 and next(it) == 2
    with pytest.raises(KeyError, match="boom in the producer") as e:
        next(it)
    frames = [f.name for f in traceback.extract_tb(e.value.__traceback__)]
    assert "failing_producer" in frames  # the producer's frames, not just the consumer's
    assert not it.alive
    with pytest.raises(StopIteration):
        next(it)


def test_exception_in_transform_propagates():
    with pytest.raises(ZeroDivisionError), Prefetcher(range(3), transform=lambda x: 1 / x) as it:
        list(it)


def test_early_close_stops_blocked_producer_and_runs_finally():
    finished = threading.Event()

    def endless():
        try:
            i = 0
            while True:
                yield i
                i += 1
        finally:
            finished.set()  # e.g. the reader closes its file

    it = Prefetcher(endless(), depth=2)
    assert [next(it) for _ in range(5)] == [0, 1, 2, 3, 4]
    time.sleep(0.05)  # let the producer block on the full queue
    t0 = time.monotonic()
    it.close()
    assert time.monotonic() - t0 < 1.0
    assert not it.alive and finished.is_set()
    with pytest.raises(StopIteration):
        next(it)
    it.close()  # idempotent


def test_break_out_of_with_block():
    with Prefetcher(iter(range(10**9)), depth=3) as it:
        for x in it:
            if x == 10:
                break
    assert not it.alive


def test_abandoned_prefetcher_stops():
    it = Prefetcher(iter(range(10**9)), depth=2)
    next(it)
    thread = it._thread
    del it
    gc.collect()
    thread.join(2.0)
    assert not thread.is_alive()


def test_many_open_close_cycles_leak_no_threads():
    before = threading.active_count()
    for i in range(100):
        it = Prefetcher(iter(range(100)), depth=2)
        if i % 2:
            next(it)
        it.close()
    assert threading.active_count() == before


def test_bad_depth():
    with pytest.raises(ValueError, match="depth"):
        Prefetcher([], depth=-1)


def test_ordered_map_keeps_order_raises_in_place_and_stops_early():
    import random

    from recjax.concurrency import ordered_map

    def slow_square(x):
        time.sleep(random.random() * 0.01)
        return x * x

    assert list(ordered_map(slow_square, range(50), workers=4)) == [x * x for x in range(50)]
    assert list(ordered_map(slow_square, range(5), workers=1)) == [0, 1, 4, 9, 16]

    def boom(x):
        if x == 7:
            raise KeyError("seven")
        return x

    got = []
    with pytest.raises(KeyError, match="seven"):
        for y in ordered_map(boom, range(20), workers=3):
            got.append(y)
    assert got == list(range(7))
    started = []

    def track(x):
        started.append(x)
        return x

    it = ordered_map(track, range(1000), workers=2, ahead=4)
    assert next(it) == 0
    it.close()  # cancels what has not started
    assert len(started) < 20


def test_synthetic_stream_is_the_same_for_any_number_of_workers():
    from recjax.data.synthetic import PRESETS, SyntheticSource

    cfg = dataclasses.replace(PRESETS["smoke"], n_train=3 * 65536 + 100)
    one = list(SyntheticSource(cfg, workers=1).chunks())
    four = list(SyntheticSource(cfg, workers=4).chunks())
    assert len(one) == len(four) == 4
    for a, b in zip(one, four):
        np.testing.assert_array_equal(a.ids, b.ids)
        np.testing.assert_array_equal(a.label, b.label)
        np.testing.assert_array_equal(a.dense, b.dense)


@pytest.mark.parametrize("poll_s,most", [(0.05, None), (0.5, 5)])
def test_a_thread_group_polls_at_the_interval_it_is_given(poll_s, most):
    """`ThreadGroup.wait` calls `on_poll` once a `poll_s` while a thread runs (the host-async
    engine's main thread; with the roles in Ray's actors it looks less often), and returns as
    the thread ends, not at the next poll."""
    from recjax.concurrency import ThreadGroup

    group, polls = ThreadGroup("recjax-test-poll"), []
    group.spawn(time.sleep, 2.0, name="sleeper")
    t0 = time.monotonic()
    assert group.wait(on_poll=lambda: polls.append(time.monotonic()), poll_s=poll_s)
    took = time.monotonic() - t0
    group.close()
    if most is None:  # the default interval: many polls in 2 s (at least a quarter of them)
        assert len(polls) >= 10, len(polls)
    else:
        assert 1 <= len(polls) <= most and took < 2.0 + poll_s, (len(polls), took)
