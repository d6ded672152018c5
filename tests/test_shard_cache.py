"""`recjax.data.shard_cache.ShardCache`: one worker's share of a source kept in memory gives
that worker exactly the batches a whole-pass cache gives it (positions, shuffle, a mid-epoch
start), and refuses a position outside the share. The reference is `CachedSource`, the cache
a threaded run's workers share; the sources are synthetic, cut into small chunks so that a
share spans several."""

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recjax.data.pipeline import batches, cached
from recjax.data.shard_cache import ShardCache
from recjax.data.synthetic import PRESETS, SyntheticSource


class Small(SyntheticSource):
    CHUNK = 700  # several chunks, none a multiple of the batch or the workers


def _source(rows: int = 3000) -> Small:
    return Small(dataclasses.replace(PRESETS["smoke"], n_train=rows, n_eval=64))


def _stream(source, worker, workers, buffer, start, seed=3, epoch=1, batch=64):
    return list(batches(source, batch, seed=seed, epoch=epoch, shuffle_buffer=buffer,
                        drop_remainder=True, worker=worker, num_workers=workers, start=start))


def _same(a, b):
    assert len(a) == len(b)
    for (x, nx), (y, ny) in zip(a, b):
        assert nx == ny
        for u, v in zip(x, y):
            if u is None:
                assert v is None
            else:
                np.testing.assert_array_equal(u, v)


def _whole():
    c = cached(_source())
    for _ in c.chunks():
        pass
    return c


@settings(max_examples=12, deadline=None)
@given(workers=st.integers(1, 4), data=st.data(), buffer=st.sampled_from([0, 1, 257, 5000]))
def test_a_share_gives_the_worker_the_batches_of_the_whole_cache(workers, data, buffer):
    worker = data.draw(st.integers(0, workers - 1))
    whole = _whole()
    n = len(_stream(whole, worker, workers, buffer, 0))
    start = data.draw(st.integers(0, max(n - 1, 0)))
    share = ShardCache(_source(), worker, workers)
    share.fill()
    assert share.random_access and share.chunk_sizes() == whole.chunk_sizes()
    _same(_stream(share, worker, workers, buffer, start),
          _stream(whole, worker, workers, buffer, start))
    # it holds its share only (plus 8 bytes of row id per example of the pass)
    assert sum(c.size for c in share._kept) == int(np.sum(np.arange(3000) % workers == worker))


@pytest.mark.parametrize("workers,worker,start", [(1, 0, 1), (1, 0, 17), (2, 1, 3), (3, 2, 5)])
def test_a_mid_epoch_start_through_the_shuffle(workers, worker, start):
    """The cases where the chunks a pass is cut into matter (one worker reads the pass from
    the resumed cursor, chunk by chunk; found by the property above)."""
    share = ShardCache(_source(), worker, workers)
    share.fill()
    _same(_stream(share, worker, workers, 257, start), _stream(_whole(), worker, workers, 257,
                                                                start))


@settings(max_examples=10, deadline=None)
@given(workers=st.integers(2, 5), data=st.data(), buffer=st.sampled_from([0, 257, 5000]))
def test_a_group_share_gives_each_member_the_batches_of_the_whole_cache(workers, data, buffer):
    """The shares of a group of workers in one process (a ShadowSync trainer's m workers in
    its Ray actor), kept once: each member's stream as from the whole pass, and no other
    worker's examples held."""
    group = tuple(data.draw(st.sets(st.integers(0, workers - 1), min_size=2)))
    share = ShardCache(_source(), group, workers)
    share.fill()
    whole = _whole()
    for worker in group:
        _same(_stream(share, worker, workers, buffer, 0),
              _stream(whole, worker, workers, buffer, 0))
    assert share.kept_rows == int(np.isin(np.arange(3000) % workers, group).sum())
    others = [w for w in range(workers) if w not in group]
    if others:
        with pytest.raises(IndexError, match="not in the share of workers "):
            _stream(share, others[0], workers, buffer, 0)
    else:  # every worker's: the whole pass, read as one
        _same(_stream(share, 0, 1, buffer, 0), _stream(whole, 0, 1, buffer, 0))


def test_a_position_outside_the_share_is_an_error_not_a_read():
    share = ShardCache(_source(), 1, 3)
    share.fill()
    assert share.take_rows(np.array([1, 4, 700 + 3])).row.tolist() == [1, 4, 703]
    with pytest.raises(IndexError, match=r"positions \[0\] are not in the share of worker 1 of 3"):
        share.take_rows(np.array([1, 0]))
    with pytest.raises(ValueError, match="not a whole pass"):
        next(share.chunks())


def test_a_pass_too_big_to_keep_is_read_from_the_source():
    share = ShardCache(_source(), 0, 2, max_rows=1000)
    share.fill()
    assert not share.random_access
    _same(_stream(share, 0, 2, 257, 0), _stream(_whole(), 0, 2, 257, 0))
